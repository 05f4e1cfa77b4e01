"""`orch report`: one run as a self-contained HTML page or as Markdown for a ticket.

Both formats are jinja2 templates in templates/ (report.html.j2, report.md.j2) fed the same
context, built here: the record, its throughput, the comparison with the baseline, the
charts (inline SVG from orchestrator.runs.svg) and a remediation for each finding.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import TYPE_CHECKING, Optional

import jinja2

from orchestrator import __version__
from orchestrator.ground import fx_states, verdicts
from orchestrator.runs.compare import (Comparison, compare, environment_diff, fx_states_seen,
                                       is_problem, series, throughput, worker_word)
from orchestrator.runs import gpu
from orchestrator.runs.changes import LEVEL, SPREAD, TREND
from orchestrator.runs.noise import NoiseJudgement
from orchestrator.runs.model import RunRecord, now_iso
from orchestrator.runs.svg import history_chart, line_chart, sparkline

if TYPE_CHECKING:
    from orchestrator.runs.history import ChangePoint, History

def _remedy(signature: str, target: str) -> str:
    """What to do about a finding the runner left without a remediation of its own (records
    of older orchs): its verdict's, from the verdict table."""
    verdict = verdicts.verdict_of(signature)
    return verdicts.remedy(verdict, target=target) if verdict else ""


def templates_dir() -> str:
    """orchestrator/templates in an installed wheel (pyproject.toml maps the repository's
    templates/ there), else templates/ at the top of the checkout (an editable install);
    $ORCH_TEMPLATES overrides both."""
    explicit = os.environ.get("ORCH_TEMPLATES")
    if explicit:
        return explicit
    packaged = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
    if os.path.isdir(packaged):
        return packaged
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "templates")


def environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates_dir()),
                             autoescape=autoescape, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    env.filters["duration"] = _duration
    env.filters["mdcell"] = lambda text: str(text if text is not None else "").replace("|", "\\|") \
        .replace("\n", " ")
    return env


def _num(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:+.1f} %"


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _elapsed(record: RunRecord) -> Optional[float]:
    try:
        start = datetime.fromisoformat(record.started_at)
        end = datetime.fromisoformat(record.ended_at) if record.ended_at else None
    except (TypeError, ValueError):
        return None
    return (end - start).total_seconds() if end else None


def context(record: RunRecord, baseline: Optional[RunRecord] = None,
            comparison: Optional[Comparison] = None, threshold: float = 0.10,
            baseline_reason: Optional[str] = None,
            noise: Optional[NoiseJudgement] = None,
            history: Optional["History"] = None) -> dict:
    """Everything both templates show. baseline_reason: which baseline and why (or why none),
    from runs/baseline.py. noise: orch nightly's runs/noise.py judgement, shown per metric.
    history: the playbook's nights through this run with their change points
    (runs/history.py), plotted."""
    if baseline is None:
        comparison = None        # a comparison with nothing: the verdict already says it all
    elif comparison is None:
        comparison = compare(baseline, record, threshold)
    grouped = series(record)
    word = worker_word(record)
    tp = throughput(record)
    base_tp = throughput(baseline) if baseline else None
    throughput_series = {label: [(p.step, p.tok_s) for p in points[1:] or points]
                         for label, points in grouped.items()}
    reference = None
    if base_tp and base_tp["per_drafter"]:
        mean = sum(base_tp["per_drafter"].values()) / len(base_tp["per_drafter"])
        reference = (f"baseline {_num(mean)} tok/s per {word}", mean)
    charts = {
        "throughput": line_chart(throughput_series, title=f"Throughput per {word} (tok/s)",
                                 x_label="step", y_label="tok/s", y_from_zero=True,
                                 css_class="chart chart-throughput", reference=reference),
        "loss": line_chart({label: [(p.step, p.loss) for p in points]
                            for label, points in grouped.items()},
                           title=f"Loss per {word}", x_label="step", y_label="loss",
                           css_class="chart chart-loss"),
    }
    findings = [{"target": f.target, "signature": f.signature, "message": f.message,
                 "evidence": f.evidence,
                 "remediation": f.remediation or _remedy(f.signature, f.target)}
                for f in record.findings if is_problem(f.signature)]
    # The steps' informational findings (grep hits, "patched", "race check: fixed").
    notes = [f for f in record.findings if not is_problem(f.signature)]
    drafters = []
    for label, points in grouped.items():
        last = points[-1]
        drafters.append({"label": label, "steps": last.step, "loss": last.loss,
                         "tok_s": tp["per_drafter"].get(label),
                         "spark": sparkline([p.tok_s for p in points[1:] or points])})
    states = fx_states_seen(record)
    gpus = gpu_context(record)
    if gpus["series"]:
        charts.update(gpus["charts"])
    return {
        "record": record,
        "verdict_class": verdicts.rule(record.verdict).tone,
        "elapsed_s": _elapsed(record),
        "throughput": tp,
        "drafters": drafters,
        "nodes": nodes_context(record),
        "word": word,
        "charts": charts,
        "findings": findings,
        "hang_stacks": hang_stacks_context(record),
        "notes": notes,
        "failed_steps": [s for s in record.steps if s.status == "failed"],
        "baseline": baseline,
        "baseline_reason": baseline_reason,
        "noise": noise,
        "history": history_context(history),
        "environment": environment_diff(comparison) if comparison else [],
        "comparison": comparison,
        "comparison_dict": comparison.to_dict() if comparison else None,
        "fx_states_seen": states,
        "environment_rows": environment_rows(record),
        "gpu_stats": gpus["stats"],
        "generated_at": now_iso(),
        "orch_version": __version__,
    }


