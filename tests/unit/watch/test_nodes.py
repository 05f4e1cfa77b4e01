"""One torchrun job over many nodes (watch/torchrun.py's group helpers, the launch step over
the run's targets, watch/nodes.py's stop-all and first failure), on fakes. The real thing,
two sandbox hosts' containers in one gloo job, is tests/integration/test_multinode_sandbox.py."""

from __future__ import annotations

import threading
from collections import deque
from types import SimpleNamespace

import pytest

from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.steps import launch as launch_step
from orchestrator.targets.preflight import PreflightRow
from orchestrator.watch import torchrun
from orchestrator.watch.classify import EndState, Verdict
from orchestrator.watch.distributed import ChildFailedReader
from orchestrator.watch.nodes import NodeRun, NodesWatch, job_verdict, torchrun_time
from tests.support.step_fakes import RUN_ID, harness, planned, write_project

TWO_NODES = """\
    name: ddp
    targets: [dev, other]
    steps:
      - launch:
          command: [python, train.py, --steps, 5]
          torchrun: {nnodes: 2, nproc_per_node: 1%s}
          env: {GLOO_SOCKET_IFNAME: eth0}
"""

ADDRESSES = {"dev": "10.0.3.11", "other": "10.0.3.12"}


@pytest.fixture
def nodes_reachable(monkeypatch):
    """The seams a launch over many nodes stands on: every node has an address and passes."""
    checked = []

    def ready(nodes, endpoint, **options):
        checked.append(([n.name for n in nodes], endpoint, options))
        return [PreflightRow(n.name, "endpoint", "ok", "reached") for n in nodes]
    monkeypatch.setattr(launch_step, "node_address", lambda run, target, interface=None: ADDRESSES[target.name])
    monkeypatch.setattr(launch_step, "preflight", ready)
    return checked


# ------------------------------------------------------------------------- the shape
@pytest.mark.parametrize("extra, key, words", [
    (", node_rank: 1", "node_rank", "node_rank is set by orch"),
    (", master_addr: 10.0.0.1", "master_addr", "master_addr is set by orch"),
    (", local_addr: 10.0.0.1", "local_addr", "local_addr is set by orch"),
    (", rdzv_backend: static", "rdzv_backend", "uses the c10d rendezvous"),
])
def test_what_orch_sets_for_a_group_is_an_error_at_its_line(tmp_path, extra, key, words):
    with pytest.raises(ConfigError) as caught:
        harness(tmp_path, TWO_NODES % extra)
    assert words in caught.value.message
    assert "playbook.yaml:6:" in str(caught.value)      # the torchrun line, where the key is


def test_an_elastic_range_must_read_min_max(tmp_path):
    with pytest.raises(ConfigError) as caught:
        harness(tmp_path, (TWO_NODES % "").replace("nnodes: 2", 'nnodes: "3:1"'))
    assert "need 1 <= MIN <= MAX" in caught.value.message


def test_nnodes_that_does_not_fit_the_targets_fails_before_anything_runs(tmp_path, nodes_reachable):
    h = harness(tmp_path, (TWO_NODES % "").replace("nnodes: 2", "nnodes: 3"))
    with pytest.raises(ConfigError) as caught:
        h.record()
    assert "nnodes 3 does not fit the run's 2 targets (dev, other)" in caught.value.message
    assert "playbook.yaml:6:" in str(caught.value)
    assert h.host.calls == [] and nodes_reachable == []


def test_validate_says_so_too(tmp_path):
    from click.testing import CliRunner
    from orchestrator.cli.app import main
    book_path, inventory_path = write_project(tmp_path, (TWO_NODES % "").replace("nnodes: 2", "nnodes: 3"))
    result = CliRunner().invoke(main, ["-i", inventory_path, "validate", book_path])
    assert result.exit_code == 2
    assert "playbook.yaml:6:" in result.output and "does not fit the run's 2 targets" in result.output
    fits = write_project(tmp_path, TWO_NODES % "")[0]
    assert CliRunner().invoke(main, ["-i", inventory_path, "validate", fits]).exit_code == 0


