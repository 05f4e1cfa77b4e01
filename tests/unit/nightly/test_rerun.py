"""orch nightly without a real playbook run: the runner is replaced by one that records a
synthetic run. Lock, baseline choice, reports, exit codes, notifications, redaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from orchestrator.ground import paths
from orchestrator.cli.app import main
from orchestrator.ground.errors import ConfigError, ExitCode
from orchestrator.nightly import rerun as nightly_mod
from orchestrator.nightly.rerun import (NightlyConfig, NightlyLock, NightlyLocked, NotifyConfig,
                                       load_config, nightly, parse_threshold, redact_url)
from orchestrator.runs.store import RunStore
from tests.fixtures.synthetic import synthetic_run
from tests.support.nightly import Hook, RUNS, fake_runner, playbook, seed_baseline, seed_history, webhook  # noqa: F401 (fixtures among them)


def test_first_nightly_ok_writes_reports(playbook):
    run = fake_runner()
    outcome = nightly(playbook, targets=["sb1-200"], extra_vars={}, run=run)
    assert outcome.exit_code == 0 and outcome.status == "ok" and outcome.baseline is None
    assert run.calls == [{"targets": ["sb1-200"], "extra_vars": {}}]
    folder = paths.run_dir(outcome.record.run_id)
    assert sorted(os.listdir(folder)) == ["nightly.json", "report.html", "report.md"]
    summary = json.load(open(os.path.join(folder, "nightly.json")))
    assert summary["status"] == "ok" and summary["report_html"].endswith("report.html")


def test_regression_against_the_last_ok_run(playbook):
    seed_baseline(playbook, tok_s=6000)
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=4000))
    assert outcome.baseline.run_id == "20261128-020000-base00"
    assert outcome.exit_code == ExitCode.REGRESSION and outcome.status == "regression"
    assert "total throughput fell" in outcome.summary()["text"]


def test_threshold_from_config(playbook):
    seed_baseline(playbook, tok_s=6000)
    config = NightlyConfig(threshold=0.5)
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=4000), config=config)
    assert outcome.exit_code == 0


def test_pinned_baseline_wins(playbook):
    seed_baseline(playbook, tok_s=4000)
    with RunStore() as store:
        store.begin(synthetic_run("20261128-030000-newer0", playbook=playbook, tok_s=9000,
                                  started_at="2026-11-28T03:00:00+00:00"))
    assert nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=4000)).exit_code == 20
    with RunStore() as store:
        store.pin("20261128-020000-base00")
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=4000))
    assert outcome.baseline.run_id == "20261128-020000-base00" and outcome.exit_code == 0


@pytest.mark.parametrize("verdict,code", [("fx-race", 10), ("traceback", 10), ("hang", 11),
                                          ("degraded", 12), ("unreachable", 13), ("killed", 10)])
def test_the_runs_own_verdict_code_wins(playbook, verdict, code):
    seed_baseline(playbook)
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(verdict=verdict))
    assert outcome.exit_code == code and outcome.status == verdict


def test_lock_excludes_a_second_nightly_and_is_released(playbook):
    with NightlyLock(playbook):
        with pytest.raises(NightlyLocked) as caught:
            nightly(playbook, targets=[], extra_vars={}, run=fake_runner())
        assert caught.value.exit_code == ExitCode.LOCKED
        assert f"pid {os.getpid()}" in str(caught.value)
    assert nightly(playbook, targets=[], extra_vars={}, run=fake_runner()).exit_code == 0


def test_locks_are_per_playbook(tmp_path, playbook):
    other = tmp_path / "sub" / "dflash.yaml"      # same name, other folder: another lock
    other.parent.mkdir()
    other.write_text("name: x\n")
    with NightlyLock(playbook):
        with NightlyLock(str(other)):
            pass


CONCURRENT = textwrap.dedent("""
    import sys, time
    from orchestrator.nightly import rerun as n
    from tests.fixtures.synthetic import synthetic_run
    from orchestrator.runs.store import RunStore
    def slow_run(playbook, *, targets, extra_vars, **options):
        time.sleep(3)
        record = synthetic_run(sys.argv[2], playbook=playbook)
        with RunStore() as s:
            s.begin(record)
        return record
    n.run_playbook = slow_run
    from orchestrator.cli.app import main
    main(["nightly", sys.argv[1]], prog_name="orch")
