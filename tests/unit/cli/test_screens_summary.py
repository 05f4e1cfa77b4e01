"""A step's own output on the run console: summarised, kept whole in the run's folder,
streamed with -v. The engine and the steps are the real ones on a fake host; the console
is the real ConsoleReporter printing into an 80-column rich console."""

from __future__ import annotations

import io
import json
import os
import stat

from orchestrator.ground import paths
from orchestrator.ground.console import make_console
from orchestrator.cli.screens import run as run_console
from orchestrator.cli.screens import steplog
from orchestrator.cli.screens.run import ConsoleReporter
from orchestrator.payloads import payload_source
from tests.support.step_fakes import RUN_ID, Call, Reply, harness

NOISY = """\
    name: t
    targets: [dev]
    steps:
      - name: noisy
        shell: [sh, -c, make]
      - name: after
        shell: [echo, done]
"""

LINES = [f"line {n} of the build" for n in range(1, 301)]


def console_run(tmp_path, *, verbose=False, exit_code=0, playbook=NOISY, lines=LINES, **options):
    h = harness(tmp_path, playbook)
    h.host.on_argv(["sh"], exit_code=exit_code, stdout=("\n".join(lines) + "\n").encode())
    h.host.on_argv(["echo"], stdout=b"done\n")
    out = io.StringIO()
    reporter = ConsoleReporter(make_console(file=out, width=80, force_terminal=False), live=False,
                               verbose=verbose, **options)
    h.engine.reporter = reporter
    record = h.record()
    return record, out.getvalue().splitlines()


def step_log(number=1, kind="shell", target="dev") -> str:
    return os.path.join(paths.run_dir(RUN_ID), "steps", f"{number}-{kind}-{target}.log")


def test_a_step_printing_300_lines_shows_a_handful_and_keeps_them_all(tmp_path):
    record, shown = console_run(tmp_path)
    assert record.verdict == "ok"
    noisy = [line for line in shown if "line " in line and "of the build" in line]
    assert noisy == []                                # none of the 300 on the console
    assert len(shown) < 15, shown                     # run header, steps, verdict, record
    path = step_log()
    assert any(f"output: 300 lines in {path}" in line for line in shown)
    with open(path) as handle:
        assert handle.read().splitlines() == LINES    # every line, in order
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # a short output is shown whole, where it belongs: before its step's result
    after = shown.index(next(line for line in shown if "2/2 shell after: changed" in line))
    assert shown[after - 1].strip() == "dev | done"


def test_a_failed_step_shows_its_last_lines_and_its_log(tmp_path):
    record, shown = console_run(tmp_path, exit_code=2)
    assert record.verdict == "failed"
    tail = [line.strip() for line in shown if "of the build" in line]
    assert tail == [f"dev | line {n} of the build" for n in range(276, 301)]
    assert any(f"the last {run_console.SHOWN_LINES} of 300 lines" in line for line in shown)
    assert any(f"output: 300 lines in {step_log()}" in line for line in shown)


def test_verbose_streams_every_line(tmp_path):
    _, shown = console_run(tmp_path, verbose=True)
    assert [line.strip() for line in shown if "of the build" in line] == \
        [f"dev | {line}" for line in LINES]
    with open(step_log()) as handle:                  # the log is kept as well
        assert len(handle.read().splitlines()) == 300


def test_not_on_a_terminal_a_long_step_says_how_far_it_got_now_and_then(tmp_path):
    seconds = iter(range(10_000))                     # a line a second: 300 s of output
    _, shown = console_run(tmp_path, clock=lambda: float(next(seconds)))
    notes = [line for line in shown if "lines so far" in line]
    assert len(notes) == 300 // run_console.NOTE_EVERY_S, notes
    assert "last: line" in notes[-1]


def test_the_log_is_bounded_head_and_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(steplog, "HEAD_BYTES", 1000)
    monkeypatch.setattr(steplog, "TAIL_BYTES", 500)
    log = steplog.StepLog(str(tmp_path / "steps" / "1-shell-dev.log"))
    for line in LINES:
        log.write(line)
    log.close()
    kept = (tmp_path / "steps" / "1-shell-dev.log").read_text().splitlines()
    marker = next(i for i, line in enumerate(kept) if line.startswith("[orch: "))
    head, tail = kept[:marker], kept[marker + 1:]
    assert head == LINES[:len(head)] and 900 < sum(len(line) + 1 for line in head) <= 1000
    assert tail == LINES[-len(tail):] and 400 < sum(len(line) + 1 for line in tail) <= 500
    assert kept[marker] == (f"[orch: {300 - len(head) - len(tail)} lines left out here: a step "
                            "log keeps its first 1000 bytes and its last 500 bytes]")
    assert log.lines == 300


def test_a_long_line_is_cut_in_the_log(tmp_path):
    log = steplog.StepLog(str(tmp_path / "1-shell-dev.log"))
    log.write("x" * (steplog.MAX_LINE + 10))
    log.close()
    assert (tmp_path / "1-shell-dev.log").read_text() == \
        "x" * steplog.MAX_LINE + " [orch: 10 more characters cut]\n"


