"""Comparing two runs, and deciding whether the newer one regressed.

Used by `orch runs compare`, by reports ("compared with the baseline") and by `orch nightly`,
which exits with ExitCode.REGRESSION when `Comparison.regressions` is not empty.

What counts as a regression (each one a `Change` with severity "regression"):
  - throughput: a drafter's or the total tok/s fell by more than the threshold (default 10 %);
  - verdict: the baseline was ok and this run is not;
  - a new failure signature: a finding (fx-race, hang, cuda-oom, ...) the baseline did not have;
  - patch drift: orch's record says the fx-tls patch was applied but the files say otherwise
    (state "drifted"), or the baseline was patched and this run's torch is "vulnerable";
  - a changed torch version on a target.
Package differences from the recorded pip freeze (added, removed, changed versions) are
reported as information: they explain a regression but are not one by themselves.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from orchestrator.ground import fx_states, verdicts
from orchestrator.ground.verdicts import OK
from orchestrator.runs.model import RunRecord

DEFAULT_THRESHOLD = 0.10
FX_SIGNATURE = "fx-tls:"     # patch-state findings; judged as patch drift, not as failures
# Findings are also notes (grep hits "grep:PATTERN", "fx-tls:patched", "fx-race-check:fixed"):
# only these signatures, the verdict table's failures and a worker's error line, are failures.
FAILURE_SIGNATURES = verdicts.FAILURES | {verdicts.WORKER_ERROR}


def worker_word(record: Optional[RunRecord]) -> str:
    """The run's own word for a worker (rank, drafter, worker), as its monitors recorded it;
    "drafter" for records made before they did, "worker" when a run's targets differ."""
    monitors = record.monitors() if record else {}
    words = {m.workers for m in monitors.values() if m.workers}
    if not words:
        return "drafter"
    return words.pop() if len(words) == 1 else "worker"


def is_failure(signature: str) -> bool:
    """A failure signature ("hang", "fx-race", ...), not an informational finding."""
    return signature.split(":", 1)[0] in FAILURE_SIGNATURES


def is_problem(signature: str) -> bool:
    """What a report shows as a problem: a failure, or torch left unpatched or drifted."""
    return is_failure(signature) or signature in (FX_SIGNATURE + s for s in fx_states.NEEDS_PATCH)


# ------------------------------------------------------------------ throughput
def drafter_label(target: str, drafter: int, targets: set[str]) -> str:
    """"d0" for a run on one target, "sb1-200/d0" when several targets ran drafters."""
    return f"d{drafter}" if len(targets) <= 1 else f"{target}/d{drafter}"


def series(record: RunRecord) -> dict[str, list]:
    """Metric points grouped per drafter label, each list ordered by step."""
    targets = {m.target for m in record.metrics}
    grouped: dict[str, list] = {}
    for point in sorted(record.metrics, key=lambda m: (m.target, m.drafter, m.step)):
        grouped.setdefault(drafter_label(point.target, point.drafter, targets), []).append(point)
    return grouped


def throughput(record: RunRecord) -> dict:
    """{"total": tok/s or None, "per_drafter": {label: tok/s}, "source": where it came from}.

    The trainer's own numbers win when the runner recorded them (its summary line and each
    drafter's "done" line exclude the compile step exactly). Otherwise the metric series: the
    median of each drafter's tok/s over its points after the first (step 1 includes the
    torch.compile time, which would make a cold cache look like a regression).
    """
    summary = record.summary or {}
    per_drafter: dict[str, float] = {}
    source = "none"
    recorded = summary.get("per_drafter_tok_s") or summary.get("drafters_tok_s")
    monitors = record.monitors()
    if not isinstance(recorded, dict) and len(monitors) > 1:
        # The runner's summary for several targets: each target's monitor, its workers' tok/s
        recorded = {f"{target}/d{k}": worker.tok_s for target, monitor in sorted(monitors.items())
                    for k, worker in monitor.drafters.items()}
    if not isinstance(recorded, dict) and isinstance(summary.get("drafters"), dict):
        # The monitor's summary: {"drafters": {"0": {"step": .., "loss": .., "tok_s": ..}}}
        recorded = {k: v.get("tok_s") for k, v in summary["drafters"].items() if isinstance(v, dict)}
    if isinstance(recorded, dict) and recorded:
        per_drafter = {_label_from_summary(k): float(v) for k, v in recorded.items()
                       if _is_number(v)}
        source = "summary"
    if not per_drafter and record.metrics:
        for label, points in series(record).items():
            values = [p.tok_s for p in points if p.tok_s is not None]
            steady = values[1:] if len(values) > 1 else values
            if steady:
                per_drafter[label] = float(statistics.median(steady))
        source = "metrics" if per_drafter else source
    total = summary.get("total_tok_s")
    if _is_number(total) and float(total) > 0:
        total = float(total)
        source = source if source != "none" else "summary"
    else:
        total = sum(per_drafter.values()) if per_drafter else None
    return {"total": total, "per_drafter": dict(sorted(per_drafter.items())), "source": source}


