"""orch runs list|show|compare|pin|unpin and orch report, on synthetic runs."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from orchestrator.ground import paths
from orchestrator.cli.app import main
from orchestrator.runs.model import Finding, MetricPoint, RunRecord, StepResult, TargetInfo
from orchestrator.runs.store import RunStore
from tests.fixtures.synthetic import FREEZE, synthetic_run

A, B = "20261128-020000-aaaaaa", "20261129-020000-bbbbbb"


@pytest.fixture
def two_runs():
    with RunStore() as store:
        store.begin(synthetic_run(A, tok_s=6000, started_at="2026-11-28T02:00:00+00:00"))
        store.begin(synthetic_run(B, tok_s=4000, torch_version="2.13.1+cpu",
                                  freeze=[l for l in FREEZE if "torch" not in l] + ["torch==2.13.1+cpu"],
                                  started_at="2026-11-29T02:00:00+00:00", seed=2))


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_list(two_runs):
    result = invoke("runs", "list", "--json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.output)
    assert [i["run_id"] for i in items] == [B, A]
    assert items[0]["torch"] == {"sb1-200": "2.13.1+cpu"} and items[0]["total_tok_s"] > 10000
    assert [i["run_id"] for i in json.loads(invoke("runs", "list", "--last", "1", "--json").output)] == [B]
    assert json.loads(invoke("runs", "list", "--playbook", "nope.yaml", "--json").output) == []
    human = invoke("runs", "list")
    assert human.exit_code == 0 and "2.13.1+cpu" in human.output


def test_list_empty_store():
    result = invoke("runs", "list")
    assert result.exit_code == 0 and "no runs recorded yet" in result.output


def test_show(two_runs):
    data = json.loads(invoke("runs", "show", "last", "--json").output)
    assert data["run_id"] == B and "metrics" not in data and data["metric_points"] > 0
    assert data["throughput"]["source"] == "metrics"
    with_metrics = json.loads(invoke("runs", "show", B[:12], "--json", "--metrics").output)
    assert len(with_metrics["metrics"]) == data["metric_points"]
    human = invoke("runs", "show", "last")
    assert human.exit_code == 0 and "verdict ok" in human.output and "bootstrap" in human.output


def test_show_names_the_folder_of_the_step_logs(two_runs):
    assert "step output" not in invoke("runs", "show", B).output
    folder = os.path.join(paths.run_dir(B), "steps")
    os.makedirs(folder)
    assert f"step output {folder}" in invoke("runs", "show", B).output


def test_show_unknown_run_is_a_sentence():
    result = invoke("runs", "show", "nope")
    assert result.exit_code == 1 and "no run 'nope'" in result.output
    assert "Traceback" not in result.output


def test_compare(two_runs):
    result = invoke("runs", "compare", "last~1", "last", "--json")
    assert result.exit_code == 20, result.output
    data = json.loads(result.output)
    assert data["base"] == A and data["new"] == B and data["regressed"]
    kinds = {c["kind"] for c in data["regressions"]}
    assert kinds == {"throughput", "torch-version"}
    assert data["targets"]["sb1-200"]["packages"]["changed"] == {"torch": ["2.13.0+cpu", "2.13.1+cpu"]}
    human = invoke("runs", "compare", A, B)
    assert "REGRESSION" in human.output and "torch 2.13.0+cpu -> 2.13.1+cpu" in human.output
    same = invoke("runs", "compare", A, A)
    assert same.exit_code == 0 and "no regression" in same.output
    loose = invoke("runs", "compare", A, B, "--threshold", "50%", "--json")
    assert {c["kind"] for c in json.loads(loose.output)["regressions"]} == {"torch-version"}


def test_pin_and_unpin(two_runs):
    assert invoke("runs", "pin", "last").exit_code == 0
    items = json.loads(invoke("runs", "list", "--json").output)
    assert [i["pinned"] for i in items] == [True, False]
    assert json.loads(invoke("runs", "show", B, "--json").output)["pinned"] is True
    result = invoke("runs", "unpin", "playbooks/dflash.yaml")
    assert result.exit_code == 0 and "unpinned" in result.output


def test_report_files_and_stdout(two_runs, tmp_path):
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    result = invoke("report", "last", "--html", str(html), "--md", str(md))
    assert result.exit_code == 0, result.output
    assert "<polyline" in html.read_text() and A in html.read_text()    # compared with A
    assert md.read_text().startswith(f"## orch run `{B}`")
    out = invoke("report", B, "--md", "-", "--no-baseline")
    assert out.output.startswith(f"## orch run `{B}`") and "Compared with" not in out.output
    default = invoke("report")
    assert default.exit_code == 0
    written = default.output.split()
    assert written == [os.path.join(paths.run_dir(B), "report.html"),
                       os.path.join(paths.run_dir(B), "report.md")]
    assert all(os.path.exists(p) for p in written)


def test_help_has_examples():
    for args in (["runs", "--help"], ["runs", "list", "--help"], ["runs", "compare", "--help"],
                 ["report", "--help"], ["nightly", "--help"], ["schedule", "install", "--help"]):
        result = invoke(*args)
        assert result.exit_code == 0 and "Example" in result.output, args


# ------------------------------------------------------------------ store round trip, any text
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
number = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=text, message=text, freeze=st.lists(text, max_size=4), var=text, loss=number,
       tok=number, drafter=st.integers(0, 1000), step=st.integers(0, 2**40))
def test_any_text_round_trips(tmp_path, name, message, freeze, var, loss, tok, drafter, step):
    record = RunRecord(run_id="r", playbook=name or "p", playbook_sha256="", name=name,
                       vars={var: [var, 1, None]}, verdict="ok",
                       targets=[TargetInfo(name or "t", name, None, name, None, freeze)],
                       steps=[StepResult(name, name, name, "ok", message=message, data={var: var})],
                       metrics=[MetricPoint(name, drafter, step, loss=loss, tok_s=tok)],
                       findings=[Finding(name, name, message, message, [message, var])])
    path = tmp_path / f"{abs(hash((name, message, var))) % 10**9}.sqlite"
    with RunStore(str(path)) as store:
        store.begin(record)
        assert store.get("r") == record
    path.unlink()


def test_compare_uses_the_nightly_config_threshold(two_runs):
    with open(os.path.join(paths.data_dir(), "nightly.yaml"), "w") as handle:
        handle.write("threshold: 60%\n")
    data = json.loads(invoke("runs", "compare", A, B, "--json").output)
    assert data["threshold"] == 0.6 and {c["kind"] for c in data["regressions"]} == {"torch-version"}


# ------------------------------------------------------------------ 80 columns
@pytest.fixture
def terminal_80(monkeypatch):
    """stdout as an 80-column terminal (rich squeezes, cuts with … and wraps a table to fit)."""
    import io
    from orchestrator.ground import console
    screen = io.StringIO()
    monkeypatch.setattr(console, "out", console.make_console(file=screen, width=80,
                                                             force_terminal=True, color_system=None))
    return screen


def table_rows(text: str, header: str) -> list[str]:
    """The lines of the table whose header line starts with `header`, up to its end."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(header)) + 2
    end = next((i for i in range(start, len(lines)) if "│" not in lines[i]), len(lines))
    return lines[start:end]