""")


def test_two_nightly_processes_at_once_exactly_one_runs(playbook):
    """Two real `orch nightly` processes (the runner is a 3 s stand-in): one runs, one exits 21."""
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, playbook, f"run-{i}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, ExitCode.LOCKED], results
    loser = next(r for r in results if r[0] == ExitCode.LOCKED)
    assert "another orch nightly" in loser[2] and "is running" in loser[2]
    with RunStore() as store:
        assert len(store.list()) == 1
    assert time.monotonic() - started < 60


def test_lock_is_released_when_the_holder_is_killed(playbook):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from orchestrator.nightly.rerun import NightlyLock
        lock = NightlyLock({playbook!r}).acquire()
        print("locked", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(NightlyLocked):
        NightlyLock(playbook).acquire()
    holder.kill()
    holder.wait()
    NightlyLock(playbook).acquire().release()          # kill -9 left no stale lock


def test_webhook_and_command_notifications(playbook, webhook, tmp_path):
    out = tmp_path / "notified.json"
    argv = [sys.executable, "-c",
            "import json, os, sys; d = json.load(sys.stdin); "
            "d['env'] = os.environ['ORCH_STATUS']; json.dump(d, open(sys.argv[1], 'w'))", str(out)]
    seed_baseline(playbook, tok_s=6000)
    config = NightlyConfig(notify=NotifyConfig(webhooks=[webhook + "/hooks/T0/SECRET-TOKEN"],
                                               commands=[argv]))
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=3000), config=config)
    assert [n["ok"] for n in outcome.notified] == [True, True]
    path, ctype, body = Hook.received[0]
    assert path == "/hooks/T0/SECRET-TOKEN" and ctype == "application/json"
    assert body["status"] == "regression" and body["exit_code"] == 20 and body["regressions"]
    assert body["text"].startswith("orch nightly dflash.yaml: REGRESSION")
    assert json.loads(out.read_text())["env"] == "regression"
    assert all("SECRET" not in n["to"] for n in outcome.notified)


def test_failed_notification_warns_without_the_secret(playbook, webhook, capsys):
    Hook.status = 500
    config = NightlyConfig(notify=NotifyConfig(
        webhooks=[webhook + "/x?token=SECRET-TOKEN", "http://user:SECRET-PW@127.0.0.1:9/h"],
        commands=[["/nonexistent/notifier", "--token", "SECRET-ARG"]]))
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(), config=config)
    assert outcome.exit_code == 0                           # notification trouble is not the run's
    assert [n["ok"] for n in outcome.notified] == [False, False, False]
    err = capsys.readouterr().err
    assert "notification to" in err and "SECRET" not in err
    assert "SECRET" not in json.dumps(outcome.notified)


def test_notify_when_problems_only(playbook, webhook):
    config = NightlyConfig(notify=NotifyConfig(webhooks=[webhook], when="problems"))
    nightly(playbook, targets=[], extra_vars={}, run=fake_runner(), config=config)
    assert Hook.received == []
    nightly(playbook, targets=[], extra_vars={}, run=fake_runner(verdict="hang"), config=config)
    assert [b["status"] for _, _, b in Hook.received] == ["hang"]


@pytest.mark.parametrize("url,shown", [
    ("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com/…"),
    ("https://user:pw@ntfy.example:8443/topic?auth=SECRET", "https://ntfy.example:8443/…"),
    ("http://host.example", "http://host.example"),
    ("not a url", "<webhook>"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


# ------------------------------------------------------------------ config and CLI
def test_config_file(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
    assert load_config().notify.webhooks == []             # no file: defaults
    (tmp_path / "data" / "nightly.yaml").write_text(textwrap.dedent("""
        threshold: 5%
        notify:
          when: problems
          webhook: https://hooks.example.com/SECRET
          command: [notify-send, "orch nightly"]
    """))
    config = load_config()
    assert config.threshold == 0.05 and config.notify.when == "problems"
    assert config.notify.commands == [["notify-send", "orch nightly"]]
    for bad, message in [("notify: {command: 'notify-send x'}", "argv list"),
                         ("notify: {webhook: 'ftp://x/SECRET'}", "not an http"),
                         ("thresold: 1", "unknown key"), ("threshold: 150", "between"),
                         ("notify: {when: sometimes}", "when must be")]:
        (tmp_path / "data" / "nightly.yaml").write_text(bad + "\n")
        with pytest.raises(ConfigError, match=message) as caught:
            load_config()
        assert "SECRET" not in str(caught.value)


@pytest.mark.parametrize("text,value", [("0.1", 0.1), ("10%", 0.1), ("10", 0.1), ("0", 0.0)])
def test_parse_threshold(text, value):
    assert parse_threshold(text) == pytest.approx(value)


def test_cli_nightly_json_and_exit_code(playbook, monkeypatch):
    seed_baseline(playbook, tok_s=6000)
    runner = fake_runner(tok_s=3000)
    monkeypatch.setattr(nightly_mod, "run_playbook", runner)
    result = CliRunner().invoke(main, ["nightly", playbook, "-t", "sb1-200", "-e", "slow_ms=40",
                                       "--json", "--notify-on", "never"])
    assert result.exit_code == 20, result.output
    data = json.loads(result.output)
    assert data["status"] == "regression" and data["baseline"] == "20261128-020000-base00"
    assert runner.calls == [{"targets": ["sb1-200"], "extra_vars": {"slow_ms": 40}}]
    bad = CliRunner().invoke(main, ["nightly", playbook, "-e", "novalue"])
    assert bad.exit_code == 2 and "expected NAME=VALUE" in bad.output


def test_a_run_that_cannot_start_is_notified_and_keeps_its_code(playbook, webhook):
    def broken(playbook, **kw):
        raise ConfigError(f"{playbook}:3:1: unknown step kind 'lanuch'")
    config = NightlyConfig(notify=NotifyConfig(webhooks=[webhook]))
    with pytest.raises(ConfigError):
        nightly(playbook, targets=[], extra_vars={}, run=broken, config=config)
    (_, _, body), = Hook.received
    assert body["status"] == "error" and body["exit_code"] == 2 and "lanuch" in body["text"]
    NightlyLock(playbook).acquire().release()            # and the lock was released


def test_usage_error_recorded_by_the_runner_exits_2(playbook):
    def usage(playbook, **kw):
        record = synthetic_run("20261129-000000-usage0", playbook=playbook, verdict="failed")
        record.exit_code = ExitCode.USAGE
        with RunStore() as store:
            store.begin(record)
        return record
    assert nightly(playbook, targets=[], extra_vars={}, run=usage).exit_code == ExitCode.USAGE


def test_a_quiet_night_within_8_percent_noise_is_ok_not_a_regression(playbook):
    # The last run was 8 % fast; tonight is 16 % below it but inside the nights' own spread.
    seed_history(playbook, [1.02, 0.97, 1.03, 0.90, 1.10, 1.00, 0.95, 1.05, 0.93, 1.08])
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=6000 * 0.91))
    assert outcome.exit_code == 0 and outcome.status == "ok"
    summary = outcome.summary()
    assert summary["noise"]["status"] == "ok" and summary["regressions"] == []
    total = next(m for m in summary["noise"]["metrics"] if m["metric"] == "total")
    assert total["window_runs"] == 10 and total["noise_pct"] > 0.05


def test_a_5_percent_drop_is_suspected_then_confirmed_with_exit_code_20(playbook, webhook):
    seed_history(playbook, [1.01, 0.99, 1.008, 0.992, 1.0, 1.012, 0.988, 1.004])   # ~1.3 % noise
    config = NightlyConfig(notify=NotifyConfig(webhooks=[webhook]))
    first = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=6000 * 0.95),
                    config=config)
    assert first.exit_code == 0 and first.status == "suspected"
    body = Hook.received[-1][2]
    assert body["status"] == "suspected" and body["suspected"]
    assert body["text"].startswith("orch nightly dflash.yaml: SUSPECTED")
    assert "confirmed if the next night is slow too" in body["text"]
    report = open(first.reports["md"]).read()
    assert "measured noise: suspected" in report
    second = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=6000 * 0.95),
                     config=config)
    assert second.exit_code == ExitCode.REGRESSION and second.status == "regression"
    assert "second slow night in a row" in Hook.received[-1][2]["text"]


def test_the_environment_diff_names_a_changed_package_and_a_reverted_patch(playbook):
    seed_baseline(playbook)
    freeze = ["filelock==3.16.1", "jinja2==3.1.4", "numpy==2.2.0", "sympy==1.13.3",
              "torch==2.13.0+cpu", "typing_extensions==4.12.2", "triton==3.4.0"]
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(
        freeze=freeze, states_seen=["vulnerable", "patched"]))
    lines = outcome.summary()["environment"]
    assert lines == ["sb1-200: fx-tls patch patched -> vulnerable -> patched",
                     "sb1-200: numpy 2.1.3 -> 2.2.0", "sb1-200: + triton 3.4.0"]
    report = open(outcome.reports["md"]).read()
    assert "What changed since the baseline" in report and "numpy 2.1.3 -> 2.2.0" in report


def test_cli_nightly_says_a_suspected_drop_and_what_changed_and_exits_0(playbook, monkeypatch):
    seed_history(playbook, [1.01, 0.99, 1.008, 0.992, 1.0, 1.012, 0.988, 1.004])
    freeze = ["filelock==3.16.1", "jinja2==3.1.4", "numpy==2.2.0", "sympy==1.13.3",
              "torch==2.13.0+cpu", "typing_extensions==4.12.2"]
    monkeypatch.setattr(nightly_mod, "run_playbook", fake_runner(tok_s=6000 * 0.95, freeze=freeze))
    result = CliRunner().invoke(main, ["nightly", playbook, "--notify-on", "never"])
    assert result.exit_code == 0, result.output
    assert "SUSPECTED" in result.output and "suspected: total throughput: slower" in result.output
    assert "changed: sb1-200: numpy 2.1.3 -> 2.2.0" in result.output


def test_repeat_runs_the_playbook_n_times_and_judges_the_night_on_all_of_them(playbook):
    seed_history(playbook, [1.01, 0.99, 1.008, 0.992, 1.0, 1.012])
    run = fake_runner(tok_s=6000 * 0.95)
    outcome = nightly(playbook, targets=[], extra_vars={}, run=run,
                      config=NightlyConfig(repeat=3))
    assert len(run.calls) == 3 and len(outcome.night) == 3
    summary = outcome.summary()
    assert summary["runs"] == [r.run_id for r in outcome.night]
    assert summary["run_id"] == outcome.night[-1].run_id
    with RunStore() as store:
        marks = [store.get(r.run_id).summary["nightly"] for r in outcome.night]
    first = outcome.night[0].run_id
    assert marks == [{"night": first, "repeat": n, "repeats": 3} for n in (1, 2, 3)]
    total = next(m for m in summary["noise"]["metrics"] if m["metric"] == "total")
    assert total["repeats"] == 3 and total["window_runs"] == 6
    assert total["samples"] == 3 * len(noise_samples(outcome.night[0]))
    assert "3 runs (last " in summary["text"] and "the mean of 3 runs" in summary["text"]
    # The next night sees tonight's three runs as one night of its window, not three.
    again = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(), config=NightlyConfig())
    total = next(m for m in again.summary()["noise"]["metrics"] if m["metric"] == "total")
    assert total["window_runs"] == 7 and total["repeats"] == 1


def noise_samples(record):
    from orchestrator.runs.noise import samples
    return samples(record)["total"]


def test_a_repeat_that_is_not_ok_ends_the_night_with_its_verdict(playbook):
    verdicts = iter(["ok", "hang", "ok"])
    calls = []

    def run(playbook, **kw):
        n = next(RUNS)
        calls.append(n)
        record = synthetic_run(f"20261129-{n:06d}-rept00", playbook=playbook, seed=n,
                               verdict=next(verdicts),
                               started_at=f"2026-11-29T{n // 60 % 24:02d}:{n % 60:02d}:00+00:00")
        with RunStore() as store:
            store.begin(record)
        return record
    outcome = nightly(playbook, targets=[], extra_vars={}, run=run, config=NightlyConfig(repeat=3))
    assert len(calls) == 2 and outcome.status == "hang" and outcome.exit_code == ExitCode.RUN_HANG


def test_repeat_from_the_cli_and_the_config_file_and_bad_values(playbook, tmp_path, monkeypatch):
    run = fake_runner()
    monkeypatch.setattr(nightly_mod, "run_playbook", run)
    result = CliRunner().invoke(main, ["nightly", playbook, "--repeat", "2", "--json",
                                       "--notify-on", "never"])
    assert result.exit_code == 0, result.output
    assert len(run.calls) == 2 and len(json.loads(result.stdout)["runs"]) == 2
    assert "nightly run 2 of 2" in result.stderr      # progress on stderr: stdout is the JSON
    config = tmp_path / "nightly.yaml"
    config.write_text("repeat: 4\n")
    assert load_config(str(config)).repeat == 4
    for bad in ("0", "21", "two", "2.5"):
        result = CliRunner().invoke(main, ["nightly", playbook, "--repeat", bad])
        assert result.exit_code == ExitCode.USAGE and "--repeat" in result.output, result.output
    config.write_text("repeat: true\n")
    with pytest.raises(ConfigError, match="repeat: True is not a whole number"):
        load_config(str(config))


def gpu_machine(driver="570.124.06", cuda="12.8", quota=8.0, memory_gib=64, gpus=2):
    """The machine payload's result for an H200 container (payloads/machine.py's keys)."""
    row = {"name": "NVIDIA H200", "driver": driver, "memory_total_mib": 143771.0,
           "clock_max_sm_mhz": 1980.0, "clock_max_memory_mhz": 3201.0, "power_limit_w": 700.0}
    return {"gpus": [{"index": i, **row} for i in range(gpus)], "driver": driver, "cuda": cuda,
            "cpu_count": 64, "cgroup": {"version": 2, "cpu_quota_cores": quota, "cpuset": None,
                                        "cpuset_cpus": None, "memory_limit_bytes": memory_gib << 30}}


def test_the_environment_diff_names_a_new_driver_cuda_and_smaller_container_limits(playbook):
    seed_baseline(playbook, machine=gpu_machine())
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(
        machine=gpu_machine(driver="575.51.03", cuda="12.9", quota=4.0, memory_gib=32, gpus=1)))
    assert outcome.summary()["environment"] == [
        "sb1-200: GPUs 2x NVIDIA H200 -> 1x NVIDIA H200",
        "sb1-200: driver 570.124.06 -> 575.51.03", "sb1-200: CUDA 12.8 -> 12.9",
        "sb1-200: CPU quota 8 cores -> 4 cores", "sb1-200: memory limit 64.0 GiB -> 32.0 GiB"]
    with RunStore() as store:                     # kept in the record, as the payload said it
        assert store.get(outcome.record.run_id).targets[0].machine["cuda"] == "12.9"
    assert "driver 570.124.06 -> 575.51.03" in open(outcome.reports["md"]).read()


def test_a_cpu_container_has_no_gpus_recorded_as_absent_and_no_change_without_facts(playbook):
    cpu = {"gpus": None, "driver": None, "cuda": None, "cpu_count": 2,
           "cgroup": {"version": 1, "cpu_quota_cores": None, "cpuset": "0-1", "cpuset_cpus": 2,
                      "memory_limit_bytes": None}}
    seed_baseline(playbook, machine=cpu)
    same = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(machine=cpu))
    assert same.summary()["environment"] == []
    moved = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(machine=gpu_machine(gpus=1)))
    lines = moved.summary()["environment"]
    assert "sb1-200: GPUs none -> 1x NVIDIA H200" in lines and "sb1-200: CUDA none -> 12.8" in lines
    unread = nightly(playbook, targets=[], extra_vars={}, run=fake_runner())   # no collect: {}
    assert not any("GPUs" in line or "CUDA" in line for line in unread.summary()["environment"])