def test_an_elastic_range_fits_any_count_inside_it(tmp_path):
    torchrun.check_fits({"nnodes": "1:4"}, ["a", "b", "c"])
    with pytest.raises(torchrun.TorchrunError, match="give 2 to 4 targets"):
        torchrun.check_fits({"nnodes": "2:4"}, ["a"])


def test_one_node_is_a_launch_on_each_target_as_before():
    assert torchrun.node_range({"nproc_per_node": 2}) is None
    assert torchrun.node_range({"nproc_per_node": 2, "nnodes": 1}) is None
    assert torchrun.node_range({"nproc_per_node": 2, "nnodes": "{{ n }}"}) is None
    assert torchrun.node_range({"nproc_per_node": 2, "nnodes": "1:2"}) == (1, 2)


# ------------------------------------------------------------------ argv and env per node
def _starts(h) -> dict[int, dict]:
    """node (its place in the targets) -> the launcher's start arguments."""
    starts = [c.payload_args for c in h.host.payload_calls("launcher")
              if c.payload_args.get("action") == "start"]
    return {int(a["env"]["SKYPILOT_NODE_RANK"]): a for a in starts}


def test_every_node_gets_its_rank_the_same_rendezvous_and_skypilots_names(tmp_path, nodes_reachable):
    h = harness(tmp_path, TWO_NODES % "")
    h.host.on_payload("free_port", {"port": 29411})
    h.host.on_payload("launcher", {"pid": 4242, "run_dir": "/rd", "log": "/rd/output.log"})
    record = h.record()
    # pre-flight, once, before any start: the endpoint, the interface the step's env names
    assert nodes_reachable == [(["dev", "other"], ("10.0.3.11", 29411),
                                {"gpus_per_node": 2, "socket_ifnames": {"GLOO_SOCKET_IFNAME": "eth0"}})]
    assert ("dev", "pre-flight: 2 node(s) ready") in [(t, line) for _k, t, _s, line, _st in h.reporter.of("step_output")]
    starts = _starts(h)
    assert sorted(starts) == [0, 1]
    for rank, args in starts.items():
        argv = args["argv"]
        assert argv[:3] == ["python", "-m", "torch.distributed.run"]
        options = dict(zip(argv[3:-3:2], argv[4:-3:2]))
        assert options["--nnodes"] == "2" and options["--nproc-per-node"] == "1"
        assert options["--rdzv-backend"] == "c10d"
        assert "--node-rank" not in options       # c10d ranks the nodes; torchrun warns it ignores one
        assert options["--rdzv-endpoint"] == "10.0.3.11:29411"
        assert options["--rdzv-id"] == RUN_ID and options["--max-restarts"] == "0"
        # the first node hosts the c10d store at its own address (not torchrun's hostname guess)
        assert options["--rdzv-conf"] == f"is_host={1 if rank == 0 else 0}"
        # the workers meet at the nodes' addresses, not at host names
        assert options["--local-addr"] == ADDRESSES[("dev", "other")[rank]]
        env = args["env"]
        assert env["SKYPILOT_NODE_IPS"] == "10.0.3.11\n10.0.3.12"
        assert env["SKYPILOT_NODE_RANK"] == str(rank) and env["SKYPILOT_NUM_NODES"] == "2"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    # dev has two GPUs in the inventory; other none: its ranks per node, then
    assert starts[0]["env"]["SKYPILOT_NUM_GPUS_PER_NODE"] == "2"
    assert starts[1]["env"]["SKYPILOT_NUM_GPUS_PER_NODE"] == "1"
    launches = record.launch["targets"]
    assert {name: launches[name]["node_rank"] for name in ("dev", "other")} == {"dev": 0, "other": 1}
    assert launches["other"]["nodes"] == ["dev", "other"]
    assert [(s.target, s.status) for s in record.steps] == [("dev", "changed"), ("other", "changed")]


def test_the_users_rendezvous_endpoint_is_kept(tmp_path, nodes_reachable):
    h = harness(tmp_path, TWO_NODES % ", rdzv_endpoint: 'head:29400'")
    h.host.on_payload("launcher", {"pid": 1, "run_dir": "/rd"})
    h.record()
    assert h.host.payload_calls("free_port") == []
    assert all("head:29400" in a["argv"] for a in _starts(h).values())
    assert not any("--rdzv-conf" in a["argv"] for a in _starts(h).values())   # torchrun decides


