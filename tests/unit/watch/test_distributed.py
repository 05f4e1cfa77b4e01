"""Verdicts for distributed runs, from torchrun's real output (torch 2.13, gloo, 2 ranks).

The logs under tests/fixtures/logs were printed by real `torchrun --nproc-per-node 2` runs of
tests/trainer/real/ddp_specforge_loop.py (paths shortened): a rank killed with SIGKILL, a rank
sleeping past the collective timeout, a rendezvous with a node missing (static and c10d).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.watch.distributed import ChildFailedReader, RankFailure, behind, stuck_message
from orchestrator.watch.classify import PEER_FAILED, ClassifierSettings, EndState, LogClassifier

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def classify_log(name: str, end=EndState(state="exited", exit_code=1), **settings):
    classifier = LogClassifier(ClassifierSettings("dev", **settings))
    for i, line in enumerate((LOGS / name).read_text().splitlines()):
        classifier.feed(line, float(i))
    return classifier.classify(end, {}, cli="orch", playbook="pb.yaml")


def test_child_failed_summary_names_the_root_cause_rank_and_signal():
    reader = ChildFailedReader()
    for line in (LOGS / "torchrun-sigkill.log").read_text().splitlines():
        reader.feed(line)
    assert [(f.rank, f.local_rank, f.exit_code, f.root_cause) for f in reader.failures] == [
        (0, 0, -15, False), (1, 1, -9, True)]
    root = reader.root_cause()
    assert (root.signal, root.signal_name, root.host) == (9, "SIGKILL", "localhost")
    assert root.describe().startswith("rank 1 on localhost was killed by SIGKILL (signal 9), pid ")


def test_a_rank_killed_by_sigkill_reads_as_host_oom():
    verdict = classify_log("torchrun-sigkill.log")
    assert verdict.verdict == "killed"
    assert verdict.message.startswith("killed: torchrun: rank 1 on localhost was killed by SIGKILL (signal 9)")
    assert "the host's OOM killer" in verdict.message
    finding = next(f for f in verdict.findings if f.signature == "rank-failed")
    assert "dmesg" in finding.remediation
    assert "rank 0 on localhost was killed by SIGTERM (signal 15)" in finding.evidence[0]


def test_a_rank_sigkilled_before_orch_stopped_its_node_for_a_peer_is_still_killed():
    # the other node noticed the lost peer first and orch stopped this one, but torchrun here
    # had already printed its table: the SIGKILL is this node's own failure
    verdict = classify_log("torchrun-sigkill.log", EndState(state="exited", exit_code=1,
                                                           stopped_for=PEER_FAILED))
    assert verdict.verdict == "killed"
    assert verdict.message.startswith("killed: torchrun: rank 1 on localhost was killed by SIGKILL")


def test_a_rank_ended_by_the_stops_sigterm_is_not_a_kill_of_its_own():
    text = (LOGS / "torchrun-sigkill.log").read_text()
    text = text.replace("exitcode  : -9 (pid: 6370)  (SIGKILL)", "exitcode  : -15 (pid: 6370)  (SIGTERM)")
    classifier = LogClassifier(ClassifierSettings("dev"))
    for i, line in enumerate(text.splitlines()):
        classifier.feed(line, float(i))
    verdict = classifier.classify(EndState(state="exited", exit_code=1, stopped_for=PEER_FAILED),
                                  {}, cli="orch")
    assert verdict.verdict != "killed"


def test_gloo_collective_timeout():
    verdict = classify_log("torchrun-gloo-timeout.log")
    assert verdict.verdict == "collective-timeout"
    finding = next(f for f in verdict.findings if f.signature == "collective-timeout")
    assert "Timed out waiting 5000ms for recv operation" in finding.evidence[0]
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in finding.remediation
    # torchrun's summary is read too: the rank that raised, with its exit code
    assert any(f.signature == "rank-failed" and "rank 0 on localhost exited with code 1" in f.message
               for f in verdict.findings)


@pytest.mark.parametrize("log", ["torchrun-rendezvous-static.log", "torchrun-rendezvous-c10d.log"])
def test_rendezvous_that_never_completes(log):
    verdict = classify_log(log)
    assert verdict.verdict == "rendezvous-timeout"
    assert verdict.message == "rendezvous-timeout: the rendezvous never completed (not every rank joined)"
    assert "--rdzv-endpoint" in next(f for f in verdict.findings if f.signature == "rendezvous-timeout").remediation


def test_a_hang_names_the_rank_behind_the_others():
    classifier = LogClassifier(ClassifierSettings("dev", hang_after=60, worker_word="rank"))
    for step in range(1, 11):
        classifier.feed(f"drafter=0 step={step} loss=1.0 tok_s=10", float(step))
        if step <= 7:
            classifier.feed(f"drafter=1 step={step} loss=1.0 tok_s=10", float(step))
    verdict = classifier.classify(EndState(state="exited", exit_code=-9, stopped_for="hang", hang_seconds=61),
                                  {}, cli="orch")
    assert verdict.verdict == "hang"
    assert verdict.message.startswith("hang: rank 1 stopped at step 7 while rank 0 reached step 10 "
                                      "and wait for it")
    assert any(f.signature == "hang:stuck-rank" for f in verdict.findings)


def test_level_workers_name_no_one():
    assert behind({0: 5, 1: 5}) == ([], 5, 5)
    assert stuck_message({0: 5, 1: 5}) is None
    assert stuck_message({0: 9, 1: 3, 2: 3}) == ("ranks 1, 2 stopped at step 3 while rank 0 reached "
                                                 "step 9 and wait for them (in a collective, most likely)")


def test_a_summary_cut_short_or_garbled_does_not_crash():
    reader = ChildFailedReader()
    for line in ["ChildFailedError:", "[0]:", "  rank      : x", "  exitcode  : ?? (pid: ?)", "[1]:"]:
        reader.feed(line)
    assert reader.root_cause() == RankFailure()
    assert RankFailure(rank=2, exit_code=-99).describe() == "rank 2 was killed by signal 99 (signal 99)"


def test_ranks_that_never_reach_their_store_are_a_rendezvous_failure_not_a_plain_hang():
    # Real torchrun output in a container whose loopback was down (127.0.0.1 unreachable).
    end = EndState(state="exited", exit_code=-15, stopped_for="hang", hang_seconds=60)
    verdict = classify_log("torchrun-store-unreachable.log", end, hang_after=60)
    assert verdict.verdict == "rendezvous-timeout"
    assert verdict.message == "rendezvous-timeout: the ranks never met: their rendezvous store could not be reached"
    finding = next(f for f in verdict.findings if f.signature == "rendezvous-timeout")
    assert "ip link set lo up" in finding.remediation and "127.0.0.1, 29500" in finding.evidence[0]


def test_a_retry_before_a_run_that_trains_is_no_failure():
    classifier = LogClassifier(ClassifierSettings("dev"))
    lines = (LOGS / "torchrun-store-unreachable.log").read_text().splitlines()[8:10]
    for i, line in enumerate(lines + ["drafter=0 step=1 loss=1 tok_s=5", "drafter=0 done steps=1"]):
        classifier.feed(line, float(i))
    assert classifier.classify(EndState(state="exited", exit_code=0), {}).verdict == "ok"


def test_torchrun_that_never_starts_a_rank_is_a_rendezvous_failure():
    classifier = LogClassifier(ClassifierSettings("dev", hang_after=20, rank_logs_expected=True))
    classifier.feed("[W1130 12:46:03.221483212 socket.cpp:207] [c10d] The hostname of the client "
                    "socket cannot be retrieved. err=-3", 0.0)
    end = EndState(state="exited", exit_code=143, signal=None, stopped_for="hang", hang_seconds=20)
    verdict = classifier.classify(end, {})
    assert verdict.verdict == "rendezvous-timeout"
    assert verdict.message == "rendezvous-timeout: the ranks never met: torchrun's rendezvous never completed"
    classifier.rank_logs_started()       # its workers started: then it is a plain hang
    assert classifier.classify(end, {}).verdict == "hang"


# ------------------------------------------------- verdicts from torchrun's failed ends
def test_every_failed_verdict_is_a_finding_the_report_lists():
    from orchestrator.runs.compare import is_problem

    verdict = classify_log("torchrun-sigkill.log")
    assert verdict.verdict == "killed"
    killed = [f for f in verdict.findings if f.signature == "killed"]
    assert killed and is_problem(killed[0].signature) and "OOM killer" in killed[0].remediation


def test_a_rendezvous_hang_is_not_advised_the_fx_patch():
    end = EndState(state="exited", exit_code=-15, stopped_for="hang", hang_seconds=60)
    verdict = classify_log("torchrun-store-unreachable.log", end, hang_after=60)
    assert verdict.verdict == "rendezvous-timeout"
    assert not any("fx-tls" in f.remediation or "drafter" in f.remediation for f in verdict.findings)


def test_an_at_record_error_file_is_kept_whole():
    reader = ChildFailedReader()
    text = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_10:00:01
  host      : ct200
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "/root/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 357, in wrapper
      return f(*args, **kwargs)
    File "/root/train.py", line 12, in main
      raise ValueError("bad shard 7")
  ValueError: bad shard 7
============================================================"""
    for line in text.splitlines():
        reader.feed(line)
    [failure] = reader.failures
    assert failure.traceback.splitlines()[0] == "Traceback (most recent call last):"
    assert failure.traceback.splitlines()[-1].strip() == "ValueError: bad shard 7"
    assert len(failure.traceback.splitlines()) == 6


