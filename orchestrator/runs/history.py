"""A playbook's history of nights: each metric's per-night level, its change points
(runs/changes.py; for the total also a fall night by night since the last of them, a
trend) and, at each, what changed in the environment between the nights either side of
it: the suspects, in one line.

    tok/s -6.1 % since 2026-11-14 (night 37): torch 2.13.0 -> 2.14.1; fx-threads re-applied

The nights are those of the newest night's shape (runs/baseline.py, same_shape_nights): a
change of workers or devices starts another history rather than a change point. The
environment is what the run records hold: torch and every package of pip freeze, each
target's FX patch states as the run's steps saw them, and the machine (GPU models, driver,
CUDA, clocks, power limit, cgroup CPU and memory limits). A change point's night is itself
uncertain by a night or two, so where the nights either side of it differ in nothing
recorded, the nearest difference within LOOK_NIGHTS is named with its night; where there is
none, the line says so: a slow drift, or something the records do not hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.ground import fx_states, verdicts
from orchestrator.runs import changes, noise
from orchestrator.runs.baseline import newest_night, same_shape_nights
from orchestrator.runs.compare import compare, fx_states_seen
from orchestrator.runs.model import RunRecord
from orchestrator.runs.store import RunStore

LOOK_NIGHTS = 2        # how far from a change point's night an environment change is looked for


@dataclass
class Night:
    number: int                    # 1: the oldest night analysed
    key: str                       # its first run's id
    date: str                      # YYYY-MM-DD of its first run
    runs: list[RunRecord]
    levels: dict                   # metric -> tok/s (the mean of the night's runs)


@dataclass
class ChangePoint:
    metric: str
    night: Night                   # the first night of the new level
    change: changes.Change
    culprit: list[str] = field(default_factory=list)   # what changed, the suspects
    culprit_night: Optional[int] = None                # where the culprit's change was, when not here

    def line(self) -> str:
        head = "" if self.metric == "total" else f"{self.metric}: "
        size = changes.describe(self.change)
        since = f"since {self.night.date} (night {self.night.number})"
        if not self.culprit:
            why = (f"nothing recorded changed between nights {self.night.number - LOOK_NIGHTS - 1} "
                   f"and {self.night.number + LOOK_NIGHTS} (a drift, or a cause the records do "
                   "not hold)")
        else:
            why = "; ".join(self.culprit)
            if self.culprit_night is not None and self.culprit_night != self.night.number:
                why += f" (at night {self.culprit_night})"
        state = "" if self.change.in_effect else " [no longer in effect]"
        return f"{head}{size} {since}: {why}{state}"

    def to_dict(self) -> dict:
        return {"metric": self.metric, "night": self.night.number, "night_run": self.night.key,
                "date": self.night.date, **self.change.to_dict(), "culprit": self.culprit,
                "culprit_night": self.culprit_night, "line": self.line()}


@dataclass
class History:
    playbook: str
    nights: list[Night]
    metrics: list[str]
    change_points: list[ChangePoint]

    def series(self, metric: str) -> list[tuple[int, Optional[float]]]:
        return [(n.number, n.levels.get(metric)) for n in self.nights]

    def to_dict(self) -> dict:
        return {"playbook": self.playbook, "nights": [
            {"night": n.number, "run": n.key, "date": n.date, "runs": [r.run_id for r in n.runs],
             "levels": n.levels} for n in self.nights],
            "change_points": [c.to_dict() for c in self.change_points]}


def playbook_history(store: RunStore, playbook: str, *, nights: int = changes.HISTORY_NIGHTS,
                     until: Optional[RunRecord] = None) -> History:
    """The newest NIGHTS nights of PLAYBOOK's newest shape (or of UNTIL's night and the
    nights before it), their levels and change points. OrchError when there is no run."""
    tonight = newest_night(store, until.playbook if until else playbook, until=until)
    ok = [record for record in tonight if record.verdict == verdicts.OK]
    groups = same_shape_nights(store, tonight, nights - 1)[::-1] + ([ok] if ok else [])
    return analyse_nights(playbook, groups)


def analyse_nights(playbook: str, groups: list[list[RunRecord]]) -> History:
    """The history of GROUPS (each a night's ok runs, oldest night first)."""
    made = [Night(i + 1, runs[0].run_id, (runs[0].started_at or "")[:10], runs,
                  noise.profile_night(runs).levels) for i, runs in enumerate(groups)]
    metrics = sorted({m for night in made for m in night.levels}, key=lambda m: (m != "total", m))
    found = []
    for metric in metrics:
        present = [night for night in made if night.levels.get(metric)]
        levels = [night.levels[metric] for night in present]
        points = changes.analyse(levels)
        # the level since the last change point falling night by night (the nightly's trend
        # rule, the total only): listed as a change from the night the fall is fitted from
        trend = changes.current_trend(levels, points) if metric in changes.TAIL_METRICS else None
        for change in points + ([trend] if trend else []):
            night = present[change.index]
            culprit, where = culprit_near(made, night.number - 1)
            found.append(ChangePoint(metric, night, change, culprit, where))
    return History(playbook, made, metrics, found)


def culprit_near(nights: list[Night], index: int) -> tuple[list[str], Optional[int]]:
    """What changed between night INDEX - 1 and INDEX (0-based), else between the nearest
    pair of nights within LOOK_NIGHTS that differ: (phrases, that pair's later night number)."""
    for offset in (0, -1, 1, -2, 2)[:1 + 2 * LOOK_NIGHTS]:
        i = index + offset
        if 1 <= i < len(nights):
            found = environment_change(nights[i - 1].runs[-1], nights[i].runs[0])
            if found:
                return found, nights[i].number
    return [], None


def environment_change(before: RunRecord, after: RunRecord) -> list[str]:
    """Short phrases for what differs between two runs' environments, the most telling
    first: torch, the FX patch, the machine, then every package of pip freeze."""
    comparison = compare(before, after)
    several = len(comparison.targets) > 1
    patch_before, patch_after = fx_states_seen(before), fx_states_seen(after)
    phrases = []
    for name, info in comparison.targets.items():
        found = []
        torch = info["torch"]
        if torch["base"] and torch["new"] and torch["base"] != torch["new"]:
            found.append(f"torch {torch['base']} -> {torch['new']}")
        patch = patch_phrase(patch_set(after, name), patch_before.get(name, []),
                             patch_after.get(name, []))
        if patch:
            found.append(patch)
        found += [f"{what} {was} -> {now}" for what, was, now in info.get("machine") or []]
        packages = info["packages"] or {}
        found += [f"{package} {old or '?'} -> {new or '?'}"
                  for package, (old, new) in (packages.get("changed") or {}).items()
                  if package != "torch"]
        found += [f"+ {p} {v}".rstrip() for p, v in (packages.get("added") or {}).items()]
        found += [f"- {p} {v}".rstrip() for p, v in (packages.get("removed") or {}).items()]
        phrases += [f"{name}: {phrase}" if several else phrase for phrase in found]
    return phrases


def patch_set(record: RunRecord, target: str) -> str:
    """The patch set a run's patch steps worked on (fx-threads, fx-tls), fx-tls if none said."""
    for step in record.steps:
        data = step.data if isinstance(step.data, dict) else {}
        if step.target == target and data.get("patch_set") in fx_states.PATCH_SETS:
            return data["patch_set"]
    return fx_states.PATCH_SETS[1]


def patch_phrase(name: str, before: list[str], after: list[str]) -> Optional[str]:
    """How a target's FX patch history changed from one night (BEFORE: the states its run
    saw, in order) to the next (AFTER), in a few words; None when it did not."""
    if not after or before == after:
        return None
    was, now = (before or [None])[-1], after[-1]
    lost = next((s for s in after if s in fx_states.NEEDS_PATCH), None)
    if lost and now in fx_states.THREAD_LOCAL and was in fx_states.THREAD_LOCAL:
        return f"{name} re-applied (found {lost}: {' -> '.join(after)})"
    if was in fx_states.THREAD_LOCAL and now in fx_states.NEEDS_PATCH:
        return f"{name} lost ({was} -> {now})"
    if was != now:
        return f"{name} {was or 'unknown'} -> {now}"
    return None
