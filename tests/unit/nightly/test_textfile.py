"""orch nightly's Prometheus textfile (nightly/textfile.py), read back with prometheus-client's
own text-format parser: the names, labels and values node_exporter's textfile collector gets."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cli.app import main
from orchestrator.ground.errors import ConfigError, ExitCode
from orchestrator.nightly import rerun as nightly_mod
from orchestrator.nightly import textfile
from orchestrator.nightly.rerun import NightlyConfig, load_config, nightly, playbook_key
from orchestrator.runs.store import RunStore
from tests.support.nightly import fake_runner, run_numbers_from_one, seed_history  # noqa: F401

QUIET = [1.01, 0.99, 1.008, 0.992, 1.0, 1.012, 0.988, 1.004]


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "dflash.yaml"
    path.write_text("name: dflash\n")
    return str(path)


def lasted(record, seconds: int):
    """RECORD, its end SECONDS after its start (in the store too)."""
    start = datetime.fromisoformat(record.started_at)
    record.ended_at = (start + timedelta(seconds=seconds)).isoformat()
    with RunStore() as store:
        store.finish(record)
    return record


def parse(path: str) -> dict:
    """{(name, frozenset(labels)): value} of every sample in the file."""
    with open(path, encoding="utf-8") as handle:
        families = list(text_string_to_metric_families(handle.read()))
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def value(samples: dict, name: str, **labels):
    return samples[(name, frozenset(labels.items()))]


def test_a_suspected_night_in_the_textfile(playbook, tmp_path):
    seed_history(playbook, QUIET)
    prom = tmp_path / "textfile"
    prom.mkdir()
    run = fake_runner(tok_s=6000 * 0.95)
    outcome = nightly(playbook, targets=[], extra_vars={}, run=lambda *a, **kw: lasted(run(*a, **kw), 75),
                      config=NightlyConfig(prometheus_dir=str(prom), repeat=2))
    key = playbook_key(playbook)
    assert outcome.textfile == str(prom / f"orch_nightly_{key.replace('-', '_')}.prom")
    assert os.listdir(prom) == [os.path.basename(outcome.textfile)]      # no temporary left
    assert stat.S_IMODE(os.stat(outcome.textfile).st_mode) == 0o644      # node_exporter's user reads it
    got = parse(outcome.textfile)
    assert value(got, "orch_nightly_status", playbook=key, status="suspected") == 1
    assert value(got, "orch_nightly_status", playbook=key, status="ok") == 0
    assert value(got, "orch_nightly_status", playbook=key, status="regression") == 0
    assert value(got, "orch_nightly_exit_code", playbook=key) == 0
    assert value(got, "orch_nightly_runs", playbook=key) == 2
    assert value(got, "orch_nightly_duration_seconds", playbook=key) == 150      # 2 x 75 s
    total = next(m for m in outcome.judgement.metrics if m.metric == "total")
    assert value(got, "orch_nightly_throughput_tokens_per_second", playbook=key,
                 metric="total") == pytest.approx(total.tonight)
    assert value(got, "orch_nightly_throughput_median_tokens_per_second", playbook=key,
                 metric="total") == pytest.approx(total.centre)
    assert value(got, "orch_nightly_throughput_z", playbook=key, metric="total") == pytest.approx(total.z)
    assert value(got, "orch_nightly_throughput_p", playbook=key, metric="total") == pytest.approx(total.p)
    assert value(got, "orch_nightly_throughput_noise_ratio", playbook=key,
                 metric="d1") == pytest.approx(next(m.noise_pct for m in outcome.judgement.metrics
                                                    if m.metric == "d1"))
    assert value(got, "orch_nightly_throughput_status", playbook=key, metric="total",
                 status="suspected") == 1
    assert value(got, "orch_nightly_throughput_status", playbook=key, metric="total",
                 status="regression") == 0
    assert value(got, "orch_nightly_end_timestamp_seconds", playbook=key) > 1.7e9


def test_insufficient_data_leaves_the_window_numbers_out(playbook, tmp_path):
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(),
                      config=NightlyConfig(prometheus_dir=str(tmp_path)))
    got = parse(outcome.textfile)
    key = playbook_key(playbook)
    assert value(got, "orch_nightly_throughput_tokens_per_second", playbook=key, metric="total") > 0
    assert value(got, "orch_nightly_throughput_status", playbook=key, metric="total",
                 status="insufficient data") == 1
    names = {name for name, _ in got}
    assert not names & {"orch_nightly_throughput_z", "orch_nightly_throughput_p",
                        "orch_nightly_throughput_median_tokens_per_second"}


def test_prometheus_dir_from_the_cli_and_the_config_and_a_missing_one(playbook, tmp_path, monkeypatch):
    monkeypatch.setattr(nightly_mod, "run_playbook", fake_runner())
    result = CliRunner().invoke(main, ["nightly", playbook, "--prometheus-dir", str(tmp_path),
                                       "--notify-on", "never"])
    assert result.exit_code == 0, result.output
    assert f"metrics: {tmp_path}/orch_nightly_" in result.stdout
    result = CliRunner().invoke(main, ["nightly", playbook, "--prometheus-dir", str(tmp_path / "no")])
    assert result.exit_code == ExitCode.USAGE and "is not a directory" in result.output
    (tmp_path / "prom").mkdir()
    config = tmp_path / "nightly.yaml"
    config.write_text("prometheus_dir: prom\n")
    assert load_config(str(config)).prometheus_dir == str(tmp_path / "prom")
    config.write_text("prometheus_dir: [a]\n")
    with pytest.raises(ConfigError, match="expected a directory"):
        load_config(str(config))


def test_a_directory_that_cannot_be_written_is_a_warning_not_a_failed_night(playbook, tmp_path, capsys):
    # Gone since the config was read (root writes anywhere: a missing folder stands for it).
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(),
                      config=NightlyConfig(prometheus_dir=str(tmp_path / "gone")))
    assert outcome.exit_code == 0 and outcome.textfile is None
    assert "could not write the Prometheus textfile" in capsys.readouterr().err


def test_the_file_is_replaced_whole_each_night(playbook, tmp_path):
    (tmp_path / "prom").mkdir()
    config = NightlyConfig(prometheus_dir=str(tmp_path / "prom"))
    first = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(), config=config)
    second = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(drafters=2), config=config)
    assert first.textfile == second.textfile and len(os.listdir(tmp_path / "prom")) == 1
    metrics = {dict(labels).get("metric") for name, labels in parse(second.textfile)
               if name == "orch_nightly_throughput_tokens_per_second"}
    assert metrics == {"total", "d0", "d1"}           # last night's d2 is gone with its file
    assert textfile.textfile_path("/x", "a-b") == "/x/orch_nightly_a_b.prom"


def test_a_link_planted_at_a_guessable_temporary_name_is_never_written_through(playbook, tmp_path,
                                                                              monkeypatch):
    """prometheus-client's write_to_textfile opened PATH.PID.THREAD with a plain open: a link
    another account planted there (the folder is node_exporter's, often shared) received the
    night's text, as orch's user, and was then renamed into place."""
    import threading
    prom, victim = tmp_path / "prom", tmp_path / "victim"
    prom.mkdir()
    victim.write_text("untouched\n")
    path = textfile.textfile_path(str(prom), playbook_key(playbook))
    planted = f"{path}.{os.getpid()}.{threading.current_thread().ident}"
    os.symlink(victim, planted)

    def no_umask(_mask):
        raise AssertionError("the process's umask changed (every thread's files with it)")
    monkeypatch.setattr(os, "umask", no_umask)
    written = textfile.write(str(prom), playbook_key(playbook),
                             {"status": "ok", "exit_code": 0, "runs": [1]})
    assert victim.read_text() == "untouched\n"
    assert written == path and not os.path.islink(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert value(parse(path), "orch_nightly_exit_code", playbook=playbook_key(playbook)) == 0
    assert sorted(os.listdir(prom)) == sorted([os.path.basename(path), os.path.basename(planted)])
