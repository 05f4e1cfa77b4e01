"""The HTML report in a real headless browser (Debian's chromium): it renders, the charts
(inline SVG polylines) and the verdict are in the rendered DOM, and a screenshot is drawn;
a nightly's report with its playbook's history plots the nights with the change point marked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from orchestrator.runs.model import Finding
from orchestrator.runs.report import write_reports
from orchestrator.runs import history
from tests.fixtures.synthetic import nights_drifting, nights_with_an_upgrade, synthetic_run


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed (it is in .ci/apt-packages.txt)")
    pytest.skip("chromium is not installed: apt-get install -y chromium")


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
            *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture
def report_file(tmp_path):
    base = synthetic_run("20261128-020000-aaaaaa", tok_s=6000)
    new = synthetic_run("20261129-020000-bbbbbb", tok_s=4200, states_seen=["drifted", "patched"],
                        findings=[Finding("sb1-200", "fx-race", "drafter=1 ERROR RuntimeError",
                                          evidence=["drafter=1 ERROR RuntimeError: boom"])])
    return write_reports(new, base, str(tmp_path / "run"))["html"]


def test_report_renders_in_headless_chromium(tmp_path, report_file):
    done = run_chromium(tmp_path, "--dump-dom", f"file://{report_file}")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # The DOM as the browser built it: both charts, one polyline per drafter in each.
    assert dom.count("<svg") == 2
    assert dom.count("<polyline") == 6
    assert 'data-verdict="ok"' in dom and ">OK</span>" in dom
    assert "fx-race" in dom and "orch patch fx-threads apply" in dom
    assert "patch drifted" in dom


def test_report_screenshot(tmp_path, report_file):
    shot = tmp_path / "report.png"
    done = run_chromium(tmp_path, "--window-size=1200,1800", f"--screenshot={shot}",
                        f"file://{report_file}")
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000   # a page, not a blank


def test_the_history_chart_with_its_change_point_renders_in_headless_chromium(tmp_path):
    records = nights_with_an_upgrade()
    nights = history.analyse_nights("playbooks/dflash.yaml", [[r] for r in records])
    page = write_reports(records[-1], records[-2], str(tmp_path / "run"), history=nights)["html"]
    done = run_chromium(tmp_path, "--dump-dom", f"file://{page}")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # the total's and the workers' history, then the run's two charts
    assert dom.count('class="chart chart-history') == 2 and dom.count("<svg") == 4
    assert dom.count('class="change-point drop"') >= 2          # the total's and a worker's
    assert "night 21: -6.0 % (-6.4 to -5.6), in effect" in dom
    assert "since 2026-11-21 (night 21): torch 2.13.0+cpu -&gt; 2.14.1; fx-tls re-applied" in dom
    shot = tmp_path / "history.png"
    done = run_chromium(tmp_path, "--window-size=1200,1400", f"--screenshot={shot}",
                        f"file://{page}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_trend_is_drawn_as_its_fitted_falling_line_in_headless_chromium(tmp_path):
    records = nights_drifting()
    nights = history.analyse_nights("playbooks/dflash.yaml", [[r] for r in records])
    page = write_reports(records[-1], records[-2], str(tmp_path / "run"), history=nights)["html"]
    done = run_chromium(tmp_path, "--dump-dom", f"file://{page}")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = re.findall(r'<line class="trend" x1="([\d.]+)" x2="([\d.]+)" y1="([\d.]+)" y2="([\d.]+)"',
                       done.stdout)
    assert len(lines) == 1, done.stdout[-3000:]
    x1, x2, y1, y2 = map(float, lines[0])
    assert x2 > x1 and y2 > y1             # falling: SVG's y grows downwards
    assert re.search(r"night \d+: falling, -\d+\.\d % over \d+ nights, in effect", done.stdout)
    shot = tmp_path / "trend.png"
    done = run_chromium(tmp_path, "--window-size=1200,1400", f"--screenshot={shot}",
                        f"file://{page}")
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_steps_long_message_is_wholly_visible_in_the_browser(tmp_path):
    """Laid out by the browser at 1000 px: the message's box is no wider than its text area
    (nothing hidden behind a horizontal scroll bar). The check is a script added to a copy of
    the report (the report itself has none), its answer in the title --dump-dom prints."""
    from orchestrator.runs.model import StepResult
    record = synthetic_run("20261129-020000-cccccc", verdict="failed")
    record.steps.append(StepResult("launch", "launch", "sb2-200", "failed", record.started_at, 1.0,
                                   "sb2-200: " + "the rendezvous at 10.88.1.200:41000 never formed; " * 20))
    page = tmp_path / "checked.html"
    html = open(write_reports(record, None, str(tmp_path / "run"))["html"]).read()
    probe = ("<script>const p = [...document.querySelectorAll('#failed-steps pre')].pop();"
             "document.title = p ? `${p.scrollWidth <= p.clientWidth} ${p.clientHeight}` : 'none';</script>")
    page.write_text(html.replace("</body>", probe + "</body>"))
    done = run_chromium(tmp_path, "--window-size=1000,1400", "--dump-dom", f"file://{page}")
    assert done.returncode == 0, done.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", done.stdout).group(1)
    fits, height = title.split()
    assert fits == "true" and int(height) > 40, title       # wrapped onto several lines