def test_a_failed_preflight_launches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(launch_step, "node_address", lambda run, target, interface=None: ADDRESSES[target.name])

    def refuse(nodes, endpoint, **options):
        return [PreflightRow("dev", "endpoint", "ok", "reached"),
                PreflightRow("other", "endpoint", "fail", "cannot reach 10.0.3.11:29411",
                             fix="open the port")]
    monkeypatch.setattr(launch_step, "preflight", refuse)
    h = harness(tmp_path, TWO_NODES % "")
    h.host.on_payload("free_port", {"port": 29411})
    h.host.on_payload("launcher", {"pid": 1, "run_dir": "/rd"})
    record = h.record()
    assert _starts(h) == {}
    assert record.verdict == "failed"
    assert ("pre-flight failed, nothing was launched: other: endpoint: cannot reach 10.0.3.11:29411 "
            "(fix: open the port)") in record.steps[0].message
    assert [s.target for s in record.steps] == ["dev", "other"]


def test_a_node_that_fails_to_start_stops_the_one_that_started(tmp_path, nodes_reachable):
    h = harness(tmp_path, TWO_NODES % "")
    h.host.on_payload("free_port", {"port": 29411})
    h.host.on(lambda argv, stdin: bool(stdin) and b'"--local-addr", "10.0.3.12"' in stdin,
              launch_step_error("no python3 in the container"))
    h.host.on_payload("launcher", {"pid": 7, "run_dir": "/rd"})
    record = h.record()
    stops = [c.payload_args for c in h.host.payload_calls("launcher")
             if c.payload_args.get("action") == "stop"]
    assert len(stops) == 1 and stops[0]["reason"] == "another node failed to start"
    assert "other: " in record.steps[0].message and "the other nodes were stopped" in record.steps[0].message


def launch_step_error(message: str):
    from tests.support.step_fakes import Reply
    return Reply(stdout=('{"event": "error", "message": "%s"}\n' % message).encode())


def test_a_dry_run_names_every_node_and_asks_none(tmp_path):
    book = (TWO_NODES % "") + "      - monitor: {}\n"
    assert planned(tmp_path, book, index=1)[0].startswith(
        "on every node (dev, other), as one job (the first node that fails or hangs stops the others): ")
    plan = planned(tmp_path, TWO_NODES % "")
    assert plan[0].startswith("pre-flight on 2 nodes (dev, other)")
    assert plan[1] == "node 0: dev" and "node 1: other" in plan
    assert any("--rdzv-backend c10d" in line for line in plan)
    assert not any("--node-rank" in line for line in plan)


# ------------------------------------------------------------ stop-all and first failure
class FakeMonitor:
    """A node's monitor: ends by itself (ends_with) or waits until stopped."""

    def __init__(self, ends_with=None, root_time="", root_rank=None, tail=()):
        self.ends_with = ends_with
        self.stopped = threading.Event()
        self.stop_reason = None
        self.settings = None
        reader = ChildFailedReader()
        if root_rank is not None:
            for line in ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                         "Root Cause (first observed failure):", "[0]:", f"  time      : {root_time}",
                         f"  rank      : {root_rank} (local_rank: 0)", "  exitcode  : -9 (pid: 5)"):
                reader.feed(line)
        self.classifier = SimpleNamespace(child_failed=reader, tail=deque(tail),
                                          failed_end=lambda end: end.exit_code != 0 or bool(end.stopped_for))

    def run(self):
        if self.ends_with is None:
            assert self.stopped.wait(5), "the node was never stopped"
            return EndState(state="exited", exit_code=1, stopped_for=self.stop_reason), {}
        return self.ends_with, {}

    def stop(self, reason, why):
        self.stop_reason = reason
        self.stopped.set()


def _node(rank, monitor):
    return NodeRun(rank, SimpleNamespace(name=f"n{rank}"), "/rd", monitor)