def test_tables_fit_80_columns_without_a_wrapped_or_cut_cell(terminal_80):
    long_message = ("created the venv /root/venv with /usr/bin/python3 -m venv; installed "
                    "torch==2.13.0+cpu from the pushed wheelhouse /var/lib/orch/wheelhouse "
                    "(--no-index) (24.1 s)")
    with RunStore() as store:
        store.begin(synthetic_run(A, tok_s=6000, started_at="2026-11-28T02:00:00+00:00",
                                  playbook="playbooks/dflash-sandbox.yaml"))
        new = synthetic_run(B, tok_s=4000, verdict="fx-race", fx_tls_state="vulnerable",
                            torch_version="2.13.1+cpu", started_at="2026-11-29T02:00:00+00:00",
                            playbook="playbooks/specforge-dflash-legacy.yaml", seed=2,
                            findings=[Finding("sb1-200", "fx-race", "the FX race", "fx-threads"),
                                      Finding("sb1-200", "traceback", "a traceback", "")])
        new.steps[1].message = long_message
        store.begin(new)
    assert invoke("runs", "list").exit_code == 0
    listed = terminal_80.getvalue()
    rows = table_rows(listed, "RUN")
    assert [row.split()[0] for row in rows] == [B, A]           # a line a run
    assert "fx-race" in rows[0] and "vulnerable" in rows[0] and "…" not in listed
    terminal_80.seek(0), terminal_80.truncate()
    result = invoke("runs", "list")
    assert "left out at this width" in result.output            # said on stderr
    terminal_80.seek(0), terminal_80.truncate()
    assert invoke("runs", "show", "last").exit_code == 0
    shown = terminal_80.getvalue()
    steps = table_rows(shown, "#")
    assert len(steps) == len(new.steps) and "…" not in shown
    assert f"  2 bootstrap venv: {long_message}" in shown.splitlines()   # below the table
    terminal_80.seek(0), terminal_80.truncate()
    invoke("runs", "compare", A, B)
    compared = terminal_80.getvalue()
    assert len(table_rows(compared, "TARGET")) == 1 and "…" not in compared
    for text in (listed, shown, compared):
        assert all(len(line) <= 80 for line in text.splitlines() if "│" in line or "━" in line)
