"""Attach to and stop a recorded run: `orch attach RUN`, `orch stop RUN`.

A launched training run outlives the orch that started it (killed, interrupted, a closed
laptop). attach_run follows it again through the engine's and the recorder's public API;
stop_recorded_run ends its processes and, when no orch watches it any more, records it.
"""

from __future__ import annotations

import os
from typing import Optional

from orchestrator.config.yamlsrc import Loc, OptionSource
from orchestrator.playbook.engine import Engine, TargetRun
from orchestrator.ground.errors import ConnectionProblem, OrchError
from orchestrator.ground.verdicts import FAILED, KILLED, RUNNING, UNREACHABLE, exit_code_for, worst
from orchestrator.targets.fleet import Fleet, each_concurrently, fan_out
from orchestrator.remote.payload_api import stop_run
from orchestrator.playbook.loader import load_playbook
from orchestrator.playbook.model import Playbook, StepSpec
from orchestrator.runs.controller import (ALIVE, GONE, abandoned_because, controller_state,
                                          describe, mark_abandoned)
from orchestrator.runs.model import Finding, RunRecord, now_iso
from orchestrator.runs.recorder import RunRecorder, controller_entry
from orchestrator.remote.container import Target
from orchestrator.runs.store import RunStore
from orchestrator.playbook.steps import STEP_KINDS
from orchestrator.playbook.steps.base import Reporter, RunInfo, Step, cli_prefix
from orchestrator.playbook.steps.monitor import MonitorStep


def _stub_playbook(record: RunRecord) -> Playbook:
    return Playbook(path=record.playbook, name=record.name, description="", targets=[],
                    targets_loc=None, vars={}, var_locs={}, steps=[],
                    sha256=record.playbook_sha256)


def _recorded_playbook(record: RunRecord) -> tuple[Playbook, bool]:
    """The run's playbook when it is still there unchanged (its later steps can run)."""
    try:
        book = load_playbook(record.playbook)
    except OrchError:
        return _stub_playbook(record), False
    return book, book.sha256 == record.playbook_sha256


def _launched(record: RunRecord) -> dict[str, dict]:
    """target -> launch entry, for each target where the run launched a process."""
    return {name: entry for name, entry in record.launches().items() if entry.get("run_dir")}


def _open_fleet(record: RunRecord, inventory: Optional[str], trust_on_first_use: bool) -> Fleet:
    """The inventory a recorded run was started with, unless the user named one with -i."""
    recorded = (record.launch or {}).get("inventory")
    if inventory is None and recorded and os.path.exists(recorded):
        return Fleet.from_path(recorded, trust_on_first_use=trust_on_first_use)
    return Fleet.from_path(inventory, trust_on_first_use=trust_on_first_use)


def controller_alive(record: RunRecord) -> bool:
    """Is another orch process that runs this record still alive (on this machine)?"""
    pid = ((record.launch or {}).get("controller") or {}).get("pid")
    return pid != os.getpid() and controller_state(record) == ALIVE


def _settle_unlaunched(store: RunStore, record: RunRecord, verb: str) -> RunRecord:
    """A record that launched nothing: when its controller is gone, nothing will ever end
    it, so attach and stop record it as abandoned; a live controller still owns it."""
    if record.verdict == RUNNING and controller_state(record) == GONE:
        return mark_abandoned(store, record, abandoned_because(record) + " before it "
                              f"launched anything; settled by `orch {verb} {record.run_id}`")
    if record.verdict == RUNNING and controller_alive(record):
        raise OrchError(f"run {record.run_id} launched nothing yet: {describe(record)}",
                        hint="wait for it, or stop that orch (Ctrl-C) first")
    raise OrchError(f"run {record.run_id} launched nothing to attach to" if verb == "attach"
                    else f"run {record.run_id} has no launched process to stop",
                    hint=f"`orch runs show {record.run_id}` shows what it did")


class _Attachment:
    """One `orch attach`: the recorded run, the engine that runs its collect steps, and
    whether the record is still live (else it is replayed, not rewritten)."""

    def __init__(self, record: RunRecord, fleet: Fleet, reporter: Reporter, store: RunStore,
                 cli: str):
        self.record = record
        self.reporter = reporter
        self.launches = _launched(record)
        self.book, self.same = _recorded_playbook(record)
        self.live = record.verdict == RUNNING
        recorder = RunRecorder(record.run_id, store if self.live else None)
        recorder.resume(record, self.launches,
                        controller_entry(attached=True) if self.live else None)
        self.run = RunInfo(run_id=record.run_id, playbook=self.book, recorder=recorder,
                           playbook_arg=os.path.relpath(record.playbook) if record.playbook else self.book.path,
                           cli=(record.launch or {}).get("cli") or cli, inventory=fleet.inventory,
                           fleet=fleet)
        self.engine = Engine(self.run, fleet, reporter)
        self.targets = [fleet.target(spec) for spec in fleet.inventory.resolve(list(self.launches))]

    def groups(self) -> list[list[Target]]:
        """The targets to follow, each alone, or the nodes of one job over many together (in
        node-rank order), as its monitor followed them."""
        groups: list[list[Target]] = []
        jobs: dict[tuple, list[Target]] = {}
        for target in self.targets:
            nodes = self.launches[target.name].get("nodes")
            if not nodes:
                groups.append([target])
                continue
            key = tuple(nodes)
            if key not in jobs:
                jobs[key] = []
                groups.append(jobs[key])
            jobs[key].append(target)
        for group in groups:
            group.sort(key=lambda t: self.launches[t.name].get("node_rank", 0))
        return groups

    def follow(self, group: list[Target]) -> list[TargetRun]:
        """Monitor one target's run (or one job's nodes, as one) to its end, then (playbook
        unchanged) the steps that run after it on attach (collect), each through the
        engine's own step path."""
        runs = [TargetRun(target, self.engine.render_vars(target) if self.same
                          else {**self.engine.base_context(target), **self.record.vars})
                for target in group]
        entry = self.launches[group[0].name]
        spec, step = _attach_step(self.book, entry)
        name = "attach: " + spec.label()
        if len(group) > 1 or entry.get("nodes"):
            outcome = self.engine.perform_nodes(runs, spec, step, {}, name=name)
        else:
            outcome = self.engine.perform(runs[0], spec, step, {}, name=name)
        if outcome.findings and not self.live:
            # A replayed record: these targets' findings are the ones just found, not both.
            names = {t.name for t in group}
            self.record.findings = [f for f in self.record.findings
                                    if f.target not in names] + outcome.findings
        if self.same and self.live:
            after = entry.get("monitor_step", entry.get("step", -1))
            for later in self.book.steps:
                if later.index > after and STEP_KINDS[later.kind].runs_on_attach:
                    for run in runs:
                        self.engine.run_step(run, later)
        return runs