def test_after_a_clean_two_rank_end_every_rank_is_done():
    from orchestrator.watch.logformats import LogPoint

    classifier = LogClassifier(ClassifierSettings("dev", metrics_from_lines=False, worker_word="rank"))
    for rank in (0, 1):
        classifier.observe(LogPoint(step=40, worker=rank, loss=1.0), 1.0)
    verdict = classifier.classify(EndState(state="exited", exit_code=0))
    assert {r["status"] for r in verdict.summary["drafters"].values()} == {"done"}
    assert verdict.summary["drafters_ok"] == 2 and verdict.message.startswith("ok: 2 ranks trained")


def test_output_keeps_a_run_alive_before_any_step_but_rendezvous_retries_do_not():
    classifier = LogClassifier(ClassifierSettings("dev", metrics_from_lines=False, hang_after=10))
    for second in range(30):
        classifier.saw_output(float(second))
        classifier.feed("loading shards ...", float(second))
    assert not classifier.hung(30.0, alive=True)
    retrying = LogClassifier(ClassifierSettings("dev", metrics_from_lines=False, hang_after=10))
    for second in range(30):
        retrying.saw_output(float(second))
        retrying.feed("[W1130 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host "
                      "127.0.0.1:29500 - retrying (try=0, timeout=900000ms, delay=497ms)", float(second))
    assert retrying.hung(30.0, alive=True)