CULPRIT_CHARS = 60     # of the culprit on the chart; the whole line is under it and a tooltip


def history_context(history: Optional["History"]) -> Optional[dict]:
    """The history's charts (the total; the workers together) with their change points
    marked, and each change point's line with its culprit. None under two nights."""
    if history is None or len(history.nights) < 2:
        return None
    workers = [m for m in history.metrics if m != "total"]
    # The total is about N times a worker: on one axis the workers would be flat lines.
    groups = [(["total"], "total", "Total throughput, night by night (tok/s)")]
    if workers:
        groups.append((workers, "workers", "Each worker's throughput, night by night (tok/s)"))
    charts = []
    for metrics, name, title in groups:
        marks = [change_mark(point, history) for point in history.change_points
                 if point.metric in metrics]
        charts.append(history_chart({m: history.series(m) for m in metrics}, marks, title=title,
                                    css_class=f"chart chart-history chart-history-{name}"))
    points = [{"line": p.line(), "tone": mark_tone(p), "metric": p.metric, "night": p.night.number}
              for p in history.change_points]
    first, last = history.nights[0], history.nights[-1]
    return {"charts": charts, "points": points, "nights": len(history.nights),
            "first": first.date, "last": last.date}


def mark_tone(point: "ChangePoint") -> str:
    """How a change point is coloured: a drop or a rise in effect, one over, or spread only."""
    change = point.change
    if change.kind == SPREAD:
        return "spread"
    if not change.in_effect:
        return "over"
    return "drop" if change.effect < 0 else "rise"


def change_mark(point: "ChangePoint", history: "History") -> dict:
    """A change point as svg.history_chart marks it: the levels either side over their nights."""
    night, change = point.night.number, point.change
    numbers = [n for n, level in history.series(point.metric) if level]
    before = [n for n in numbers if n < night][-change.nights_before:]
    after = [n for n in numbers if n >= night][:change.nights_after]
    segments = [(before[0], before[-1], change.before)] if before else []
    segments += [(after[0], after[-1], change.after)] if after else []
    slopes = []
    head = "" if point.metric == "total" else f"{point.metric} "
    state = "in effect" if change.in_effect else "no longer in effect"
    size = (f"{change.effect * 100:+.1f} % ({change.low * 100:+.1f} to {change.high * 100:+.1f})"
            if change.kind == LEVEL else "spread changed")
    if change.kind == TREND:   # one fitted line over its nights, not two levels
        segments, slopes = [], [(after[0], after[-1], change.before, change.after)] if after else []
        size = f"falling, {change.effect * 100:+.1f} % over {change.nights_after} nights"
    culprit = "; ".join(point.culprit[:2]) if point.culprit else "nothing recorded changed"
    if len(culprit) > CULPRIT_CHARS:
        culprit = culprit[:CULPRIT_CHARS - 1] + "…"
    return {"series": point.metric, "night": night, "tone": mark_tone(point),
            "label": f"{head}night {night}: {size}, {state} · {culprit}", "title": point.line(),
            "segments": segments, "slopes": slopes}


def environment_rows(record: RunRecord) -> dict[str, dict]:
    """Per target, the torch it ran (the patch step's word, else its pip freeze) and what the
    run learnt of its FX states: each shared state's row from the newest patch step, else the
    recorded overall state, else "not checked" (no step looked: not the same as "unknown",
    which is a shape orch saw and does not recognise)."""
    rows = {}
    for target in record.targets:
        pinned = [line.split("==", 1)[1] for line in target.pip_freeze if line.lower().startswith("torch==")]
        torch = target.torch_version or (pinned[0] if pinned else None)
        states = next((step.data["states"] for step in reversed(record.steps)
                       if step.target == target.name and step.kind == "patch"
                       and isinstance(step.data, dict) and step.data.get("states")), None)
        if states:
            fx = "; ".join(f"{fx_states.STATE_TITLES.get(name, name)}: {fx_states.row_meaning(status)}"
                           for name, status in states.items())
        else:
            fx = target.fx_tls_state or "not checked"
        rows[target.name] = {"torch": torch or "-", "fx": fx, "state": target.fx_tls_state or "unchecked"}
    return rows


