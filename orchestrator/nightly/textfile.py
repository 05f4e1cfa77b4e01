"""The night's numbers for dashboards: a Prometheus text-format file for node_exporter's
textfile collector (`--collector.textfile.directory`), so Grafana can chart the history.

The text is prometheus-client's (the Prometheus project's own Python library:
`generate_latest`, the exposition format node_exporter parses); the file is orch's own
write: a temporary file beside the target with a name nobody can guess (mkstemp:
O_CREAT|O_EXCL, 0600), fchmod to 0644, then renamed over the target, so node_exporter never
reads half a file. (prometheus-client's `write_to_textfile` opens PATH.PID.THREAD with a
plain open, which follows a link another account planted at that name, and its file's mode
came from the process's umask, which only a process-wide umask change could set.) One
file per playbook,
DIR/orch_nightly_KEY.prom (KEY: nightly.playbook_key, the playbook's name and a hash of
its path), replaced each night. Every series has a `playbook` label with that KEY: two
playbooks called dflash.yaml in two folders are two series, not a collision node_exporter
would refuse.

    orch_nightly_status{playbook,status}                     1 for tonight's status, 0 for the others
    orch_nightly_exit_code{playbook}                         orch nightly's exit code
    orch_nightly_runs{playbook}                              runs in the night (--repeat)
    orch_nightly_duration_seconds{playbook}                  the night's runs, end to end, summed
    orch_nightly_end_timestamp_seconds{playbook}             when the night's last run ended
    orch_nightly_regressions{playbook}                       regression lines (any kind) tonight
    orch_nightly_throughput_tokens_per_second{playbook,metric}           tonight's level
    orch_nightly_throughput_median_tokens_per_second{playbook,metric}    the window's median
    orch_nightly_throughput_noise_ratio{playbook,metric}     the measured noise / the median
    orch_nightly_throughput_z{playbook,metric}               tonight in noise widths from the median
    orch_nightly_throughput_p{playbook,metric}               the rank test's p (where samples exist)
    orch_nightly_throughput_status{playbook,metric,status}   1 for the metric's status, 0 for the others

metric: "total", or a worker ("d0", "sb1-200/d1"), as runs/noise.py names them. Where the
noise model had no window ("insufficient data") the median, noise, z and p are left out,
not written as 0. The file is 0644: it holds numbers and the playbook's key, nothing secret,
and node_exporter runs as a user of its own.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from typing import Optional

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from orchestrator.ground.verdicts import DEGRADED, FAILED, HANG, OK, UNREACHABLE
from orchestrator.runs import noise

PREFIX = "orch_nightly"
NIGHT_STATUSES = (OK, noise.SUSPECTED, noise.REGRESSION, FAILED, HANG, DEGRADED, UNREACHABLE)
FILE_MODE = 0o644              # the file is for node_exporter, another user


def textfile_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"{PREFIX}_{key.replace('-', '_')}.prom")


def registry_for(key: str, summary: dict) -> CollectorRegistry:
    """The night's gauges, from orch nightly's summary (NightlyOutcome.summary())."""
    registry = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple = ()) -> Gauge:
        return Gauge(f"{PREFIX}_{name}", doc, ("playbook",) + labels, registry=registry)

    status = gauge("status", "1 for the night's status (ok, suspected, regression or the run's "
                             "verdict), 0 for the others", ("status",))
    for name in dict.fromkeys(NIGHT_STATUSES + (summary["status"],)):
        status.labels(key, name).set(1 if name == summary["status"] else 0)
    gauge("exit_code", "orch nightly's exit code").labels(key).set(summary["exit_code"])
    gauge("runs", "runs of the playbook in the night").labels(key).set(len(summary.get("runs") or [1]))
    gauge("regressions", "regression lines tonight").labels(key).set(len(summary.get("regressions") or []))
    if summary.get("duration_s") is not None:
        gauge("duration_seconds", "the night's runs, end to end, summed").labels(key).set(summary["duration_s"])
    ended = _timestamp(summary.get("ended_at"))
    if ended is not None:
        gauge("end_timestamp_seconds", "when the night's last run ended").labels(key).set(ended)
    _throughput(gauge, key, summary)
    return registry


def _throughput(gauge, key: str, summary: dict) -> None:
    metrics = (summary.get("noise") or {}).get("metrics") or []
    if not metrics:      # no noise judgement (a summary of an older orch): the levels alone
        levels = dict(summary.get("per_drafter_tok_s") or {})
        if summary.get("total_tok_s"):
            levels["total"] = summary["total_tok_s"]
        metrics = [{"metric": m, "tonight": v, "status": noise.INSUFFICIENT} for m, v in levels.items()]
    series = {
        "tonight": gauge("throughput_tokens_per_second", "tonight's tok/s (the mean of the "
                         "night's runs)", ("metric",)),
        "centre": gauge("throughput_median_tokens_per_second", "the median tok/s of the "
                        "window of earlier nights", ("metric",)),
        "noise_pct": gauge("throughput_noise_ratio", "the measured noise as a fraction of the "
                           "median", ("metric",)),
        "z": gauge("throughput_z", "tonight in noise widths from the median (negative: slower)",
                   ("metric",)),
        "p": gauge("throughput_p", "the rank test's one-sided p (tonight's steps slower)", ("metric",)),
    }
    status = gauge("throughput_status", "1 for the metric's status, 0 for the others",
                   ("metric", "status"))
    for metric in metrics:
        for field, series_gauge in series.items():
            if metric.get(field) is not None:
                series_gauge.labels(key, metric["metric"]).set(metric[field])
        for name in noise.ORDER:
            status.labels(key, metric["metric"], name).set(1 if name == metric["status"] else 0)


def _timestamp(iso: Optional[str]) -> Optional[float]:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def write(directory: str, key: str, summary: dict) -> str:
    """Write the night's file into DIRECTORY (atomically); returns its path."""
    path = textfile_path(directory, key)
    text = generate_latest(registry_for(key, summary))
    # not *.prom: the collector reads only those, never this half-written file
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                     dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path