def _label_from_summary(key) -> str:
    text = str(key)
    return f"d{text}" if text.isdigit() else text


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ------------------------------------------------------------------ packages and patch state
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:(===?|@)\s*(.+?))?\s*$")


def parse_freeze(lines: list[str]) -> dict[str, str]:
    """`pip freeze` lines -> {normalised name: version or URL}; comments and -e lines kept by text."""
    packages: dict[str, str] = {}
    for line in lines or []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e "):
            packages[line] = "editable"
            continue
        match = _REQ.match(line)
        if match:
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()   # PEP 503 normalisation
            packages[name] = (match.group(3) or "").strip()
        else:
            packages[line] = ""
    return packages


def package_diff(old: list[str], new: list[str]) -> dict:
    """{"added": {name: version}, "removed": {...}, "changed": {name: [old, new]}}."""
    before, after = parse_freeze(old), parse_freeze(new)
    return {
        "added": {n: after[n] for n in sorted(after.keys() - before.keys())},
        "removed": {n: before[n] for n in sorted(before.keys() - after.keys())},
        "changed": {n: [before[n], after[n]] for n in sorted(before.keys() & after.keys())
                    if before[n] != after[n]},
    }


def fx_states_seen(record: RunRecord) -> dict[str, list[str]]:
    """Per target, every fx-tls state the run observed, in order, ending with the recorded one.

    A playbook that re-applies the patch ends "patched" even after a torch reinstall undid it;
    the drift is only visible in what the grep/patch/verify steps saw on the way, so look there.
    """
    seen: dict[str, list[str]] = {}
    for step in record.steps:
        data = step.data if isinstance(step.data, dict) else {}
        for key in ("fx_tls_state", "state", "state_before"):
            value = data.get(key)
            if value in fx_states.STATES:
                seen.setdefault(step.target, []).append(value)
    from_steps = set(seen)
    for finding in record.findings:
        # The patch step's findings, "fx-tls:<state>" (playbook/steps/patch.py): the same facts as its
        # step data, so only used for a target whose steps said nothing.
        if finding.target in from_steps or not finding.signature.startswith(FX_SIGNATURE):
            continue
        state = finding.signature[len(FX_SIGNATURE):]
        if state in fx_states.STATES:
            seen.setdefault(finding.target, []).append(state)
    for target in record.targets:
        if target.fx_tls_state:
            seen.setdefault(target.name, []).append(target.fx_tls_state)
    # "patched, patched, patched" says no more than "patched": keep the changes only.
    return {name: [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
            for name, states in seen.items()}


# ------------------------------------------------------------------ the comparison
@dataclass
class Change:
    kind: str            # throughput | verdict | failure-signature | patch-drift | torch-version | packages | machine
    severity: str        # regression | info | improvement
    message: str
    target: Optional[str] = None
    detail: dict = field(default_factory=dict)


@dataclass
class Comparison:
    base: Optional[str]                       # run ids; base is None when there is no baseline
    new: str
    threshold: float
    verdict: dict = field(default_factory=dict)          # {"base": ..., "new": ...}
    throughput: dict = field(default_factory=dict)       # {"total": row, "per_drafter": {label: row}}
    targets: dict = field(default_factory=dict)          # per target: torch, fx state, packages
    changes: list[Change] = field(default_factory=list)
    worker_word: str = "drafter"                          # the new run's word for a worker

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.severity == "regression"]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["regressed"] = self.regressed
        data["regressions"] = [asdict(c) for c in self.regressions]
        return data


def _row(base: Optional[float], new: Optional[float], threshold: float) -> dict:
    change = None
    if base and new is not None:
        change = (new - base) / base
    return {"base": base, "new": new, "change": change,
            "regressed": change is not None and change < -threshold}


def _pct(change: float) -> str:
    return f"{change * 100:+.1f} %"


