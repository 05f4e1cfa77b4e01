"""Acknowledged regressions: a known slow-down that stops alerting but stays in every report.

A team that knows why a metric got slower (a torch upgrade it accepted, a smaller GPU share)
acknowledges it with `orch runs ack PLAYBOOK [METRIC ...] --reason ...`. The store keeps who,
why, when, until when, and the numbers of the night it was acknowledged on: the slower level
and the usual level before it (the window's median) with its noise. Each night, for a metric
with an active acknowledgement:

    flagged (regression or suspected) and not much slower than the acknowledged level
        -> "acknowledged": exit 0, no alert, the line and its who/why/until in the reports
    flagged and slower than the acknowledged level by more than the noise explains
        -> stays flagged: a second drop on top of the known one is news
    judged ok, and nearer the usual level than the acknowledged one -> cleared: recovered
    judged ok, and the window's median nearer the acknowledged level than the usual one
        -> cleared: the new level is the baseline now (after about half a window of nights)
    past its expiry -> cleared: expired (the metric alerts again if it is still slow)

Cleared acknowledgements are kept with the reason (`orch runs acks --all`): a record of what
was accepted, by whom. Only the noise model's throughput verdicts are acknowledged: while a
metric has "insufficient data" the fixed threshold judges and an acknowledgement waits.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

from orchestrator.ground.errors import ConfigError
from orchestrator.runs import noise
from orchestrator.runs.model import now_iso
from orchestrator.runs.store import RunStore

DEFAULT_EXPIRY = "30d"
MAX_EXPIRY_DAYS = 366
FLAGGED = (noise.REGRESSION, noise.SUSPECTED)


@dataclass
class Ack:
    playbook: str
    metric: str              # "total", "d0", "sb1-200/d1": a noise model metric
    run_id: str              # the night it was acknowledged on (its last run)
    level: float             # that night's tok/s: the known, slower level
    centre: float            # the usual level before it: the window's median that night
    noise: float             # the window's noise that night, tok/s
    reason: str
    by: str
    at: str                  # ISO time, UTC
    expires: str             # ISO time, UTC
    id: Optional[int] = None
    cleared_at: Optional[str] = None
    cleared: str = ""

    @classmethod
    def from_row(cls, row: dict) -> "Ack":
        return cls(**row)

    def describe(self) -> str:
        return (f"acknowledged by {self.by} on {self.at[:10]} until {self.expires[:10]}: "
                f"{self.reason}")


# ------------------------------------------------------------------ making one
def parse_expiry(text: str, now: Optional[datetime] = None) -> str:
    """'14d', '2w', '12h' from now, or a date 'YYYY-MM-DD' (the end of that day, UTC)."""
    now = now or datetime.now(timezone.utc)
    value = str(text).strip()
    span = re.fullmatch(r"(\d+)\s*([hdw])", value)
    if span:
        amount, unit = int(span.group(1)), span.group(2)
        until = now + {"h": timedelta(hours=amount), "d": timedelta(days=amount),
                       "w": timedelta(weeks=amount)}[unit]
    else:
        try:
            day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=timezone.utc)
        except ValueError:
            raise ConfigError(f"--expires {text!r}: expected a span such as 14d, 2w or 12h, "
                              "or a date YYYY-MM-DD") from None
        until = day + timedelta(days=1) - timedelta(seconds=1)
    if until <= now:
        raise ConfigError(f"--expires {text!r} is in the past")
    if until - now > timedelta(days=MAX_EXPIRY_DAYS):
        raise ConfigError(f"--expires {text!r}: at most {MAX_EXPIRY_DAYS} days; an accepted "
                          "level becomes the baseline long before that")
    return until.isoformat(timespec="seconds")


def acknowledge(store: RunStore, playbook: str, judgement: noise.NoiseJudgement, run_id: str,
                metrics: list[str], *, reason: str, by: str, expires: str) -> list[Ack]:
    """Acknowledge METRICS (none: every flagged one) of the night JUDGEMENT judged."""
    if not reason.strip():
        raise ConfigError("--reason is empty: say why this slow-down is accepted")
    by_name = {m.metric: m for m in judgement.metrics}
    flagged = [m.metric for m in judgement.metrics if m.status in FLAGGED]
    chosen = list(metrics) or flagged
    if not chosen:
        raise ConfigError(f"the last night of {playbook} ({run_id}) flagged no throughput "
                          f"metric (status {judgement.status}): nothing to acknowledge")
    for metric in chosen:
        if metric not in by_name:
            raise ConfigError(f"no metric {metric!r} in the last night of {playbook}",
                              hint="its metrics: " + ", ".join(sorted(by_name)))
        if metric not in flagged:
            raise ConfigError(f"{metric} was {by_name[metric].status} in the last night of "
                              f"{playbook} ({run_id}): only a flagged metric is acknowledged",
                              hint="flagged: " + (", ".join(flagged) or "none"))
    made = []
    for metric in chosen:
        m = by_name[metric]
        ack = Ack(playbook=playbook, metric=metric, run_id=run_id, level=m.tonight,
                  centre=m.centre, noise=m.noise, reason=reason.strip(), by=by, at=now_iso(),
                  expires=expires)
        ack.id = store.add_ack({k: v for k, v in asdict(ack).items()
                                if k not in ("id", "cleared_at", "cleared")})
        made.append(ack)
    return made


# ------------------------------------------------------------------ each night
def apply(store: RunStore, playbook: str, judgement: noise.NoiseJudgement,
          now: Optional[str] = None) -> list[Ack]:
    """Let the active acknowledgements of PLAYBOOK speak for tonight's JUDGEMENT (in place),
    clearing those that expired or are no longer needed. Returns the ones that applied."""
    if not judgement.decides:
        return []
    now = now or now_iso()
    by_metric = {m.metric: m for m in judgement.metrics}
    applied = []
    for ack in map(Ack.from_row, store.acks(playbook)):
        metric = by_metric.get(ack.metric)
        why = clears(ack, metric, now)
        if why:
            store.clear_ack(ack.id, why, now)
            if metric is not None:
                metric.reason += f" (the acknowledgement by {ack.by} is cleared: {why})"
            continue
        if metric is None or metric.status not in FLAGGED:
            continue
        if covers(ack, metric):
            metric.status = noise.ACKNOWLEDGED
            metric.reason = f"{ack.describe()}; {metric.reason}"
            metric.ack = asdict(ack)
            applied.append(ack)
        else:
            metric.reason += (f"; slower than the acknowledged {ack.level:,.0f} tok/s "
                              f"({ack.describe()})")
    applied += _absorbed_change_points(store, playbook, by_metric)
    judgement.status = next((s for s in noise.ORDER if s in {m.status for m in judgement.metrics}),
                            noise.INSUFFICIENT)
    return applied


NEW_BASELINE, RECOVERED = "the new level is the baseline", "recovered"


def _absorbed_change_points(store: RunStore, playbook: str, by_metric: dict) -> list[Ack]:
    """The history's change point of a slow-down that was acknowledged and then cleared by
    itself (the new baseline, or a lucky night read as recovered): e-divisive proves it some
    nights later, when nobody needs telling (runs/changes.py). Still acknowledged while
    tonight is no slower than that level; not after it expired or was removed."""
    applied = []
    for ack in map(Ack.from_row, store.acks(playbook, cleared=True)):
        metric = by_metric.get(ack.metric)
        if (not ack.cleared.startswith((NEW_BASELINE, RECOVERED)) or metric is None
                or metric.status != noise.REGRESSION or not metric.change
                or metric.change.get("rule") != "e-divisive" or not covers(ack, metric)):
            continue
        metric.status = noise.ACKNOWLEDGED
        metric.reason = f"{ack.describe()}, since the new baseline; {metric.reason}"
        metric.ack = asdict(ack)
        applied.append(ack)
    return applied


def covers(ack: Ack, metric: noise.MetricJudgement) -> bool:
    """Tonight no slower than the acknowledged level than its noise explains. The noise is
    the one measured the night of the acknowledgement: the window's since then mixes the two
    levels and overstates it more each night."""
    return metric.tonight is not None and metric.tonight >= ack.level - noise.Z_BAD * ack.noise


def clears(ack: Ack, metric: Optional[noise.MetricJudgement], now: str) -> str:
    """Why ACK ends tonight ("" while it holds).

    Both "no longer needed" tests are against the midpoint of the usual and the acknowledged
    level, not against a noise width: a drop is acknowledged after it was confirmed, often
    on its second slow night, when the window's noise already counts the first one and is
    overstated (on a busy machine enough to make a -90 % drop look like the new normal)."""
    if now >= ack.expires:
        return f"expired on {ack.expires[:10]}"
    if metric is None or metric.status != noise.OK or metric.tonight is None:
        return ""
    midpoint = (ack.level + ack.centre) / 2
    if metric.tonight >= midpoint:
        return (f"{RECOVERED}: {metric.tonight:,.0f} tok/s, nearer the usual {ack.centre:,.0f} "
                f"than the acknowledged {ack.level:,.0f}")
    if metric.centre is not None and metric.centre <= midpoint:
        return (f"{NEW_BASELINE}: the window's median is {metric.centre:,.0f} "
                f"tok/s, nearer the acknowledged {ack.level:,.0f} than the usual {ack.centre:,.0f}")
    return ""