SHOWN_STACK_FRAMES = 8     # innermost frames per thread in the report; stacks.json has them all


def hang_stacks_context(record: RunRecord) -> list[dict]:
    """The stacks the monitor took of a hung run before it stopped it: per process, its
    deadlocks, who waits on whom, and each thread's innermost frames."""
    out = []
    for name, taken in _taken_stacks(record):
        if taken.get("error"):
            out.append({"target": name, "error": taken["error"], "cycles": [], "locks": [],
                        "threads": [], "pid": taken.get("pid"), "rank": None})
        for result in taken.get("results") or []:
            out.append({"target": name, "pid": result.get("pid"), "rank": result.get("rank"),
                        "error": "", "cycles": result.get("cycles") or [],
                        "locks": [lock.get("sentence", "") for lock in result.get("locks") or []],
                        "threads": [{"label": t.get("label"),
                                     "frames": [f"{f.get('file')}:{f.get('line')} in {f.get('function')}"
                                                for f in (t.get("frames") or [])[-SHOWN_STACK_FRAMES:]]}
                                    for t in result.get("threads") or []]})
    return out


def _taken_stacks(record: RunRecord) -> list[tuple[str, dict]]:
    """(target, hang_stacks) of each monitor step; a job over several nodes: each node's."""
    found = []
    for step in record.steps:
        data = (step.data or {}) if step.kind == "monitor" else {}
        per_target = data.get("nodes") or {step.target: data}
        found += [(name, node["hang_stacks"]) for name, node in per_target.items()
                  if isinstance(node, dict) and node.get("hang_stacks")]
    return found


def nodes_context(record: RunRecord) -> list[dict]:
    """One torchrun job over many nodes: each node (in node-rank order) with its address, the
    rendezvous, its own monitor's verdict and whether it failed first. Empty for other runs."""
    monitors = record.monitors()
    first = next((s.data.get("first_failure") for s in record.steps
                  if s.kind == "monitor" and (s.data or {}).get("first_failure")), None) or {}
    rows = [{"name": name, "node_rank": entry["node_rank"], "address": entry.get("address"),
             "rdzv_endpoint": entry.get("rdzv_endpoint"), "ranks": entry.get("ranks"),
             "verdict": monitors[name].verdict if name in monitors else None,
             "first": first.get("node") == name, "failed_rank": first.get("rank")
             if first.get("node") == name else None}
            for name, entry in record.launches().items() if "node_rank" in entry]
    return sorted(rows, key=lambda row: row["node_rank"])


def gpu_context(record: RunRecord) -> dict:
    """The monitor's GPU series: a chart per quantity, and per target and GPU the mean and
    peak while the workers ran (runs/gpu.py)."""
    by_target = gpu.series_by_target(record)
    charts = {}
    for key, what, unit in gpu.QUANTITIES:
        lines = gpu.chart_series(by_target, key)
        if any(value is not None for points in lines.values() for _, value in points):
            css = {"utilization_pct": "util", "memory_used_mib": "mem", "power_w": "power"}[key]
            charts[f"gpu_{css}"] = line_chart(
                lines, title=f"GPU {what} ({unit})", x_label="seconds since the monitor started",
                y_label=unit, y_from_zero=True, css_class=f"chart chart-gpu-{css}")
    stats = [{"target": name, **row}
             for name, series in by_target.items() for row in gpu.gpu_stats(series)]
    return {"series": by_target, "charts": charts, "stats": stats}


def render_html(record: RunRecord, baseline: Optional[RunRecord] = None, **kw) -> str:
    return environment(autoescape=True).get_template("report.html.j2").render(
        context(record, baseline, **kw))


def render_markdown(record: RunRecord, baseline: Optional[RunRecord] = None, **kw) -> str:
    return environment(autoescape=False).get_template("report.md.j2").render(
        context(record, baseline, **kw))


def write_reports(record: RunRecord, baseline: Optional[RunRecord], directory: str,
                  **kw) -> dict[str, str]:
    """report.html and report.md into DIRECTORY (the run's folder); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    written = {}
    for kind, name, render in (("html", "report.html", render_html),
                               ("md", "report.md", render_markdown)):
        path = os.path.join(directory, name)
        _write_atomic(path, render(record, baseline, **kw))
        written[kind] = path
    return written


def _write_atomic(path: str, text: str) -> None:
    # A half-written report is worse than the previous one: write aside, then rename.
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
