"""Report rendering: HTML (self-contained, inline SVG charts, escaped) and Markdown."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from orchestrator.runs.model import Finding, RunRecord
from orchestrator.runs.report import render_html, render_markdown, write_reports
from orchestrator.runs.svg import line_chart, nice_ticks, sparkline
from tests.fixtures.synthetic import synthetic_run


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def parse(html: str) -> list[tuple[str, dict]]:
    parser = Tags()
    parser.feed(html)
    return parser.tags


def test_html_has_verdict_charts_and_no_external_assets():
    html = render_html(synthetic_run("b", tok_s=4000), synthetic_run("a", tok_s=6000))
    tags = parse(html)
    polylines = [a for t, a in tags if t == "polyline"]
    assert len(polylines) == 6                              # 3 drafters x (throughput, loss)
    assert {a["data-series"] for a in polylines} == {"d0", "d1", "d2"}
    assert sum(1 for t, a in tags if t == "svg") == 2
    assert any(t == "span" and a.get("data-verdict") == "ok" for t, a in tags)
    assert not any(t in ("script", "link", "img", "iframe") for t, _ in tags)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "regressions" in html and "total throughput fell" in html
    assert any(t == "span" and a.get("data-regressed") == "true" for t, a in tags)
    assert render_markdown(synthetic_run("b", tok_s=4000), synthetic_run("a", tok_s=6000)) \
        .startswith("## orch run `b`: **OK**, **REGRESSED** against `a`")
    assert "Comparison with the baseline" in html


def test_hostile_strings_are_escaped():
    evil = '<script>alert(1)</script>"&'
    record = synthetic_run("b", findings=[Finding("sb1-200", "traceback", evil, evil, [evil])])
    record.vars = {"x": evil}
    html = render_html(record)
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert not any(t == "script" for t, _ in parse(html))


def test_no_baseline_and_no_metrics_still_render():
    record = RunRecord(run_id="r", playbook="p.yaml", playbook_sha256="", name="",
                       verdict="unreachable")
    html = render_html(record)
    assert "no data recorded" in html and "No baseline" in html and "UNREACHABLE" in html
    md = render_markdown(record)
    assert "**UNREACHABLE**" in md and "(no metrics recorded)" in md


def test_finding_without_remediation_gets_the_known_one():
    record = synthetic_run("b", verdict="fx-race",
                           findings=[Finding("sb1-200", "fx-race", "drafter=1 ERROR RuntimeError")])
    assert "orch patch fx-threads apply" in render_html(record)
    assert "orch patch fx-threads apply" in render_markdown(record)


def test_markdown_tables_are_well_formed():
    base = synthetic_run("a", tok_s=6000)
    new = synthetic_run("b", tok_s=4000, torch_version="2.13.1+cpu",
                        freeze=["torch==2.13.1+cpu", "pipe|name==1"])
    md = render_markdown(new, base)
    assert md.startswith("## orch run `b`: **OK**")
    assert "### Regressions" in md and "torch changed 2.13.0+cpu -> 2.13.1+cpu" in md
    for block in re.findall(r"(?:^\|.*\n)+", md, flags=re.M):
        rows = block.strip().splitlines()
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
        assert len(widths) == 1, block                      # same number of cells in every row
    assert "`▁" in md or "`█" in md or re.search(r"`[▁-█]+`", md)


def test_write_reports_into_the_run_folder(tmp_path):
    written = write_reports(synthetic_run("b"), None, str(tmp_path / "run"))
    assert set(written) == {"html", "md"}
    assert (tmp_path / "run" / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert not list((tmp_path / "run").glob("*.tmp.*"))


def test_line_chart_helper():
    svg = str(line_chart({"a": [(1, 10), (2, 20)], "b": [(1, 5)], "empty": []}, title="t <x>",
                         y_from_zero=True, reference=("base", 15)))
    tags = parse(svg)
    assert [a["data-series"] for t, a in tags if t == "polyline"] == ["a", "b"]
    assert any(t == "circle" for t, _ in tags)              # a one-point series still shows
    assert any(t == "line" and a.get("class") == "reference" for t, a in tags)
    assert "t &lt;x&gt;" in svg
    for t, a in tags:
        if t == "polyline":
            for pair in a["points"].split():
                x, y = map(float, pair.split(","))
                assert 0 <= x <= 640 and 0 <= y <= 300
    assert "no data recorded" in str(line_chart({}, title="x"))


@pytest.mark.parametrize("low,high", [(0, 1), (0, 17918), (3.2, 3.3), (5, 5), (-2, 7), (0, 1e7)])
def test_nice_ticks_cover_the_range(low, high):
    ticks = nice_ticks(low, high)
    assert ticks[0] <= low and ticks[-1] >= high and 2 <= len(ticks) <= 12
    assert ticks == sorted(ticks)


def test_step_axis_has_whole_ticks():
    assert 2.5 in nice_ticks(0, 15, count=6)
    assert all(t == int(t) for t in nice_ticks(0, 15, count=6, integer=True))


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([1, 2, 3]) == "▁▄█"
    assert len(sparkline(list(range(100)))) == 40


def test_failed_step_is_shown_up_front():
    from orchestrator.runs.model import StepResult
    record = synthetic_run("b", verdict="failed", findings=[])
    record.steps.insert(1, StepResult("venv with the pinned torch", "bootstrap", "sb2-201", "failed",
                                      message="pushing torch failed: timed out\n  hint: raise it"))
    html = render_html(record)
    assert 'id="failed-steps"' in html and "pushing torch failed" in html
    assert "- **step failed**: venv with the pinned torch (bootstrap) on `sb2-201`: pushing torch " \
           "failed: timed out" in render_markdown(record)


def test_notes_are_apart_from_problems():
    record = synthetic_run("b", findings=[Finding("sb1-200", "grep:flag", "10 matches"),
                                          Finding("sb1-200", "fx-tls:vulnerable", "unpatched")])
    html = render_html(record)
    assert 'id="notes"' in html and "10 matches" in html
    assert html.count('class="finding"') == 1                # only fx-tls:vulnerable is a problem


def test_a_torchrun_run_is_reported_in_ranks_with_its_killed_finding():
    from orchestrator.watch.classify import ClassifierSettings, EndState, LogClassifier

    classifier = LogClassifier(ClassifierSettings("ct200", metrics_from_lines=False, worker_word="rank"))
    log = (__import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures" / "logs"
           / "torchrun-sigkill.log").read_text().splitlines()
    for i, line in enumerate(log):
        classifier.feed(line, float(i))
    verdict = classifier.classify(EndState(state="exited", exit_code=1))
    record = synthetic_run("k", verdict=verdict.verdict, findings=verdict.findings)
    record.summary = {"monitor": {"ct200": verdict.summary}}
    html = render_html(record)
    findings = html[html.index('id="findings"'):]
    assert verdict.verdict == "killed" and "No problems found" not in findings
    assert "<b>killed</b>" in findings and "OOM killer" in findings
    assert '<span class="muted">ranks</span>' in html and 'muted">drafters<' not in html
    assert "Throughput per rank" in html
    assert "| rank | last step" in render_markdown(record)


def _two_node_record():
    from orchestrator.runs.model import StepResult
    record = synthetic_run("n", tok_s=4000)
    record.verdict = "killed"
    record.launch = {"targets": {
        "sb2-200": {"run_dir": "/r", "node_rank": 1, "address": "10.88.2.200", "ranks": 1,
                    "rdzv_endpoint": "10.88.1.200:41000"},
        "sb1-200": {"run_dir": "/r", "node_rank": 0, "address": "10.88.1.200", "ranks": 1,
                    "rdzv_endpoint": "10.88.1.200:41000"}}}
    record.summary["monitor"] = {"sb1-200": {"verdict": "nonzero-exit"}, "sb2-200": {"verdict": "killed"}}
    record.steps.append(StepResult(name="monitor", kind="monitor", target="sb1-200", status="failed",
                                   data={"first_failure": {"node": "sb2-200", "node_rank": 1, "rank": 1}}))
    return record


def test_a_multi_node_run_lists_its_nodes_and_the_one_that_failed_first():
    markdown = render_markdown(_two_node_record())
    assert "### Nodes (one torchrun job, rendezvous 10.88.1.200:41000)" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert rows == ["| 0 | `sb1-200` | 10.88.1.200 | 1 | nonzero-exit |  |",
                    "| 1 | `sb2-200` | 10.88.2.200 | 1 | killed | **failed first** (rank 1) |"]
    assert '<h2 id="nodes">Nodes</h2>' in render_html(_two_node_record())
    assert "### Nodes" not in render_markdown(synthetic_run("b", tok_s=4000))


def test_the_history_is_plotted_with_its_change_points_and_culprit_lines():
    from orchestrator.runs import history
    from tests.fixtures.synthetic import nights_with_an_upgrade
    records = nights_with_an_upgrade()
    nights = history.analyse_nights("playbooks/dflash.yaml", [[r] for r in records])
    html = render_html(records[-1], records[-2], history=nights)
    total = html[html.index('class="chart chart-history chart-history-total"'):]
    total = total[:total.index("</svg>")]
    # one dot per night, one drop marked at night 21 with its size, state and culprit
    assert total.count("<circle") == 30
    assert total.count('<g class="change-point drop"') == 1
    assert 'data-night="21"' in total and "night 21: -6.0 % (-6.4 to -5.6), in effect" in total
    assert "torch 2.13.0+cpu -&gt; 2.14.1" in total
    workers = html[html.index("chart-history-workers"):]
    assert workers[:workers.index("</svg>")].count("<polyline") == 3
    assert '<li class="change-point drop">tok/s -6.0 % (-6.4 to -5.6 %) since 2026-11-21 (night 21)' in html
    md = render_markdown(records[-1], records[-2], history=nights)
    assert "### Change points over 30 nights (2026-11-01 to 2026-11-30)" in md


def test_a_recovered_change_is_grey_and_one_night_draws_no_history():
    from orchestrator.runs import history
    from tests.fixtures.synthetic import nights_with_an_upgrade
    records = nights_with_an_upgrade()
    for n, record in enumerate(records[25:]):      # back to the old speed from night 26 on
        record.summary["total_tok_s"] /= 0.94
        for point in record.metrics:
            point.tok_s = round(point.tok_s / 0.94)
    nights = history.analyse_nights("p.yaml", [[r] for r in records])
    html = render_html(records[-1], history=nights)
    assert '<g class="change-point over"' in html and "no longer in effect" in html
    alone = history.analyse_nights("p.yaml", [[records[0]]])
    assert 'id="history"' not in render_html(records[0], history=alone)


def _unpatched_nodes_record():
    """A two-node run as the ddp playbook records it: no patch step, so no torch version or
    FX state in the targets, only their pip freeze; one node's step failed with a long message."""
    from orchestrator.runs.model import StepResult, TargetInfo
    record = synthetic_run("r2", verdict="failed")
    record.targets = [TargetInfo(name=name, host=name.split("-")[0], vmid=200,
                                 pip_freeze=["numpy==2.1.0", "torch==2.13.0+cpu"])
                      for name in ("sb1-200", "sb2-200")]
    record.steps = [StepResult("launch", "launch", "sb2-200", "failed", record.started_at, 1.0,
                               "sb2-200: " + "the rendezvous never formed; " * 30)]
    return record


def test_environment_shows_torch_from_the_freeze_and_unchecked_fx_states_as_such():
    record = _unpatched_nodes_record()
    html, markdown = render_html(record), render_markdown(record)
    assert html.count("<td>2.13.0+cpu</td>") == 2
    assert html.count(">not checked</span>") == 2 and ">unknown<" not in html
    assert "| `sb2-200` | sb2:200 | 2.13.0+cpu | not checked |" in markdown
    # the failed step's message wraps (class message: pre-wrap), none of it behind a scroll bar
    assert re.search(r'<pre class="message">sb2-200: the rendezvous', html)
    assert re.search(r"pre\.message \{[^}]*white-space: pre-wrap", html)


def test_environment_names_each_fx_state_a_patch_step_reported():
    record = synthetic_run("r3")
    patch = next(step for step in record.steps if step.kind == "patch")
    patch.data["states"] = {"fx-tracing-flag": "patched", "node-meta": "patched",
                            "trace-patching": "upstream"}
    html = render_html(record)
    assert ("FX tracing flag: patched by orch; FX node-meta state: patched by orch; "
            "FX trace-time patching: thread-local upstream") in html
