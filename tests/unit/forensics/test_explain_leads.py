"""What `orch explain` leads with, on the labelled corpus of real failures
(tests/fixtures/explain_corpus, made by tests/corpus/make_explain_corpus.py): the logs alone,
as explain reads them (forensics/explain.py's read_logs, causes.py), no source read. The whole
answer, shared state included, is tests/torch/test_explain_corpus.py's."""

from __future__ import annotations

import pytest

from benchmarks.explain_corpus import case_logs, case_record, lead_right, load_cases
from orchestrator.watch import causes, tracebacks
from orchestrator.forensics import explain

CASES = load_cases()


def leads(case: dict) -> list:
    """Each target's reading of the case's logs, the run's cause first (over several nodes)."""
    record = case_record(case)
    explained = []
    for target, logs in case_logs(case).items():
        hints = explain.run_hints(record, target) if record is not None else None
        reading = explain.read_logs(logs, hints)
        explained.append(explain.Explanation(target, [], [], [], [], lead=reading.lead,
                                             consequences=reading.consequences))
    return explain.first_node_first(explained, record) if record is not None else explained


def test_the_corpus_is_what_the_issue_asks_for():
    counts = {c: sum(case["category"] == c for case in CASES) for c in ("single", "multi-rank", "race", "hang")}
    assert len(CASES) >= 30 and counts["single"] >= 10 and counts["multi-rank"] >= 5
    assert counts["race"] >= 5 and counts["hang"] >= 3, counts


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_lead_is_the_cause(case):
    [first, *_] = leads(case)
    lead = first.lead.to_dict() if first.lead is not None else None
    assert lead_right(case["lead"], lead), (case["lead"], lead)


def test_torchruns_wrappers_and_the_survivors_follow_from_the_rank_that_raised():
    [case] = [c for c in CASES if c["name"] == "two-nodes-raise"]
    cause, other = leads(case)
    assert (cause.target, cause.lead.node, cause.lead.kind) == ("sb2-200", "sb2-200", "exception")
    assert cause.lead.summary == "RuntimeError: injected failure on rank 1 at step 30 (rank 1)"
    assert any("ChildFailedError" in c.what and "torchrun's own traceback" in c.because
               for c in cause.consequences)
    # sb1-200's rank 0 lost its peer: its lead follows from sb2-200's
    assert other.lead.consequence_of.startswith("sb2-200: RuntimeError: injected failure")
    assert "Connection closed by peer" in other.lead.summary


def test_a_rank_killed_by_sigkill_leads_and_its_peer_follows():
    [case] = [c for c in CASES if c["name"] == "ddp-sigkill"]
    [only] = leads(case)
    assert (only.lead.kind, only.lead.signal, only.lead.workers) == ("signal", "SIGKILL", ["rank 1"])
    assert any("lost its peer" in c.because for c in only.consequences)


def test_a_hung_run_says_so_with_its_last_lines_and_no_exception():
    [case] = [c for c in CASES if c["name"] == "hang-deadlock-orch-stopped"]
    [only] = leads(case)
    assert only.lead.kind == "hang" and only.lead.exception == "" and only.lead.failure is None
    assert any("holds second" in line for line in only.lead.last_lines)


def test_a_dataloader_workers_own_traceback_leads_its_reraise():
    [case] = [c for c in CASES if c["name"] == "single-dataloader-worker"]
    [only] = leads(case)
    assert (only.lead.exception, only.lead.message, only.lead.workers) == \
        ("KeyError", "'labels'", ["DataLoader worker process 0"])
    assert [c.because for c in only.consequences] == \
        ["re-raised in the main process from its worker's own traceback"]


# ------------------------------------------------------------------ the parts, on torch's own words
RANK_TRACEBACK = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/w/train.py", line 46, in inject
[rank1]:     raise RuntimeError(f"injected failure on rank {rank} at step {step}")
[rank1]: RuntimeError: injected failure on rank 1 at step 30
"""


def test_torchs_rank_prefix_and_its_space_keep_the_exception_line():
    """torch.distributed's excepthook prefixes every line `[rankN]: ` (a space after the
    colon): the exception line is indented like the header, not a code line."""
    [tb] = tracebacks.parse(RANK_TRACEBACK).tracebacks
    assert (tb.worker, tb.kind, tb.exception, tb.message) == \
        ("rank 1", tracebacks.RANK, "RuntimeError", "injected failure on rank 1 at step 30")
    assert tb.frames[0].code.startswith("raise RuntimeError")


def test_torchruns_table_is_read_once_from_its_table_not_as_a_log_traceback():
    table = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
             "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-03_12:53:53\n"
             "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 14195)\n"
             "  error_file: /r/ranks/x/attempt_0/1/error.json\n"
             "  traceback : Traceback (most recent call last):\n"
             "    File \"/w/train.py\", line 48, in inject\n      config[\"scheduler\"]\n"
             "  KeyError: 'scheduler'\n  \n" + "=" * 60 + "\n")
    assert tracebacks.parse(table).tracebacks == []
    reading = explain.read_logs([explain.LogText("output.log", table)])
    assert (reading.lead.exception, reading.lead.workers) == ("KeyError", ["rank 1"])
    assert "torchrun's root cause" in reading.lead.why[0]


def test_nothing_in_the_logs_is_no_lead():
    assert explain.read_logs([explain.LogText("output.log", "step=1 loss=2.0\nsummary status=ok\n")]).lead is None


def test_a_lost_peer_alone_says_its_cause_is_elsewhere():
    text = RANK_TRACEBACK.replace("rank1", "rank0").replace(
        "RuntimeError: injected failure on rank 1 at step 30",
        "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:4242")
    lead = explain.read_logs([explain.LogText("output.log", text)]).lead
    assert lead.kind == "peer-lost" and "not in these logs" in lead.why[0]
    assert lead.strength < causes.STRENGTH["exception"]


def test_a_node_orch_stopped_leads_with_its_own_lost_peer_not_the_stop():
    """The other node failed first and orch stopped this one: its rank had lost its peer
    before the stop; the stop leads only when nothing failed before it."""
    text = RANK_TRACEBACK.replace("RuntimeError: injected failure on rank 1 at step 30",
                                  "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:4242")
    stopped = causes.RunHints(stopped_for="node-failed")
    assert explain.read_logs([explain.LogText("output.log", text)], stopped).lead.kind == "peer-lost"
    quiet = explain.read_logs([explain.LogText("output.log", "rank 0 step=3\n")], stopped).lead
    assert (quiet.kind, quiet.summary) == ("stopped", causes.STOPS["node-failed"])


def test_a_run_whose_venv_is_gone_still_gets_its_cause(monkeypatch):
    """The venv the run ran is removed since, and the container has no other: the frames'
    source is not read, the cause (the logs') is still said."""
    from orchestrator.ground.errors import PythonUnavailable
    tried = []

    def no_python(target, frames, **options):
        tried.append(options.get("python"))
        raise PythonUnavailable(f"cannot run {options.get('python') or '/root/venv/bin/python'}")

    monkeypatch.setattr(explain.payload_api, "explain_frames", no_python)

    class Gone:
        name = "dev"

    result = explain.explain(Gone(), [explain.LogText("dev:/r/output.log", RANK_TRACEBACK)],
                             python="/root/old-venv/bin/python")
    assert tried == ["/root/old-venv/bin/python", None]
    assert result.lead.summary == "RuntimeError: injected failure on rank 1 at step 30 (rank 1)"
    assert result.failures[0].frames[0].available is False
    assert "the frames' source is not read" in result.notes[-1]
