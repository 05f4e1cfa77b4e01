"""The verdict table (orchestrator/ground/verdicts.py): one rule per verdict, in one order that
decides the classifier's verdict and the ladder; one remediation text each; and no module
outside the table spells a verdict."""

from __future__ import annotations

import ast
import itertools
import os

import pytest

import orchestrator
from orchestrator.ground import verdicts
from orchestrator.ground.errors import ExitCode
from orchestrator.ground.verdicts import (CUDA_OOM, DEGRADED, FAILED, FX_RACE, HANG, KILLED, NCCL_ERROR,
                                          NONZERO_EXIT, OK, RULES, TIMEOUT, TRACEBACK, Evidence, decide,
                                          exit_code_for, remedy, worst)
from orchestrator.watch.classify import ClassifierSettings, EndState, LogClassifier

# For each verdict a detector decides, the least evidence that shows it.
EXAMPLES = {
    verdicts.FX_RACE: dict(signs={FX_RACE}),
    verdicts.RENDEZVOUS_TIMEOUT: dict(hang=True, never_met=True),
    verdicts.HANG: dict(hang=True),
    verdicts.CUDA_OOM: dict(signs={CUDA_OOM}),
    verdicts.KILLED: dict(rank_killed=True),
    verdicts.COLLECTIVE_TIMEOUT: dict(signs={verdicts.COLLECTIVE_TIMEOUT}),
    verdicts.NCCL_ERROR: dict(signs={NCCL_ERROR}),
    verdicts.TIMEOUT: dict(stopped_for="timeout"),
    verdicts.TRACEBACK: dict(traceback=True, failed_exit=True),
    verdicts.NONZERO_EXIT: dict(failed_exit=True),
    verdicts.FAILED: dict(workers_short=True),
    verdicts.RECOMPILE_LIMIT: dict(degraded=True, signs={verdicts.RECOMPILE_LIMIT}),
    verdicts.DEGRADED: dict(degraded=True),
    verdicts.OK: dict(),
}


def evidence(*examples: dict) -> Evidence:
    """The union of examples: signs joined, flags or-ed, one stopped_for."""
    fields: dict = {"signs": set()}
    for example in examples:
        for key, value in example.items():
            if key == "signs":
                fields["signs"] |= value
            elif key == "stopped_for":
                fields[key] = value
            else:
                fields[key] = fields.get(key, False) or value
    fields["signs"] = frozenset(fields["signs"])
    return Evidence(**fields)


def test_every_verdict_a_detector_decides_has_an_example():
    decided = [r.name for r in RULES if r.detector is not None]
    assert decided == list(EXAMPLES)   # the examples are in the table's order too


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_rule_decides_its_own_example(name):
    assert decide(evidence(EXAMPLES[name])) == name


@pytest.mark.parametrize("first,second", list(itertools.combinations(EXAMPLES, 2)))
def test_the_rules_precedence_is_the_verdict_order(first, second):
    """Evidence of two verdicts at once: the one earlier in the table wins."""
    assert verdicts.rule(first).precedence < verdicts.rule(second).precedence
    assert decide(evidence(EXAMPLES[first], EXAMPLES[second])) == first


def test_the_ladder_is_the_same_order():
    assert worst([HANG, FX_RACE]) == FX_RACE
    assert worst([OK, DEGRADED, None]) == DEGRADED
    assert worst([]) == OK
    assert worst([verdicts.RUNNING, FX_RACE]) == verdicts.RUNNING   # a target still running
    # A verdict of a newer orch (not in the table) ranks as "failed".
    assert worst(["some-new-verdict", DEGRADED]) == "some-new-verdict"
    assert worst(["some-new-verdict", HANG]) == HANG


def test_each_failure_verdict_has_one_rule_and_one_remediation_text():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    failures = [r for r in RULES if r.failure]
    assert {r.name for r in failures} == verdicts.FAILURES
    texts = [r.remediation for r in failures]
    assert all(texts) and len(texts) == len(set(texts))
    for r in failures:   # every placeholder is one remedy() fills in
        assert "{" not in remedy(r.name, cli="orch", target="ct1")


def test_exit_codes_come_from_the_rules():
    assert exit_code_for(OK) == ExitCode.OK
    assert exit_code_for(HANG) == ExitCode.RUN_HANG
    assert exit_code_for(verdicts.RECOMPILE_LIMIT) == exit_code_for(DEGRADED) == ExitCode.RUN_DEGRADED
    assert exit_code_for(verdicts.UNREACHABLE) == ExitCode.RUN_UNREACHABLE
    assert exit_code_for(verdicts.INTERRUPTED) == ExitCode.INTERRUPTED
    assert exit_code_for(verdicts.ABANDONED) == exit_code_for("no-such-verdict") == ExitCode.RUN_FAILED


def test_verdict_rules_lists_the_table_for_the_reference():
    listed = verdicts.verdict_rules()
    assert [r["name"] for r in listed] == list(verdicts.VERDICTS)
    assert [r["precedence"] for r in listed] == list(range(len(RULES)))
    oom = next(r for r in listed if r["name"] == CUDA_OOM)
    assert oom["signatures"] == [CUDA_OOM] and oom["exit_code"] == 10 and oom["workload"] == "generic"
    assert oom["decided_by"] == "classifier" and "nvidia-smi" in oom["remediation"]
    assert next(r for r in listed if r["name"] == verdicts.UNREACHABLE)["decided_by"] == "engine"
    assert {r["workload"] for r in listed} <= {"generic", "torchrun", "dflash"}