def attach_run(ref: str, *, reporter: Reporter, inventory: Optional[str] = None,
               trust_on_first_use: bool = False, store: Optional[RunStore] = None,
               fleet: Optional[Fleet] = None) -> RunRecord:
    """Follow a launched run again (after a killed controller, a closed laptop, Ctrl-C):
    monitor it to its end, run the playbook's collect steps after it, record the verdict.
    Without a fleet, the run's recorded inventory is opened (or `inventory`, given with -i)."""
    own_store, own_fleet = store is None, None
    store = store or RunStore()
    try:
        record = store.get(ref)
        if not _launched(record):
            record = _settle_unlaunched(store, record, "attach")
            reporter.note("attach", f"run {record.run_id}: {record.findings[-1].message}", "warn")
            return record
        if fleet is None:
            fleet = own_fleet = _open_fleet(record, inventory, trust_on_first_use)
        attachment = _Attachment(record, fleet, reporter, store, cli_prefix(inventory))
        reporter.run_started(attachment.run, attachment.targets)
        if not attachment.same and attachment.book.steps:
            reporter.note("attach", f"{record.playbook} changed since the run started: only the "
                                    "monitor runs, not its later steps", "warn")
        groups = attachment.groups()
        runs = [run for group, outcome in zip(groups, each_concurrently(groups, attachment.follow))
                for run in (outcome if isinstance(outcome, list)
                            else [_failed_run(t, outcome) for t in group])]
        if attachment.live:
            return attachment.engine.finish(runs)
        reporter.note("attach", f"run {record.run_id} had already ended as {record.verdict}; "
                                "its record is left as it was", "info")
        record.verdict = worst(r.final_verdict() for r in runs)
        record.exit_code = exit_code_for(record.verdict)
        reporter.run_finished(attachment.run, record, runs)
        return record
    finally:
        if own_fleet is not None:
            own_fleet.close()
        if own_store:
            store.close()


def _attach_step(book: Playbook, entry: dict) -> tuple[StepSpec, Step]:
    """The step that watched this launch (the recorded one, where the playbook still has it)
    and the step that follows the launch again."""
    index = entry.get("monitor_step")
    for spec in book.steps:
        if spec.index == index:
            step = STEP_KINDS[spec.kind]().reattach(entry)
            if step is not None:
                return spec, step
    loc = Loc(OptionSource("attach", None), ())
    spec = StepSpec(index=index if isinstance(index, int) else 0, kind=MonitorStep.kind,
                    name=MonitorStep.kind, params={}, loc=loc, params_loc=loc)
    return spec, MonitorStep().reattach(entry)


def _failed_run(target: Target, error) -> TargetRun:
    run = TargetRun(target, {})
    run.verdict = UNREACHABLE if isinstance(error, ConnectionProblem) else FAILED
    return run


def stop_recorded_run(ref: str, *, grace: float = 10.0, target_names=(),
                      inventory: Optional[str] = None, trust_on_first_use: bool = False,
                      store: Optional[RunStore] = None,
                      fleet: Optional[Fleet] = None) -> tuple[RunRecord, list[dict]]:
    """SIGTERM the run's process groups (SIGKILL after grace); record it when no live orch
    is watching it (a watching orch records the verdict itself)."""
    own_store, own_fleet = store is None, None
    store = store or RunStore()
    try:
        record = store.get(ref)
        if not _launched(record):
            return _settle_unlaunched(store, record, "stop"), []
        launches = _launched(record)
        if target_names:
            launches = {n: e for n, e in launches.items() if n in target_names}
        if not launches:
            raise OrchError(f"run {record.run_id} has no launched process to stop"
                            + (f" on {', '.join(target_names)}" if target_names else ""))
        if fleet is None:
            fleet = own_fleet = _open_fleet(record, inventory, trust_on_first_use)
        targets = [fleet.target(spec) for spec in fleet.inventory.resolve(list(launches))]
        results = fan_out(targets, lambda t: stop_run(t, launches[t.name]["run_dir"], grace)).rows()
        if record.verdict == RUNNING and not controller_alive(record) and \
                not any("error" in r for r in results):
            _record_killed(store, record, launches)
        return record, results
    finally:
        if own_fleet is not None:
            own_fleet.close()
        if own_store:
            store.close()


def _record_killed(store: RunStore, record: RunRecord, launches: dict) -> None:
    record.verdict = KILLED
    record.exit_code = exit_code_for(KILLED)
    record.ended_at = now_iso()
    finding = Finding(target=",".join(launches), signature=KILLED,
                      message="stopped with `orch stop` while no orch was watching it")
    store.add_findings(record.run_id, [finding])
    store.finish(record)
