"""A run is compared with an earlier run of the same shape (targets, worker count, device
layout, the variables that change throughput), never with whatever ok run came last; the
choice says which run and why, or why none."""

from __future__ import annotations

import json

from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.runs.baseline import choose_baseline, run_shape, same_shape_nights
from orchestrator.nightly.rerun import nightly
from orchestrator.runs.store import RunStore
from tests.fixtures.synthetic import synthetic_run

PLAYBOOK = "playbooks/dflash.yaml"


def run(n, *, drafters=3, devices="5,6,7", target="sb1-200", tok_s=5400.0, extra=None, **kw):
    record = synthetic_run(f"20261130-0{n}0000-shape{n}", playbook=PLAYBOOK, drafters=drafters,
                           target=target, tok_s=tok_s, started_at=f"2026-11-30T0{n}:00:00+00:00", **kw)
    record.launch = {"targets": {target: {"cuda_visible_devices": devices}}}
    record.summary["monitor"] = {target: {"drafters_expected": drafters}}
    record.vars.update(extra or {})
    return record


def saved(*records):
    with RunStore() as store:
        for record in records:
            store.begin(record)
            store.finish(record)


def test_a_three_drafter_run_is_not_compared_with_a_two_drafter_run():
    three, two = run(1, drafters=3), run(2, drafters=2, tok_s=8000.0)
    new = run(3, drafters=3, tok_s=5300.0)
    saved(three, two, new)
    with RunStore() as store:
        choice = choose_baseline(store, new)
    assert choice.record.run_id == three.run_id
    assert choice.reason.startswith("the last ok run of the same shape (targets sb1-200; 3 workers; "
                                    "devices sb1-200=5,6,7; drafters=3, gpus=5,6,7)")
    assert f"not {two.run_id} (workers 2, this run 3; drafters 2, this run 3)" in choice.reason


def test_no_run_of_the_same_shape_is_said_so():
    saved(run(1, devices="0"), run(2, target="sb1-201"))
    new = run(3)
    saved(new)
    with RunStore() as store:
        choice = choose_baseline(store, new)
    assert choice.record is None
    assert choice.reason.startswith("no earlier ok run has this run's shape (targets sb1-200;")
    assert "devices sb1-200=0, this run sb1-200=5,6,7" in choice.reason
    assert "targets sb1-201, this run sb1-200" in choice.reason


def test_a_pinned_run_of_another_shape_is_skipped_and_said_so():
    pinned, same = run(1, drafters=2), run(2)
    new = run(3)
    saved(pinned, same, new)
    with RunStore() as store:
        store.pin(pinned.run_id)
        choice = choose_baseline(store, new)
        assert choice.record.run_id == same.run_id
        assert f"not the pinned run {pinned.run_id} (workers 2, this run 3" in choice.reason
        store.pin(same.run_id)
        assert choose_baseline(store, new).reason.startswith(f"the pinned run {same.run_id}, of the same shape")


def test_a_playbooks_shape_vars_make_its_trainer_flags_part_of_the_shape():
    serialized = run(1, extra={"extra_args": ["--serialize-compile"], "shape_vars": ["extra_args"]})
    uncompiled = run(2, extra={"extra_args": ["--uncompiled"], "shape_vars": ["extra_args"]}, tok_s=900.0)
    saved(serialized, uncompiled)
    new = run(3, extra={"extra_args": ["--serialize-compile"], "shape_vars": ["extra_args"]})
    with RunStore() as store:
        assert choose_baseline(store, new).record.run_id == serialized.run_id
    # without shape_vars, a trainer flag is the run's business (a planted slowdown is a regression)
    assert "extra_args" not in run_shape(run(4, extra={"extra_args": ["--slow-ms", "5"]}))["vars"]


def test_a_run_that_never_launched_is_still_compared():
    ok = run(1)
    saved(ok)
    failed = run(2, verdict="failed")
    failed.launch, failed.summary = {}, {}
    with RunStore() as store:
        assert choose_baseline(store, failed).record.run_id == ok.run_id


def test_report_and_nightly_say_which_baseline_and_why(tmp_path):
    saved(run(1, drafters=2))
    three = run(2)
    saved(three)
    result = CliRunner().invoke(main, ["report", three.run_id, "--md", "-"])
    assert result.exit_code == 0, result.output
    assert "No baseline: no earlier ok run has this run's shape" in result.output
    playbook = tmp_path / "dflash.yaml"
    playbook.write_text("name: dflash\n")

    def fake_run(path, **kw):
        record = run(3, drafters=2, tok_s=2000.0)
        record.playbook = path
        saved(record)
        return record

    base = run(1, drafters=2)
    base.run_id, base.playbook = "20261130-000000-base02", str(playbook)
    saved(base)
    outcome = nightly(str(playbook), targets=[], extra_vars={}, run=fake_run)
    summary = outcome.summary()
    assert summary["baseline"] == base.run_id
    assert summary["baseline_reason"].startswith("the last ok run of the same shape (targets sb1-200; 2 workers")
    assert "REGRESSION" in summary["text"]
    html = open(outcome.reports["html"]).read()
    assert "Why this run: the last ok run of the same shape" in html
    assert json.dumps(summary)


def test_same_shape_nights_are_the_newest_ok_runs_of_the_shape_before_the_run(tmp_path):
    with RunStore(str(tmp_path / "h.sqlite")) as store:
        for day in range(10, 16):
            store.begin(synthetic_run(f"202611{day}-020000-h00000", seed=day,
                                      started_at=f"2026-11-{day}T02:00:00+00:00"))
        store.begin(synthetic_run("20261113-030000-other0", drafters=2,
                                  started_at="2026-11-13T03:00:00+00:00"))
        store.begin(synthetic_run("20261114-030000-failed", verdict="hang",
                                  started_at="2026-11-14T03:00:00+00:00"))
        tonight = synthetic_run("20261115-020000-h00000", seed=15,
                                started_at="2026-11-15T02:00:00+00:00")
        found = same_shape_nights(store, [tonight], 3)
    assert [[r.run_id for r in night] for night in found] == [
        ["20261114-020000-h00000"], ["20261113-020000-h00000"], ["20261112-020000-h00000"]]
    assert all(r.metrics for night in found for r in night)     # with their series: the samples


def test_the_repeats_of_a_night_are_one_night_and_tonights_own_are_left_out(tmp_path):
    def repeat(run_id, night, n, hour):
        record = synthetic_run(run_id, seed=hour, started_at=f"2026-11-{run_id[6:8]}T{hour}:00:00+00:00")
        record.summary["nightly"] = {"night": night, "repeat": n, "repeats": 2}
        return record
    with RunStore(str(tmp_path / "h.sqlite")) as store:
        store.begin(synthetic_run("20261112-020000-single", started_at="2026-11-12T02:00:00+00:00"))
        for day in ("13", "14", "15"):
            first, second = f"202611{day}-020000-rep001", f"202611{day}-030000-rep002"
            store.begin(repeat(first, first, 1, "02"))
            store.begin(repeat(second, first, 2, "03"))
        tonight = [store.get("20261115-020000-rep001"), store.get("20261115-030000-rep002")]
        found = same_shape_nights(store, tonight, 2)
    assert [[r.run_id for r in night] for night in found] == [
        ["20261114-020000-rep001", "20261114-030000-rep002"],
        ["20261113-020000-rep001", "20261113-030000-rep002"]]           # with their series: the samples