# ------------------------------------------------------------ the classifier reads it
def classified(lines: list[str], end: EndState, **options):
    classifier = LogClassifier(ClassifierSettings("ct1", **options))
    for number, line in enumerate(lines):
        classifier.feed(line, float(number))
    return classifier.classify(end, cli="orch")


@pytest.mark.parametrize("verdict,lines,end", [
    (CUDA_OOM, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
     EndState(exit_code=1)),
    (NCCL_ERROR, ["RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"],
     EndState(exit_code=1)),
    (TRACEBACK, ["Traceback (most recent call last):", "ValueError: bad"], EndState(exit_code=1)),
    (NONZERO_EXIT, ["bye"], EndState(exit_code=3)),
    (KILLED, ["step=1 loss=1"], EndState(exit_code=None, signal=9)),
    (TIMEOUT, ["step=1 loss=1"], EndState(exit_code=None, signal=15, stopped_for="timeout")),
    (FAILED, ["drafter=0 done steps=5 loss=1 tok_s=10"], EndState(exit_code=0)),
])
def test_the_verdicts_finding_carries_the_tables_remediation(verdict, lines, end):
    options = {"expect_drafters": 2} if verdict == FAILED else {}
    result = classified(lines, end, **options)
    assert result.verdict == verdict
    finding = next(f for f in result.findings if f.signature == verdict)
    assert finding.remediation == remedy(verdict, cli="orch", target="ct1")


def test_a_report_fills_in_the_tables_remediation_for_an_old_finding():
    from orchestrator.runs.model import Finding, RunRecord
    from orchestrator.runs.report import context
    record = RunRecord(run_id="r1", playbook="pb.yaml", playbook_sha256="", name="pb", verdict=CUDA_OOM,
                       findings=[Finding(target="ct1", signature=CUDA_OOM, message="CUDA ran out of memory")])
    shown = context(record)["findings"]
    assert shown[0]["remediation"] == remedy(CUDA_OOM, target="ct1")


# ------------------------------------------------------------ one spelling
PACKAGE = os.path.dirname(orchestrator.__file__)
TABLE = os.path.join(PACKAGE, "ground", "verdicts.py")
# Verdict names that are also words of other vocabularies, with where: these may be spelled
# (a step's status, a process state, why orch stopped a run, a check's name, a data key), but
# never where a verdict is meant (see _verdict_places).
SHARED_WORDS = {
    "ok": "a step's status, JSON's ok",
    "failed": "a step's or a worker's status",
    "running": "a process's or a container's state",
    "timeout": "why orch stopped a run (stopped_for), an option's name",
    "hang": "why orch stopped a run (stopped_for)",
    "traceback": "torchrun's summary field, a step's data key",
    "interrupted": "the CLI's message on Ctrl-C",
    "fx-race": "`orch verify fx-race`, the check's name",
}


def _names() -> set[str]:
    return (set(verdicts.VERDICTS) | {s.name for s in verdicts.SIGNATURES}
            | {verdicts.FIRST_COMPILE_HANG, verdicts.STUCK_RANK, verdicts.RANK_FAILED, verdicts.WORKER_ERROR})


def _sources():
    for folder, _dirs, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            # payloads run inside containers and import nothing of orch's
            if name.endswith(".py") and path != TABLE and os.sep + "payloads" + os.sep not in path:
                yield path, ast.parse(open(path, encoding="utf-8").read())


def _is_verdict(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.endswith("verdict")


def _verdict_places(tree: ast.AST):
    """String constants where a verdict is meant: compared with, assigned to or passed as a
    `...verdict`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(map(_is_verdict, [node.left, *node.comparators])):
            yield from (c for c in node.comparators + [node.left] if isinstance(c, ast.Constant))
        elif isinstance(node, ast.Assign) and any(map(_is_verdict, node.targets)):
            yield from (n for n in ast.walk(node.value) if isinstance(n, ast.Constant))
        elif isinstance(node, ast.keyword) and node.arg and node.arg.endswith("verdict"):
            yield from (n for n in ast.walk(node.value) if isinstance(n, ast.Constant))


def test_no_module_outside_the_table_spells_a_verdict():
    names = _names()
    spelled = []
    for path, tree in _sources():
        where = os.path.relpath(path, PACKAGE)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names - set(SHARED_WORDS):
                spelled.append(f"{where}:{node.lineno}: {node.value!r}")
        for node in _verdict_places(tree):
            if isinstance(node.value, str) and node.value in names:
                spelled.append(f"{where}:{node.lineno}: {node.value!r} as a verdict")
    assert spelled == [], "use the verdict table's constants (orchestrator/ground/verdicts.py)"


def test_the_scan_finds_a_spelled_verdict():
    tree = ast.parse('if record.verdict == "ok":\n    run.verdict = "failed"\nx = f(verdict="hang")\n')
    assert sorted(n.value for n in _verdict_places(tree)) == ["failed", "hang", "ok"]