def compare(base: Optional[RunRecord], new: RunRecord, threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Compare NEW with BASE (the baseline; None: nothing to compare, only NEW's own problems)."""
    if not 0 <= threshold < 1:
        raise ValueError("threshold is a fraction between 0 and 1 (0.10 is 10 %)")
    result = Comparison(base=base.run_id if base else None, new=new.run_id, threshold=threshold,
                        worker_word=worker_word(new),
                        verdict={"base": base.verdict if base else None, "new": new.verdict})
    new_tp = throughput(new)
    base_tp = throughput(base) if base else {"total": None, "per_drafter": {}}
    result.throughput = {
        "total": _row(base_tp["total"], new_tp["total"], threshold),
        "per_drafter": {label: _row(base_tp["per_drafter"].get(label), new_tp["per_drafter"].get(label),
                                    threshold)
                        for label in sorted(set(base_tp["per_drafter"]) | set(new_tp["per_drafter"]))},
    }
    _throughput_changes(result)
    _verdict_changes(result, base, new)
    _signature_changes(result, base, new)
    _target_changes(result, base, new)
    return result


def _throughput_changes(result: Comparison) -> None:
    total = result.throughput["total"]
    if total["regressed"]:
        result.changes.append(Change(
            "throughput", "regression",
            f"total throughput fell {-total['change'] * 100:.1f} %: {total['base']:.0f} -> "
            f"{total['new']:.0f} tok/s (threshold {result.threshold * 100:.0f} %)", detail=total))
    elif total["change"] is not None and total["change"] > result.threshold:
        result.changes.append(Change("throughput", "improvement",
                                     f"total throughput rose {_pct(total['change'])}", detail=total))
    word = result.worker_word
    for label, row in result.throughput["per_drafter"].items():
        if row["regressed"]:
            result.changes.append(Change(
                "throughput", "regression",
                f"{word} {label} throughput fell {-row['change'] * 100:.1f} %: {row['base']:.0f} -> "
                f"{row['new']:.0f} tok/s", detail={"drafter": label, **row}))
        elif row["base"] and row["new"] is None:
            result.changes.append(Change("throughput", "regression",
                                         f"{word} {label} reported no throughput this time",
                                         detail={"drafter": label, **row}))


def _verdict_changes(result: Comparison, base: Optional[RunRecord], new: RunRecord) -> None:
    if new.verdict == OK:
        return
    if base is None or base.verdict == OK:
        result.changes.append(Change("verdict", "regression",
                                     f"verdict {new.verdict}" + (f" (baseline was {base.verdict})"
                                                                 if base else "")))


def _signature_changes(result: Comparison, base: Optional[RunRecord], new: RunRecord) -> None:
    known = {f.signature for f in base.findings} if base else set()
    failures = {f.signature for f in new.findings if is_failure(f.signature)}
    for signature in sorted(failures - known):
        first = next(f for f in new.findings if f.signature == signature)
        result.changes.append(Change("failure-signature", "regression",
                                     f"new failure signature {signature}: {first.message}",
                                     target=first.target, detail={"signature": signature}))


def _target_changes(result: Comparison, base: Optional[RunRecord], new: RunRecord) -> None:
    base_targets = {t.name: t for t in base.targets} if base else {}
    base_states = fx_states_seen(base) if base else {}
    new_states = fx_states_seen(new)
    for target in new.targets:
        old = base_targets.get(target.name)
        seen = new_states.get(target.name, [])
        was = (base_states.get(target.name) or [None])[-1]
        info = {"torch": {"base": old.torch_version if old else None, "new": target.torch_version},
                "fx_tls_state": {"base": was, "new": target.fx_tls_state, "seen": seen},
                "packages": package_diff(old.pip_freeze, target.pip_freeze)
                if old and (old.pip_freeze or target.pip_freeze) else None,
                "machine": machine_diff(old.machine, target.machine) if old else []}
        result.targets[target.name] = info
        drift = _patch_drift(was, seen)
        if drift:
            result.changes.append(Change(
                "patch-drift", "regression", f"{target.name}: {drift}"
                + (" - re-applied during this run" if target.fx_tls_state == "patched" else ""),
                target=target.name, detail=info["fx_tls_state"]))
        if old and old.torch_version and target.torch_version and old.torch_version != target.torch_version:
            result.changes.append(Change(
                "torch-version", "regression",
                f"{target.name}: torch changed {old.torch_version} -> {target.torch_version}",
                target=target.name, detail=info["torch"]))
        if info["machine"]:
            result.changes.append(Change("machine", "info", f"{target.name}: " + "; ".join(
                f"{what} {was} -> {now}" for what, was, now in info["machine"]),
                target=target.name, detail={"base": old.machine, "new": target.machine}))
        diff = info["packages"]
        if diff and any(diff.values()):
            parts = [f"{len(diff[k])} {k}" for k in ("added", "removed", "changed") if diff[k]]
            result.changes.append(Change("packages", "info",
                                         f"{target.name}: packages " + ", ".join(parts),
                                         target=target.name, detail=diff))


def _patch_drift(was: Optional[str], seen: list[str]) -> Optional[str]:
    """How the patch was lost during a run (seen: its states in order), or None."""
    if "drifted" in seen:
        return ("orch's FX patch drifted (orch's record says applied, the torch files say not: "
                "torch reinstalled or upgraded?)")
    bad = next((s for s in seen if s in fx_states.NEEDS_PATCH), None)
    if was == "patched" and bad:
        return (f"torch was patched in the baseline and was found {bad} in this run (the patch "
                "is gone: torch reinstalled?)")
    return None


# ------------------------------------------------------------------ the machine
def machine_facts(machine: dict) -> dict:
    """The machine payload's result (payloads/machine.py) as short comparable texts: what a
    run ran on. {} when nothing was read (an older record, a playbook without collect)."""
    if not machine:
        return {}
    gpus = machine.get("gpus")
    if gpus is None:
        models = "none"                      # no nvidia-smi: a CPU container, recorded as absent
    elif isinstance(gpus, dict):
        models = "unreadable (nvidia-smi failed)"
    else:
        counts: dict[str, int] = {}
        for row in gpus:
            counts[row.get("name") or "?"] = counts.get(row.get("name") or "?", 0) + 1
        models = ", ".join(f"{n}x {name}" for name, n in counts.items()) or "none"
    rows = gpus if isinstance(gpus, list) else []
    cgroup = machine.get("cgroup") or {}
    memory = cgroup.get("memory_limit_bytes")
    return {
        "GPUs": models,
        "driver": machine.get("driver") or "none",
        "CUDA": machine.get("cuda") or "none",
        "GPU max SM clock": _each(rows, "clock_max_sm_mhz", "MHz"),
        "GPU power limit": _each(rows, "power_limit_w", "W"),
        "CPU quota": f"{cgroup['cpu_quota_cores']:g} cores" if cgroup.get("cpu_quota_cores") else "none",
        "CPU set": (f"{cgroup['cpuset']} ({cgroup['cpuset_cpus']} CPUs)" if cgroup.get("cpuset")
                    else "none"),
        "memory limit": f"{memory / 2 ** 30:.1f} GiB" if memory else "none",
    }


def _each(rows: list, key: str, unit: str) -> str:
    values = sorted({row.get(key) for row in rows if row.get(key) is not None})
    return ", ".join(f"{v:g} {unit}" for v in values) or "none"


def machine_diff(base: dict, new: dict) -> list[tuple[str, str, str]]:
    """(what, baseline's, this run's) for each fact that changed; nothing when either run
    has no facts (not read is not "changed")."""
    before, after = machine_facts(base), machine_facts(new)
    if not before or not after:
        return []
    return [(what, before[what], after[what]) for what in after if before[what] != after[what]]


# ------------------------------------------------------------------ what changed, in short
ENVIRONMENT_LINES = 8      # a chat message's worth; the reports have the whole tables


def environment_diff(comparison: Comparison, limit: int = ENVIRONMENT_LINES) -> list[str]:
    """What changed on each target since the baseline, most telling first: torch, the
    fx-tls patch state, the machine (GPUs, driver, CUDA, clocks, cgroup CPU and memory
    limits), then packages (changed, added, removed) from pip freeze. The
    suspects of a regression, for a notification or the top of a report."""
    lines: list[str] = []
    for name, info in comparison.targets.items():
        torch = info["torch"]
        if torch["base"] and torch["new"] and torch["base"] != torch["new"]:
            lines.append(f"{name}: torch {torch['base']} -> {torch['new']}")
        state = info["fx_tls_state"]
        if state["base"] and state["seen"] and state["seen"] != [state["base"]]:
            # Every state this run saw: "patched -> vulnerable -> patched" is a patch a
            # reinstall undid and the playbook re-applied.
            lines.append(f"{name}: fx-tls patch {state['base']} -> {' -> '.join(state['seen'])}")
        lines += [f"{name}: {what} {was} -> {now}" for what, was, now in info.get("machine") or []]
        packages = info["packages"] or {}
        for package, (old, new) in (packages.get("changed") or {}).items():
            if package != "torch":
                lines.append(f"{name}: {package} {old or '?'} -> {new or '?'}")
        lines += [f"{name}: + {p} {v}".rstrip() for p, v in (packages.get("added") or {}).items()]
        lines += [f"{name}: - {p} {v}".rstrip() for p, v in (packages.get("removed") or {}).items()]
    if len(lines) > limit:
        lines = lines[:limit - 1] + [f"... and {len(lines) - limit + 1} more (the report has them all)"]
    return lines
