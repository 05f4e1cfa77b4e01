"""What the engine, the loader and attach need to know about a step kind is declared on the
kind (steps/base.py's Step), never asked of its name. Kinds registered here, in a test, get
the treatment the monitor, push and collect get, without a line of engine, loader or attach.
"""

from __future__ import annotations

import os
import re

import pytest

from orchestrator import playbook as playbook_package
from orchestrator.config.schema import Param
from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.attach import attach_run
from orchestrator.playbook.loader import load_playbook
from orchestrator.playbook.steps import STEP_KINDS
from orchestrator.playbook.steps.base import Step, StepOutcome
from orchestrator.runs.model import Finding, RunRecord, TargetInfo
from orchestrator.runs.store import RunStore

from tests.support.step_fakes import FakeFleet, FakeHost, FakeReporter, harness, write_project

ASKING_MODULES = ("engine.py", "attach.py", "loader.py", "render.py")


def test_the_engine_loader_attach_and_render_never_ask_which_kind_a_step_is():
    folder = os.path.dirname(playbook_package.__file__)
    found = []
    for name in ASKING_MODULES:
        with open(os.path.join(folder, name), encoding="utf-8") as handle:
            found += [f"{name}:{number}: {line.strip()}" for number, line in enumerate(handle, 1)
                      if re.search(r"kind ==|kind in \(", line)]
    assert found == []


# ------------------------------------------------------------------ kinds of a test's own
class JudgeStep(Step):
    """Judges the run, as the monitor does: its verdict is the target's."""

    kind = "judge"
    judges_run = True
    params = {"verdict": Param((str,), default="hang"),
              "patience": Param((int,), default=5, doc="seconds")}
    seen: list[dict] = []

    def run(self, ctx, params):
        JudgeStep.seen.append(params)
        return StepOutcome(status="failed", message="judged", verdict=params["verdict"],
                           findings=[Finding(target=ctx.target.name, signature=params["verdict"],
                                             message="judged")])

    def reattach(self, launch):
        return ReattachedJudge(launch)


class ReattachedJudge(JudgeStep):
    params: dict = {}

    def __init__(self, launch):
        self.launch = launch

    def run(self, ctx, params):
        return StepOutcome(status="failed", message=f"judged {self.launch['run_dir']} again",
                           verdict="degraded", findings=[Finding(target=ctx.target.name,
                                                                 signature="degraded",
                                                                 message="judged again")])


class NeedsFileStep(Step):
    """A load-time check that needs the playbook, as push's files do."""

    kind = "needs_file"
    params = {"path": Param((str,), required=True)}

    def check_loaded(self, playbook, spec):
        if not os.path.exists(os.path.join(playbook.directory, spec.params["path"])):
            raise spec.params_loc.child("path").error(f"{spec.params['path']}: not beside the playbook")

    def run(self, ctx, params):
        return StepOutcome(message="found")


class GatherStep(Step):
    """Runs after `orch attach` has followed the run, as collect does."""

    kind = "gather"
    runs_on_attach = True

    def run(self, ctx, params):
        return StepOutcome(message="gathered")


class NoteStep(Step):
    kind = "note"
    order: list = []

    def run(self, ctx, params):
        NoteStep.order.append(("note", ctx.target.name))
        return StepOutcome(message="noted")


class GroupStep(Step):
    """Spans the run's targets, as a launch over many nodes does: once, for all of them."""

    kind = "group"
    params = {"fits": Param((int,), default=2)}

    def spans_nodes(self, playbook, spec):
        return True

    def check_nodes(self, spec, nodes):
        if len(nodes) != spec.params.get("fits", 2):
            raise spec.params_loc.error(f"{len(nodes)} targets do not fit")

    def run(self, ctx, params):
        NoteStep.order.append(("group", ctx.target.name, tuple(n.name for n in ctx.nodes)))
        return StepOutcome(status="changed", message="grouped",
                           data={"nodes": {n.name: {"mine": n.name} for n in ctx.nodes}})


@pytest.fixture(autouse=True)
def test_kinds(monkeypatch):
    for cls in (JudgeStep, NeedsFileStep, GatherStep, NoteStep, GroupStep):
        monkeypatch.setitem(STEP_KINDS, cls.kind, cls)
    JudgeStep.seen = []
    NoteStep.order = []


JUDGED = """\
name: judged
targets: [dev]
vars: {patience: 7}
steps:
  - name: judge it
    judge: {patience: "{{ patience }}"}
    continue_on_error: true
  - note: {}
"""


def test_a_kind_that_judges_the_run_gives_its_verdict_and_its_settings_are_checked(tmp_path):
    h = harness(tmp_path, JUDGED)
    record = h.record()
    assert JudgeStep.seen == [{"verdict": "hang", "patience": 7}]   # rendered, defaults filled
    assert record.verdict == "hang" and record.exit_code == 11
    assert record.steps[0].data["verdict"] == "hang"
    assert [f.signature for f in record.findings] == ["hang"]
    # the same schema, through the one render_params, refuses a bad -e value at load time
    with pytest.raises(ConfigError) as raised:
        load_playbook(str(tmp_path / "playbook.yaml"), {"patience": "soon"})
    assert "patience must be an integer" in str(raised.value)
    assert "playbook.yaml:6:" in str(raised.value)


