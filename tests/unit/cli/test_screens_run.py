"""orch's messages print their text as it is: a SHA-256 fingerprint contains ":CD:", ":AB:"...,
which rich would otherwise turn into emoji (":cd:" is a disc), and a path may hold "[...]"."""

from __future__ import annotations

from orchestrator.ground import console
from orchestrator.cli.screens.run import ConsoleReporter

FINGERPRINT = "D9:49:1D:B8:CD:B8:E1:A2:AB:CD:OK:ID:5E:C6:EF"


def test_errors_warnings_and_info_keep_colon_words(capsys):
    console.error(f"its SHA-256 fingerprint is {FINGERPRINT}")
    console.warn(f"pin {FINGERPRINT} in [api]")
    console.info(f"fingerprint {FINGERPRINT} :smile:")
    err = capsys.readouterr().err
    assert f"its SHA-256 fingerprint is {FINGERPRINT}\n" in err
    assert f"pin {FINGERPRINT} in [api]\n" in err
    assert f"fingerprint {FINGERPRINT} :smile:\n" in err


def test_tables_keep_colon_words(capsys):
    console.table(["HOST", "FINGERPRINT"], [["sb1", FINGERPRINT]])
    assert FINGERPRINT in capsys.readouterr().out


def test_the_run_console_keeps_colon_words(capsys):
    reporter = ConsoleReporter()
    reporter.out.print(f"a line with {FINGERPRINT}")
    assert FINGERPRINT in capsys.readouterr().out