# ------------------------------------------------------------------ the verdict quotes the cause
CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "explain_corpus"


def classify_run(case: str, end: EndState) -> "Verdict":
    """A corpus run's files fed as the monitor feeds them (its LogParser per file, each rank's
    own file under its local rank)."""
    from orchestrator.watch.logformats import LogParser, WorkerCap, make_format
    from orchestrator.watch.monitor import worker_of
    classifier = LogClassifier(ClassifierSettings("dev"))
    folder = CORPUS / case
    for path in [folder / "output.log", *sorted(folder.glob("ranks/**/*.log"))]:
        name = None if path.name == "output.log" else str(path.relative_to(folder / "ranks"))
        parser = LogParser(make_format("auto"), worker=worker_of(name), workers=WorkerCap(), source=name)
        lines, _ = parser.feed(path.read_text())
        finished, _ = parser.finish()
        for line in lines + finished:
            classifier.feed(line, 0.0, name, worker_of(name))
    return classifier.classify(end, {}, cli="orch")


def test_the_verdict_quotes_the_workers_exception_not_torchruns_wrapper():
    verdict = classify_run("ddp-raise", EndState(state="exited", exit_code=1))
    assert verdict.verdict == "traceback"
    assert verdict.message.startswith("traceback: torchrun: rank 1 on localhost exited with code 1, pid ")
    assert ": RuntimeError: injected failure on rank 1 at step 30" in verdict.message
    [finding] = [f for f in verdict.findings if f.signature == "traceback"]
    assert finding.message == "the run failed with RuntimeError: injected failure on rank 1 at step 30 (rank 1)"
    assert not any("ChildFailedError" in f.message for f in verdict.findings)


def test_a_plain_traceback_verdict_quotes_its_exception():
    classifier = LogClassifier(ClassifierSettings("dev"))
    for line in (CORPUS / "single-config-keyerror" / "output.log").read_text().splitlines():
        classifier.feed(line, 0.0)
    verdict = classifier.classify(EndState(state="exited", exit_code=1), {}, cli="orch")
    assert verdict.message == "traceback: KeyError: 'betas'"
