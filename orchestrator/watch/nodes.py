"""One torchrun job over many nodes, watched as one run.

Each node has its Monitor (monitor.py: its log and every rank's followed by byte offset, its
live progress on the console under the node's name, its metric points and GPU samples in the
run's one record), each in its own thread. What binds them is here: when one node fails or
hangs, every other node is stopped (SIGTERM to its process group, SIGKILL after the grace,
the launcher's stop), so no rank is left waiting in a collective with its GPUs held; and the
verdict is the node that failed first, with its rank.

"First" is read from torchrun itself where it can be: each node's closing ChildFailedError
summary names its first failed rank and when (`time : 2026-12-02_03:40:07`, the node's
clock). A rank that failed because a peer went away (gloo's `Connection closed by peer`,
NCCL's remote errors) is the consequence, not the cause, of the same second's failure on the
other node; a node orch stopped is never first while a node failed on its own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Optional

from orchestrator.ground.verdicts import OK, worst
from orchestrator.watch.classify import PEER_FAILED, EndState, Verdict
from orchestrator.watch.distributed import PEER_LOST
from orchestrator.watch.monitor import (Monitor, MonitorReporter, MonitorSettings, judge,
                                        make_monitor)
from orchestrator.remote.container import Target
from orchestrator.runs.model import RunState

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.runs.recorder import RunRecorder

TORCHRUN_TIME = "%Y-%m-%d_%H:%M:%S"


@dataclass
class NodeRun:
    """One node of the job, as it is followed."""

    rank: int                           # its node rank (its place in the run's targets)
    target: Target
    run_dir: str
    monitor: Monitor
    end: Optional[EndState] = None
    ended_at: Optional[float] = None    # when the controller saw it end (monotonic)
    stopped_by_orch: bool = False       # another node failed first and orch stopped this one
    error: Optional[Exception] = None   # following it failed (out of reach)

    @property
    def name(self) -> str:
        return self.target.name

    def failed(self) -> bool:
        return (self.end is not None and self.end.state != RunState.RUNNING
                and self.monitor.classifier.failed_end(self.end))


class NodesWatch:
    """Follows every node to its end; the first node that fails stops all the others."""

    def __init__(self, nodes: list[NodeRun], clock: Callable[[], float] = time.monotonic):
        self.nodes = nodes
        self.clock = clock
        self.stopped_for: Optional[NodeRun] = None    # the node whose failure stopped the rest
        self._lock = threading.Lock()

    def run(self) -> None:
        threads = [threading.Thread(target=self._follow, args=(node,), daemon=True,
                                    name=f"orch-node-{node.rank}") for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _follow(self, node: NodeRun) -> None:
        try:
            node.end, _final = node.monitor.run()
        except Exception as error:  # noqa: BLE001 - judged with the others (out of reach: the run goes on)
            node.error = error
        node.ended_at = self.clock()
        if node.failed():
            self.stop_others(node)

    def stop_others(self, failed: NodeRun) -> None:
        """Every node still running is stopped, once (the first failure decides)."""
        with self._lock:
            if self.stopped_for is not None:
                return
            self.stopped_for = failed
        for other in self.nodes:
            if other is not failed and other.end is None and other.error is None:
                other.stopped_by_orch = True
                other.monitor.stop(PEER_FAILED, f"node {failed.name} (node rank {failed.rank}) "
                                                f"failed; stopping this node too")

    def first_failure(self) -> Optional[NodeRun]:
        failed = sorted((node for node in self.nodes if node.failed()), key=_failure_order)
        if not failed or not lost_peer(failed[0].monitor):
            return failed[0] if failed else None
        # The rank that lost its peer can be stamped before the peer's own failure: torchrun
        # notices a dead worker only at its next poll, and the nodes' clocks differ. A node
        # whose torchrun names a failure of its own within PEER_LAG_S after it is the cause
        # (also when orch stopped that node meanwhile: its worker had died already).
        lost_at = _stamp(failed[0])
        for node in failed[1:]:
            stamp = _stamp(node)
            if (stamp is not None and not lost_peer(node.monitor)
                    and (lost_at is None or stamp - lost_at <= PEER_LAG_S)):
                return node
        return failed[0]


PEER_LAG_S = 10.0   # torchrun's poll of its workers (5 s in older releases) and clock skew


def _stamp(node: NodeRun) -> Optional[float]:
    """When torchrun on the node saw its first failure (its clock), None if it did not say."""
    root = node.monitor.classifier.child_failed.root_cause()
    return torchrun_time(root.time) if root is not None else None


def _failure_order(node: NodeRun) -> tuple:
    """Earliest torchrun failure first; in the same second, a cause before a rank that lost
    its peer, and a node that failed on its own before one orch stopped."""
    stamp = _stamp(node)
    return (stamp if stamp is not None else float("inf"), lost_peer(node.monitor),
            node.stopped_by_orch, node.ended_at if node.ended_at is not None else float("inf"))


def torchrun_time(text: str) -> Optional[float]:
    """torchrun's `time` of a failure (its host's local time) as seconds, None if unreadable."""
    try:
        return datetime.strptime(text.strip(), TORCHRUN_TIME).timestamp()
    except ValueError:
        return None


def lost_peer(monitor: Monitor) -> bool:
    """Whether the node's ranks failed because another node's went away."""
    classifier = monitor.classifier
    root = classifier.child_failed.root_cause()
    texts = list(classifier.tail) + ([root.traceback] if root is not None else [])
    return any(PEER_LOST.search(text) for text in texts)


# ------------------------------------------------------------------- the job's monitor
def monitor_nodes(nodes: list[tuple[Target, str, MonitorSettings]], *, recorder: "RunRecorder",
                  reporter: MonitorReporter, cli: str = "orch", rerun: str = "",
                  fresh_facts: Optional[Callable[[Target], dict]] = None,
                  stacks_takers: Optional[dict] = None) -> tuple[Verdict, dict]:
    """Watch every node of one job (in node-rank order) to its end, as one run: each node's
    summary to the recorder, one verdict. Returns it and the data the step records.
    stacks_takers: node name -> what takes its stacks when its monitor calls it hung."""
    takers = stacks_takers or {}
    runs = [NodeRun(rank, target, run_dir, make_monitor(target, run_dir, settings,
                                                        recorder=recorder, reporter=reporter,
                                                        stacks_taker=takers.get(target.name)))
            for rank, (target, run_dir, settings) in enumerate(nodes)]
    for node in runs:
        reporter.monitor_started(node.name, node.run_dir, node.monitor.settings)
    watch = NodesWatch(runs)
    try:
        watch.run()
    finally:
        for node in runs:
            reporter.monitor_ended(node.name)
    judged: dict[str, tuple[Verdict, dict]] = {}
    for node in runs:
        if node.end is not None:
            judged[node.name] = judge(node.monitor, node.end, recorder=recorder, cli=cli,
                                      rerun=rerun, fresh_facts=fresh_facts)
    first = watch.first_failure()
    unreachable = [node for node in runs if node.error is not None]
    if first is None and unreachable:
        raise unreachable[0].error       # nothing failed: the run goes on where orch cannot see
    return job_verdict(runs, judged, first, watch.stopped_for)


def job_verdict(runs: list[NodeRun], judged: dict, first: Optional[NodeRun],
                stopper: Optional[NodeRun]) -> tuple[Verdict, dict]:
    """One verdict for the job: the first failed node's (naming it and its rank), else the
    worst of the nodes'."""
    data: dict = {"nodes": {name: node_data for name, (_v, node_data) in judged.items()},
                  "node_ranks": {node.name: node.rank for node in runs},
                  "running": any(node_data.get("running") for _v, node_data in judged.values())}
    stopped = [node.name for node in runs if node.stopped_by_orch]
    if first is not None:
        verdict, _ = judged[first.name]
        root = first.monitor.classifier.child_failed.root_cause()
        said = verdict.message.split(": ", 1)[-1]
        message = (f"{verdict.verdict}: node {first.name} (node rank {first.rank}) failed first: "
                   f"{said}")
        if stopped:
            message += (f"; orch stopped the other node{'s' if len(stopped) > 1 else ''} "
                        f"({', '.join(stopped)}: SIGTERM to its process group, then SIGKILL)")
        data["first_failure"] = {"node": first.name, "node_rank": first.rank,
                                 "rank": root.rank if root is not None else None,
                                 "local_rank": root.local_rank if root is not None else None,
                                 "verdict": verdict.verdict}
        data["stopped_nodes"] = stopped
        findings = list(verdict.findings)
        name = verdict.verdict
    else:
        name = worst(v.verdict for v, _ in judged.values()) if judged else OK
        findings = [f for v, _ in judged.values() for f in v.findings]
        parts = [f"{node.name}: {judged[node.name][0].message.split(': ', 1)[-1]}"
                 for node in runs if node.name in judged]
        message = f"{name}: {len(runs)} nodes; " + "; ".join(parts)
    data.update(verdict=name, message=message, stopped_by=stopper.name if stopper else None)
    summary = {"verdict": name, "nodes": data["node_ranks"],
               "first_failure": data.get("first_failure"), "stopped_nodes": stopped}
    return Verdict(verdict=name, message=message, findings=findings, summary=summary), data