def test_one_failed_node_stops_every_other_node_and_is_named_first():
    failing = FakeMonitor(EndState(state="exited", exit_code=1), root_time="2026-12-02_03:40:07",
                          root_rank=1)
    nodes = [_node(0, FakeMonitor()), _node(1, failing), _node(2, FakeMonitor())]
    watch = NodesWatch(nodes)
    watch.run()
    assert [n.monitor.stop_reason for n in nodes] == ["node-failed", None, "node-failed"]
    assert [n.stopped_by_orch for n in nodes] == [True, False, True]
    first = watch.first_failure()
    assert first is nodes[1]
    judged = {n.name: (Verdict("killed" if n is first else "nonzero-exit", "killed: torchrun: rank 1 "
                               "was killed by SIGKILL (signal 9)", [], {}), {}) for n in nodes}
    verdict, data = job_verdict(nodes, judged, first, watch.stopped_for)
    assert verdict.verdict == "killed"
    assert verdict.message.startswith("killed: node n1 (node rank 1) failed first: torchrun: rank 1 ")
    assert "orch stopped the other nodes (n0, n2: SIGTERM" in verdict.message
    assert data["first_failure"] == {"node": "n1", "node_rank": 1, "rank": 1, "local_rank": 0,
                                     "verdict": "killed"}


def test_nodes_that_end_well_stop_nothing():
    nodes = [_node(r, FakeMonitor(EndState(state="exited", exit_code=0))) for r in range(2)]
    watch = NodesWatch(nodes)
    watch.run()
    assert watch.first_failure() is None and not any(n.stopped_by_orch for n in nodes)


def test_in_the_same_second_the_rank_that_lost_its_peer_is_not_first():
    cause = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:07", root_rank=1)
    consequence = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:07", root_rank=0,
                              tail=["RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection "
                                    "closed by peer [10.0.3.12]:41235"])
    nodes = [_node(0, consequence), _node(1, cause)]
    watch = NodesWatch(nodes)
    watch.run()
    assert watch.first_failure() is nodes[1]


def test_a_peer_lost_a_second_before_the_peers_own_failure_is_still_the_consequence():
    """Seen in the sandbox: sb1's rank hit gloo's "Connection closed by peer" at :07, sb2's
    torchrun noticed its SIGKILLed worker at its next poll, :08."""
    consequence = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:07", root_rank=0,
                              tail=["RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection "
                                    "closed by peer [10.88.2.200]:20616"])
    cause = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:08", root_rank=1)
    nodes = [_node(0, consequence), _node(1, cause)]
    watch = NodesWatch(nodes)
    watch.run()
    assert watch.first_failure() is nodes[1]
    # a node's own failure long after the lost peer is another story: the peer loss is first
    late = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:41:08", root_rank=1)
    nodes = [_node(0, FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:07",
                                  root_rank=0, tail=["Connection reset by peer"])), _node(1, late)]
    for node in nodes:
        node.end, node.ended_at = node.monitor.ends_with, 1.0
    assert NodesWatch(nodes).first_failure() is nodes[0]


def test_an_earlier_torchrun_failure_is_first_whoever_was_seen_first():
    later = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:09", root_rank=0)
    earlier = FakeMonitor(EndState(state="exited", exit_code=1), "2026-12-02_03:40:07", root_rank=1)
    nodes = [_node(0, later), _node(1, earlier)]
    for node, seen in zip(nodes, (1.0, 2.0)):
        node.end, node.ended_at = node.monitor.ends_with, seen
    assert NodesWatch(nodes).first_failure() is nodes[1]
    assert torchrun_time("not a time") is None


def test_the_node_rank_is_the_one_c10d_gives_its_address():
    """torch 2.13's c10d rendezvous sorts its participants by (local address, pid, id): as
    strings, so 10.0.3.10 comes before 10.0.3.9 whatever the targets' order."""
    addresses = ["10.0.3.9", "10.0.3.10", "10.0.3.11"]
    assert [torchrun.c10d_node_rank(addresses, i) for i in range(3)] == [2, 0, 1]
    assert "node_rank" not in torchrun.node_spec({"nproc_per_node": 2, "nnodes": 2}, "h:1", "run", True, "10.0.3.9")
