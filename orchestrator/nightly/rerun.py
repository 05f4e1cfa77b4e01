"""`orch nightly`: one unattended rerun of a playbook, for schedulers and scripts.

    lock (one nightly per playbook at a time)
      -> run the playbook (the step engine, orchestrator/playbook/engine.py), recorded in the
         run store; with --repeat N (or nightly.yaml's repeat) N times, one night of N runs
      -> baseline = the pinned run, else the last ok run, of the same shape as tonight's
         (targets, workers, devices, throughput variables: runs/baseline.py)
      -> compare with the baseline, write report.html + report.md into the run's folder
      -> notify (webhook and/or command), exit with the outcome's code

Exit codes (errors.ExitCode): 0 ok and no regression; 10-13 the run's own verdict (failed,
hang, degraded, unreachable) - these win, they say more than "regression"; 20 the run was ok
but worse than the baseline; 21 another nightly of the same playbook holds the lock.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Optional

import yaml

from orchestrator.ground import console, paths
from orchestrator.playbook.engine import run_playbook as run_with_engine
from orchestrator.ground.errors import ConfigError, ExitCode, OrchError
from orchestrator.ground.verdicts import OK, exit_code_for
from orchestrator.nightly import notify_apprise, textfile
from orchestrator.runs import acks, history, noise
from orchestrator.runs.baseline import choose_baseline, newest_night, same_shape_nights
from orchestrator.runs.compare import (DEFAULT_THRESHOLD, Change, Comparison, compare,
                                      environment_diff, throughput)
from orchestrator.runs.model import RunRecord, now_iso
from orchestrator.runs.report import write_reports
from orchestrator.runs.store import RunStore
from orchestrator.playbook.steps.base import Reporter

NOTIFY_TIMEOUT_S = 15.0
NOTIFY_WHEN = ("always", "problems", "never")
MAX_REPEAT = 20        # runs in one night: more is a benchmark campaign, not a nightly

class NightlyLocked(OrchError):
    exit_code = ExitCode.LOCKED


# ------------------------------------------------------------------ the lock
def playbook_key(playbook: str) -> str:
    """A file-name-safe key for a playbook: its name plus a hash of its absolute path, so two
    playbooks called dflash.yaml in different folders get different locks and schedules."""
    absolute = os.path.abspath(os.path.expanduser(playbook))
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.splitext(os.path.basename(absolute))[0]).strip("-.")
    return f"{stem or 'playbook'}-{hashlib.sha256(absolute.encode()).hexdigest()[:8]}"


class NightlyLock:
    """An exclusive, non-blocking flock on data_dir/locks/nightly-KEY.lock.

    flock, not a pid file: the kernel drops the lock when the holder dies, even by kill -9,
    so a crashed nightly never blocks the next night. The holder writes its pid and start
    time into the file only so the loser can say who holds it.
    """

    def __init__(self, playbook: str):
        self.playbook = playbook
        self.path = os.path.join(paths.data_dir(), "locks", f"nightly-{playbook_key(playbook)}.lock")
        self._fd: Optional[int] = None

    def acquire(self) -> "NightlyLock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise NightlyLocked(
                f"another orch nightly of {self.playbook} is running"
                + (f" (pid {holder.get('pid')}, since {holder.get('since')})" if holder else "")
                + "; this one exits without running",
                hint=f"lock file {self.path}")
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "since": now_iso(),
                                 "playbook": self.playbook}).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            # Empty the file before unlocking so no later reader reports a stale holder.
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "NightlyLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------ configuration
@dataclass
class NotifyConfig:
    webhooks: list[str] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)   # argv lists, never shell text
    apprise: list[notify_apprise.AppriseSource] = field(default_factory=list)  # where its URLs are
    when: str = "always"                                      # always | problems | never


@dataclass
class NightlyConfig:
    threshold: float = DEFAULT_THRESHOLD
    repeat: int = 1                  # runs of the playbook per night, judged together
    prometheus_dir: Optional[str] = None   # node_exporter's textfile directory (nightly/textfile.py)
    notify: NotifyConfig = field(default_factory=NotifyConfig)


def config_path() -> str:
    return os.path.join(paths.data_dir(), "nightly.yaml")


def load_config(path: Optional[str] = None) -> NightlyConfig:
    """data_dir/nightly.yaml (optional). Example:

        threshold: 0.10            # flag throughput drops of more than 10 %
        repeat: 3                  # run the playbook 3 times a night, judge on all 3
        prometheus_dir: /var/lib/node_exporter/textfile   # write orch_nightly_KEY.prom there
        notify:
          when: always             # always | problems | never
          webhook: https://hooks.example.com/services/T000/B000/XXXX
          command: [notify-send, "orch nightly"]     # argv; the summary JSON arrives on stdin
          apprise_config: apprise.txt                # apprise URLs, one a line (orch[notify])
          apprise_env: ORCH_APPRISE_URLS             # or: a variable holding them
    """
    explicit = path is not None
    path = path or config_path()
    if not os.path.exists(path):
        if explicit:
            raise ConfigError(f"{path}: no such nightly config file")
        return NightlyConfig()
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with threshold and notify")
    config = NightlyConfig()
    unknown = set(data) - {"threshold", "repeat", "prometheus_dir", "notify"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}",
                          hint="known keys: threshold, repeat, prometheus_dir, notify")
    if "prometheus_dir" in data:
        config.prometheus_dir = check_prometheus_dir(data["prometheus_dir"],
                                                     where=f"{path}: prometheus_dir",
                                                     base=os.path.dirname(os.path.abspath(path)))
    if "threshold" in data:
        config.threshold = parse_threshold(data["threshold"], where=path)
    if "repeat" in data:
        config.repeat = parse_repeat(data["repeat"], where=f"{path}: repeat")
    notify = data.get("notify") or {}
    if not isinstance(notify, dict):
        raise ConfigError(f"{path}: notify must be a mapping (webhook, command, when)")
    unknown = set(notify) - {"webhook", "webhooks", "command", "commands", "when",
                             "apprise_config", "apprise_env"}
    if unknown:
        raise ConfigError(f"{path}: unknown notify key(s) {', '.join(sorted(unknown))}",
                          hint="known: webhook, command, apprise_config, apprise_env, when")
    for key in ("apprise_config", "apprise_env"):
        if key in notify:
            source = notify_apprise.source_from_config(key, notify[key],
                                                       os.path.dirname(os.path.abspath(path)), path)
            if source.path and notify_apprise.readable_by_others(source.path):
                console.warn(f"{source.path} holds apprise URLs (secrets) and other users can "
                             f"read it: chmod 600 {source.path}")
            config.notify.apprise.append(source)
    for key in ("webhook", "webhooks"):
        value = notify.get(key)
        for url in ([value] if isinstance(value, str) else value or []):
            config.notify.webhooks.append(check_webhook(str(url), where=path))
    for key in ("command", "commands"):
        value = notify.get(key)
        if value is None:
            continue
        argvs = [value] if value and all(isinstance(v, str) for v in value) else value
        if isinstance(value, str) or not isinstance(argvs, list):
            raise ConfigError(f"{path}: notify.{key} must be an argv list such as "
                              f"[notify-send, 'orch nightly'], not a shell string")
        for argv in argvs:
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ConfigError(f"{path}: notify.{key} entries must be non-empty argv lists")
            config.notify.commands.append(list(argv))
    when = notify.get("when", "always")
    if when not in NOTIFY_WHEN:
        raise ConfigError(f"{path}: notify.when must be one of {', '.join(NOTIFY_WHEN)}")
    config.notify.when = when
    return config


def parse_threshold(value, where: str = "--threshold") -> float:
    """0.1, "10%" or 10 (a number >= 1 is read as percent)."""
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(f"{where}: threshold {value!r} is not a number (use 0.1 or 10%)")
    if number >= 1:
        number /= 100
    if not 0 <= number < 1:
        raise ConfigError(f"{where}: threshold {value!r} must be between 0 and 100 %")
    return number


def parse_repeat(value, where: str = "--repeat") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise ConfigError(f"{where}: {value!r} is not a whole number of runs")
    number = int(value)
    if not 1 <= number <= MAX_REPEAT:
        raise ConfigError(f"{where}: {number} runs a night; between 1 and {MAX_REPEAT}")
    return number


def check_prometheus_dir(value, where: str = "--prometheus-dir", base: str = "") -> str:
    """An existing directory (node_exporter's textfile collector reads every *.prom in it);
    a relative one is taken from BASE (nightly.yaml's folder), else the working directory."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a directory")
    directory = os.path.abspath(os.path.join(base, os.path.expanduser(value)))
    if not os.path.isdir(directory):
        raise ConfigError(f"{where}: {directory} is not a directory",
                          hint="create it, or point it at node_exporter's "
                               "--collector.textfile.directory")
    return directory


def check_webhook(url: str, where: str = "--notify-webhook") -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}: webhook {redact_url(url)} is not an http(s) URL")
    return url


def redact_url(url: str) -> str:
    """scheme://host/… : webhook URLs carry their secret in the path, the query or the
    user-info (Slack, Discord, ntfy tokens), so nothing past the host is ever shown."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
    except ValueError:
        return "<webhook>"
    if not parts.scheme or not host:
        return "<webhook>"
    tail = "/…" if (parts.path not in ("", "/") or parts.query or parts.fragment) else ""
    return f"{parts.scheme}://{host}{tail}"


# ------------------------------------------------------------------ outcome
@dataclass
class NightlyOutcome:
    record: RunRecord
    baseline: Optional[RunRecord]
    comparison: Comparison
    exit_code: int
    reports: dict[str, str]
    baseline_reason: str = ""
    notified: list[dict] = field(default_factory=list)
    judgement: Optional[noise.NoiseJudgement] = None
    night: list[RunRecord] = field(default_factory=list)    # the night's runs; record is the last
    textfile: Optional[str] = None                          # the Prometheus file written, if any

    @property
    def status(self) -> str:
        if self.record.verdict != OK:
            return self.record.verdict
        if self.comparison.regressed:
            return "regression"
        return "suspected" if self.suspected else "ok"

    @property
    def suspected(self) -> list[Change]:
        return [c for c in self.comparison.changes if c.severity == noise.SUSPECTED]

    @property
    def acknowledged(self) -> list[Change]:
        return [c for c in self.comparison.changes if c.severity == noise.ACKNOWLEDGED]

    def summary(self) -> dict:
        """The short summary sent to notifiers and printed with --json."""
        tp = throughput(self.record)
        total = self.comparison.throughput.get("total", {})
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "run_id": self.record.run_id,
            "runs": [run.run_id for run in self.night or [self.record]],
            "playbook": self.record.playbook,
            "verdict": self.record.verdict,
            "started_at": self.record.started_at,
            "ended_at": self.record.ended_at,
            "duration_s": night_duration(self.night or [self.record]),
            "total_tok_s": tp["total"],
            "per_drafter_tok_s": tp["per_drafter"],
            "baseline": self.baseline.run_id if self.baseline else None,
            "baseline_reason": self.baseline_reason,
            "throughput_change": total.get("change"),
            "regressions": [c.message for c in self.comparison.regressions],
            "suspected": [c.message for c in self.suspected],
            "acknowledged": [c.message for c in self.acknowledged],
            "environment": environment_diff(self.comparison),
            "noise": self.judgement.to_dict() if self.judgement else None,
            "findings": [f"{f.signature}: {f.message}" for f in self.record.findings],
            "torch": {t.name: t.torch_version for t in self.record.targets},
            "fx_tls": {t.name: t.fx_tls_state for t in self.record.targets},
            "report_html": self.reports.get("html"),
            "report_md": self.reports.get("md"),
            "text": self.text(),
        }

    def text(self) -> str:
        """One line for a chat message or a mail subject."""
        tp = throughput(self.record)["total"]
        head = f"orch nightly {os.path.basename(self.record.playbook)}: {self.status.upper()}"
        parts = [f"run {self.record.run_id}", f"verdict {self.record.verdict}"]
        if len(self.night) > 1:
            parts[0] = f"{len(self.night)} runs (last {self.record.run_id})"
            total = next((m for m in (self.judgement.metrics if self.judgement else [])
                          if m.metric == "total"), None)
            if total and total.tonight is not None:
                parts.append(f"{total.tonight:,.0f} tok/s, the mean of {total.repeats} runs")
                tp = None
        if tp:
            change = self.comparison.throughput.get("total", {}).get("change")
            parts.append(f"{tp:,.0f} tok/s" + (f" ({change * 100:+.1f} % vs baseline)"
                                              if change is not None else ""))
        flagged = self.comparison.regressions or self.suspected
        if flagged:
            parts.append("; ".join(c.message for c in flagged[:3]) + (" …" if len(flagged) > 3 else ""))
        known = [c.detail.get("metric") for c in self.acknowledged]
        if known:
            parts.append(f"{len(known)} acknowledged slow-down(s): {', '.join(known)}")
        return head + " - " + ", ".join(parts)


def night_duration(night: list[RunRecord]) -> Optional[float]:
    """Seconds the night's runs took, end to end, summed (None: a run without an end)."""
    total = 0.0
    for record in night:
        try:
            total += (datetime.fromisoformat(record.ended_at)
                      - datetime.fromisoformat(record.started_at)).total_seconds()
        except (TypeError, ValueError):
            return None
    return total


def outcome_code(record: RunRecord, comparison: Comparison) -> int:
    if record.exit_code == ExitCode.USAGE:
        return ExitCode.USAGE          # the engine found a mistake in the playbook's steps
    if record.verdict != OK:
        return exit_code_for(record.verdict)
    return ExitCode.REGRESSION if comparison.regressed else ExitCode.OK


# ------------------------------------------------------------------ running it
RunFunction = Callable[..., RunRecord]


def run_playbook(playbook: str, *, targets: list[str], extra_vars: dict[str, str],
                 reporter: Reporter, inventory: Optional[str] = None,
                 trust_on_first_use: bool = False) -> RunRecord:
    """The one place that runs the playbook (the step engine), on the inventory given with
    -i (None: the default one)."""
    return run_with_engine(playbook, targets=targets, extra_vars=extra_vars, reporter=reporter,
                           inventory=inventory, trust_on_first_use=trust_on_first_use)


def nightly(playbook: str, *, targets: list[str], extra_vars: dict[str, str],
            reporter: Optional[Reporter] = None, inventory: Optional[str] = None,
            trust_on_first_use: bool = False, config: Optional[NightlyConfig] = None,
            store: Optional[RunStore] = None, run: Optional[RunFunction] = None) -> NightlyOutcome:
    """Run PLAYBOOK config.repeat times under the lock; compare, report, notify. Raises
    NightlyLocked. run(playbook, targets=, extra_vars=) runs it (default: the engine,
    reporting to reporter)."""
    config = config or NightlyConfig()
    if run is None:
        run = functools.partial(run_playbook, reporter=reporter, inventory=inventory,
                                trust_on_first_use=trust_on_first_use)
    with NightlyLock(playbook):
        own_store = store is None
        store = store or RunStore()
        try:
            night = run_night(playbook, run, store, config, targets=targets, extra_vars=extra_vars)
            record = night[-1]
            # Chosen once the run is known: the baseline must have its shape (runs/baseline.py).
            choice = choose_baseline(store, record)
            baseline = choice.record
            comparison = compare(baseline, record, config.threshold)
            judgement = judge_noise(store, night)
            acks.apply(store, record.playbook, judgement)
            noise.apply_to(comparison, judgement)
            directory = record.artifacts_dir or paths.run_dir(record.run_id)
            reports = write_reports(record, baseline, directory, comparison=comparison,
                                    baseline_reason=choice.reason, noise=judgement,
                                    history=playbook_nights(store, record))
            outcome = NightlyOutcome(record, baseline, comparison,
                                     outcome_code(record, comparison), reports,
                                     baseline_reason=choice.reason, judgement=judgement,
                                     night=night)
            _write_json(os.path.join(directory, "nightly.json"), outcome.summary())
            if config.prometheus_dir:
                outcome.textfile = write_textfile(config.prometheus_dir, playbook, outcome)
            outcome.notified = notify(outcome, config.notify)
            return outcome
        finally:
            if own_store:
                store.close()


def playbook_nights(store: RunStore, record: RunRecord) -> Optional[history.History]:
    """The playbook's nights through RECORD's with their change points, for the report's
    chart; None for a run without an ok night of its shape (nothing to plot)."""
    try:
        return history.playbook_history(store, record.playbook, until=record)
    except OrchError:
        return None


def run_night(playbook: str, run: RunFunction, store: RunStore, config: NightlyConfig, *,
              targets: list[str], extra_vars: dict[str, str]) -> list[RunRecord]:
    """The night's runs, as the store has them, each marked with its night in its summary
    (runs/baseline.py night_of). A run that is not ok ends the night: its verdict is the
    night's, and more runs would say no more."""
    night: list[RunRecord] = []
    for repeat in range(1, config.repeat + 1):
        if config.repeat > 1:
            console.info(f"nightly run {repeat} of {config.repeat}")
        try:
            record = run(playbook, targets=targets, extra_vars=extra_vars)
        except OrchError as error:
            # No run at all (bad playbook, unknown target, ...): the scheduler's user
            # still hears about it, then the error exits with its own code.
            notify_error(playbook, error, config.notify)
            raise
        # Reload: the store has everything the engine saved (its record may be partial).
        try:
            record = store.get(record.run_id)
        except OrchError:
            store.begin(record)   # a run function that did not record it: keep it anyway
        if config.repeat > 1:
            record.summary = {**(record.summary or {}), "nightly": {
                "night": night[0].run_id if night else record.run_id, "repeat": repeat,
                "repeats": config.repeat}}
            store.update(record)
        night.append(record)
        if record.verdict != OK or record.exit_code == ExitCode.USAGE:
            break
    return night


def judge_noise(store: RunStore, night: list[RunRecord]) -> noise.NoiseJudgement:
    """Tonight's throughput (the mean of its ok runs) against the noise of the nights of its
    shape before it (one more than the window: the previous night is judged again for the
    persistence rule) and against their change points (noise.HISTORY nights)."""
    tonight = [record for record in night if record.verdict == OK] or night[-1:]
    history = same_shape_nights(store, night, max(noise.WINDOW + 1, noise.HISTORY))
    return noise.judge(noise.profile_night(tonight),
                       [noise.profile_night(runs) for runs in history])


def write_textfile(directory: str, playbook: str, outcome: "NightlyOutcome") -> Optional[str]:
    """The night's Prometheus textfile; a failure to write it is a warning (the night's
    verdict does not depend on a dashboard)."""
    try:
        return textfile.write(directory, playbook_key(playbook), outcome.summary())
    except OSError as error:
        console.warn(f"could not write the Prometheus textfile into {directory}: "
                     f"{error.strerror or error}")
        return None


def last_night(store: RunStore, playbook: str) -> tuple[list[RunRecord], noise.NoiseJudgement]:
    """The newest night of PLAYBOOK (its runs, with their series) and the noise model's
    judgement of it, before any acknowledgement: what `orch runs ack` acknowledges."""
    night = newest_night(store, playbook, repeats=MAX_REPEAT)
    return night, judge_noise(store, night)


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


# ------------------------------------------------------------------ notifying
def notify(outcome: NightlyOutcome, config: NotifyConfig) -> list[dict]:
    """Send the summary to every webhook, command and apprise target; a failed one is reported
    (warning + the returned list) but never changes the nightly's exit code."""
    if config.when == "never" or (config.when == "problems" and outcome.exit_code == ExitCode.OK):
        return []
    summary = outcome.summary()
    return _send_all(summary, config)


def _send_all(summary: dict, config: NotifyConfig) -> list[dict]:
    results = [post_webhook(url, summary) for url in config.webhooks]
    results += [run_notify_command(argv, summary) for argv in config.commands]
    for source in config.apprise:
        results += notify_apprise.send(source, summary)
    for result in results:
        if not result["ok"]:
            console.warn(f"notification to {result['to']} failed: {result['error']}")
    return results


def notify_error(playbook: str, error: OrchError, config: NotifyConfig) -> list[dict]:
    if config.when == "never":
        return []
    message = str(error).splitlines()[0]
    summary = {"status": "error", "exit_code": error.exit_code, "run_id": None,
               "playbook": playbook, "verdict": None, "regressions": [], "findings": [],
               "error": message, "report_html": None,
               "text": f"orch nightly {os.path.basename(playbook)}: ERROR - {message}"}
    return _send_all(summary, config)


def post_webhook(url: str, summary: dict, timeout: float = NOTIFY_TIMEOUT_S) -> dict:
    shown = redact_url(url)
    body = json.dumps(summary, default=str).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "orch-nightly"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return {"to": shown, "ok": 200 <= response.status < 300, "status": response.status,
                    "error": None if 200 <= response.status < 300 else f"HTTP {response.status}"}
    except urllib.error.HTTPError as error:
        return {"to": shown, "ok": False, "status": error.code, "error": f"HTTP {error.code}"}
    except (urllib.error.URLError, OSError, ValueError) as error:
        # str(URLError) can hold the URL for some failures: describe by type and reason only.
        reason = getattr(error, "reason", error)
        return {"to": shown, "ok": False, "status": None,
                "error": f"{type(error).__name__}: {_scrub(str(reason), url)}"}


def _scrub(text: str, url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    for secret in {url, parts.path, parts.query, parts.password or "", parts.username or ""}:
        if secret and len(secret) > 1:
            text = text.replace(secret, "…")
    return text


def run_notify_command(argv: list[str], summary: dict, timeout: float = 60.0) -> dict:
    """Run ARGV (no shell) with the summary as JSON on stdin and in ORCH_* variables."""
    env = dict(os.environ, ORCH_STATUS=summary["status"], ORCH_RUN_ID=summary["run_id"] or "",
               ORCH_VERDICT=summary["verdict"] or "", ORCH_EXIT_CODE=str(summary["exit_code"]),
               ORCH_SUMMARY=summary["text"], ORCH_REPORT=summary.get("report_html") or "")
    shown = argv[0]   # the rest of the argv may hold a token
    try:
        done = subprocess.run(argv, input=json.dumps(summary, default=str).encode(), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"to": shown, "ok": False, "status": None, "error": type(error).__name__ + ": " +
                (error.strerror if isinstance(error, OSError) and error.strerror else "timed out")}
    return {"to": shown, "ok": done.returncode == 0, "status": done.returncode,
            "error": None if done.returncode == 0 else f"exit code {done.returncode}"}