def test_a_log_that_cannot_be_written_does_not_fail_the_step(tmp_path, monkeypatch):
    blocked = tmp_path / "data"
    blocked.write_text("a file where the data folder should be")
    monkeypatch.setenv("ORCH_DATA_DIR", str(blocked))
    record, shown = console_run(tmp_path)
    assert record.verdict == "ok"
    assert any("output not kept" in line for line in shown)


def test_step_log_names_are_safe_file_names():
    path = steplog.step_log_path("RUN", 3, "bootstrap", "../sb1:200")
    assert os.path.basename(path) == "3-bootstrap-.._sb1_200.log"
    assert os.path.dirname(path) == os.path.join(paths.run_dir("RUN"), "steps")


BOOTSTRAP = """\
    name: t
    targets: [dev]
    steps:
      - bootstrap: {packages: ["torch==2.13.0", "numpy<2"]}
"""
PIP = ([f"Collecting package-{n}==1.{n}" for n in range(37)]
       + [f"  Downloading package_{n}-1.{n}-py3-none-any.whl ({n}.5 MB)" for n in range(37)] * 7
       + ["Installing collected packages: " + ", ".join(f"package-{n}" for n in range(37)),
          "Successfully installed " + " ".join(f"package-{n}-1.{n}" for n in range(37))])


def pip_payload(host, action: str, result: dict, events=()):
    """The bootstrap payload's answer to one action (check, install)."""
    lines = [json.dumps(event) for event in [*events, {"event": "result", **result}]]
    source = payload_source("bootstrap")
    host.on(lambda argv, stdin: bool(stdin) and stdin.endswith(source)
            and Call(argv, stdin, {}).payload_args["action"] == action,
            Reply(stdout=("\n".join(lines) + "\n").encode()))


def test_a_bootstrap_shows_pip_in_a_few_lines_and_keeps_all_of_it(tmp_path):
    assert len(PIP) == 298
    h = harness(tmp_path, BOOTSTRAP)
    pip_payload(h.host, "check", {"up_to_date": False, "ensurepip": True})
    pip_payload(h.host, "install", {"changed": True, "freeze": ["torch==2.13.0"], "seconds": 3,
                                    "did": ["installed 37 packages"]},
                events=[{"event": "pip", "line": line} for line in PIP])
    out = io.StringIO()
    h.engine.reporter = ConsoleReporter(make_console(file=out, width=80, force_terminal=False),
                                        live=False)
    record = h.record()
    shown = out.getvalue().splitlines()
    assert record.verdict == "ok", shown
    assert len(shown) <= 12, shown
    assert "  dev: pip: collecting the packages and their dependencies" in shown
    assert "  dev: pip: installing 37 packages" in shown
    path = step_log(kind="bootstrap")
    assert f"    output: 298 lines in {path}" in shown
    with open(path) as handle:
        assert handle.read().splitlines() == PIP


def test_an_interrupted_step_keeps_its_log_to_the_last_line(tmp_path, monkeypatch):
    monkeypatch.setattr(steplog, "HEAD_BYTES", 100)   # the rest waits in the tail until closed
    h = harness(tmp_path, NOISY)
    reporter = ConsoleReporter(make_console(file=io.StringIO(), width=80), live=False)
    reporter.run_started(h.run, [])
    spec = h.run.playbook.steps[0]
    reporter.step_started("dev", spec)
    for line in LINES:
        reporter.step_output("dev", spec, line, "stdout")
    reporter.interrupted(h.run)                       # Ctrl-C: no step_finished comes
    with open(step_log()) as handle:
        assert handle.read().splitlines()[-1] == LINES[-1]


def test_on_a_terminal_the_running_step_and_the_monitor_share_one_live_display(tmp_path):
    import time
    h = harness(tmp_path, NOISY)
    screen = io.StringIO()
    reporter = ConsoleReporter(make_console(file=screen, width=80, force_terminal=True,
                                            color_system=None))
    assert reporter.live_enabled
    reporter.run_started(h.run, [])
    spec = h.run.playbook.steps[0]
    reporter.step_started("dev", spec)
    for line in LINES[:40]:
        reporter.step_output("dev", spec, line, "stdout")
    reporter.monitor_started("dev", "/runs/r1", None)   # a second live part: no second Live
    time.sleep(0.6)                                     # a few refreshes (4 a second)
    reporter.monitor_ended("dev")
    assert reporter._live is not None                   # the step still runs
    reporter.step_progress("dev", spec, "half way")
    time.sleep(0.4)
    from types import SimpleNamespace
    reporter.step_finished("dev", spec, SimpleNamespace(status="ok", message="done",
                                                        duration_s=1.0), SimpleNamespace(findings=[]))
    assert reporter._live is None
    drawn = screen.getvalue()
    assert "dev 1/2 shell noisy  (40 lines, " in drawn and "line 40 of the build" in drawn
    assert "waiting for the first line" in drawn        # the monitor's table, drawn with it
    assert "half way" in drawn
    assert "line 1 of the build" not in drawn           # lines are not printed, only the last
    assert f"output: 40 lines in {step_log()}" in drawn