def test_a_kind_that_does_not_judge_the_run_leaves_its_verdict_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(JudgeStep, "judges_run", False)
    record = harness(tmp_path, JUDGED).record()
    assert record.verdict == "ok"       # continue_on_error: its failure says only why it failed
    assert "verdict" not in record.steps[0].data


def test_a_kind_checks_what_needs_the_whole_playbook_at_load_time(tmp_path):
    book, _ = write_project(tmp_path, """\
        name: files
        targets: [dev]
        steps:
          - needs_file: {path: data.txt}
        """)
    with pytest.raises(ConfigError) as raised:
        load_playbook(book)
    assert "data.txt: not beside the playbook" in str(raised.value)
    assert "playbook.yaml:4:" in str(raised.value)
    (tmp_path / "data.txt").write_text("here")
    assert load_playbook(book).steps[0].kind == "needs_file"


ATTACHED = JUDGED.replace("  - note: {}\n", "  - gather: {}\n  - note: {}\n")


def _recorded(tmp_path, **fields) -> RunRecord:
    book_path, _ = write_project(tmp_path, ATTACHED)
    book = load_playbook(book_path)
    return RunRecord(run_id="20261130-120000-hooks0", playbook=book_path,
                     playbook_sha256=book.sha256, name=book.name,
                     targets=[TargetInfo(name="dev", host="here", vmid=None)],
                     launch={"targets": {"dev": {"run_dir": "/runs/r1", "monitor_step": 0}}},
                     **fields)


def _attach(tmp_path, record: RunRecord) -> tuple[RunRecord, RunRecord]:
    """attach_run on the stored record: what it returns, and the record stored after it."""
    with RunStore() as store:
        store.begin(record)
        if record.verdict != "running":
            store.finish(record)
        fleet = FakeFleet(str(tmp_path / "inv.yaml"), FakeHost())
        returned = attach_run(record.run_id, reporter=FakeReporter(), store=store, fleet=fleet)
        return returned, store.get(record.run_id)


def test_attach_follows_again_with_the_kind_and_runs_the_kinds_that_run_after_it(tmp_path):
    returned, stored = _attach(tmp_path, _recorded(tmp_path))
    for final in (returned, stored):
        assert [(s.name, s.kind, s.message) for s in final.steps] == [
            ("attach: judge it", "judge", "judged /runs/r1 again"), ("gather", "gather", "gathered")]
        assert final.verdict == "degraded" and final.exit_code == 12
        assert [f.message for f in final.findings] == ["judged again"]


def test_attach_replays_an_ended_run_without_rewriting_or_doubling_its_findings(tmp_path):
    old = Finding(target="dev", signature="hang", message="judged")
    returned, stored = _attach(tmp_path, _recorded(tmp_path, verdict="hang", exit_code=11,
                                                   ended_at="2026-11-30T12:01:00+00:00",
                                                   findings=[old]))
    assert returned.verdict == "degraded"
    assert [f.message for f in returned.findings] == ["judged again"]   # replaced, not added
    assert [s.name for s in returned.steps] == ["attach: judge it"]    # no later steps on replay
    assert stored.verdict == "hang" and [f.message for f in stored.findings] == ["judged"]
    assert stored.steps == []


GROUPED = """\
name: grouped
targets: [dev, other]
steps:
  - note: {}
  - group: {}
  - note: {}
"""


def test_a_kind_that_spans_the_nodes_runs_once_after_every_target_is_ready(tmp_path):
    record = harness(tmp_path, GROUPED).record()
    order = NoteStep.order
    grouped = order.index(("group", "dev", ("dev", "other")))
    assert sorted(order[:grouped]) == [("note", "dev"), ("note", "other")]   # both first
    assert [o for o in order if o[0] == "group"] == [("group", "dev", ("dev", "other"))]   # once
    assert sorted(order[grouped + 1:]) == [("note", "dev"), ("note", "other")]
    group_steps = [(s.target, s.status, s.data) for s in record.steps if s.kind == "group"]
    assert group_steps == [("dev", "changed", {"nodes": {"dev": {"mine": "dev"}, "other": {"mine": "other"}}}),
                           ("other", "changed", {"mine": "other"})]       # each node's own part


def test_targets_that_do_not_fit_a_kind_over_the_nodes_fail_before_anything_runs(tmp_path):
    h = harness(tmp_path, GROUPED.replace("group: {}", "group: {fits: 3}"))
    with pytest.raises(ConfigError) as raised:
        h.record()
    assert "2 targets do not fit" in str(raised.value) and "playbook.yaml:5:12:" in str(raised.value)
    assert NoteStep.order == []


def test_a_kind_over_the_nodes_is_skipped_on_every_node_when_its_condition_is_false(tmp_path):
    record = harness(tmp_path, GROUPED.replace("  - group: {}", "  - group: {}\n    when: false")).record()
    assert [o for o in NoteStep.order if o[0] == "group"] == []
    assert [(s.target, s.status) for s in record.steps if s.kind == "group"] == [
        ("dev", "skipped"), ("other", "skipped")]
