"""Nightly notifications through apprise: Slack, Matrix, Teams, ntfy, email, ... from one URL each.

Why apprise: one maintained library speaks the ~100 services a team may already watch, each
configured by one URL (slack://T000/B000/XXXX, ntfys://topic, mailtos://user:pass@host);
orch only writes the message. It is an optional extra (`pip install 'orch[notify]'`): about
14 MB installed plus markdown and requests-oauthlib, for users who want it; without it the
webhook and command notifications work as before and an apprise target says it is missing.

An apprise URL holds its service's secret (a token in the path, a password in the user-info),
so URLs never come from argv and are never shown: nightly.yaml names where they are,

    notify:
      apprise_config: ~/.config/orch/apprise.txt   # one URL per line, '#' comments (chmod 600)
      apprise_env: ORCH_APPRISE_URLS               # or a variable: URLs split by spaces or commas

and a target is shown as its position and service ("apprise 1 (Slack)"): even apprise's own
privacy form of a URL keeps the path, where many services keep their token. apprise's log
messages, and urllib3's under it, can quote a URL too: they are held back while it sends
(HELD_LOGGERS: not propagated to any logging, never printed); a failure says to run
apprise's own command, reading the same file or variable, to see why.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import Optional

from orchestrator.ground.errors import ConfigError
from orchestrator.ground.verdicts import DEGRADED, FAILED, HANG, UNREACHABLE

EXTRA_HINT = "pip install 'orch[notify]'"
MAX_BODY_LINES = 20
MAX_LINE = 300
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The summary statuses that make a chat message red or yellow rather than green.
NOTIFY_TYPES = {"regression": "failure", "error": "failure", FAILED: "failure", HANG: "failure",
                UNREACHABLE: "failure", DEGRADED: "warning", "suspected": "warning"}


@dataclass
class AppriseSource:
    """Where one set of apprise URLs is read from: a file (one per line) or a variable."""
    path: Optional[str] = None
    env: Optional[str] = None

    def describe(self) -> str:
        return f"apprise ({self.path})" if self.path else f"apprise (${self.env})"


def source_from_config(key: str, value, config_dir: str, where: str) -> AppriseSource:
    """nightly.yaml's notify.apprise_config (a path, relative to the config's folder) or
    notify.apprise_env (a variable name), checked now so a typo fails before the night."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: notify.{key} must be a {'path' if key == 'apprise_config' else 'variable name'}")
    if key == "apprise_env":
        if not ENV_NAME.fullmatch(value):
            raise ConfigError(f"{where}: notify.apprise_env {value!r} is not a variable name "
                              "(the URLs go in the variable, not in nightly.yaml)")
        return AppriseSource(env=value)
    path = os.path.join(config_dir, os.path.expanduser(value))
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: notify.apprise_config {path}: no such file")
    return AppriseSource(path=path)


def readable_by_others(path: str) -> bool:
    return bool(os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH))


def read_urls(source: AppriseSource) -> list[str]:
    """The source's URLs (ConfigError naming the file or variable, never a URL)."""
    if source.env:
        return [url for url in re.split(r"[\s,]+", os.environ.get(source.env, "")) if url]
    try:
        with open(source.path, encoding="utf-8") as handle:
            lines = handle.read(1 << 20).splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{source.path}: cannot read the apprise URLs: "
                          f"{getattr(error, 'strerror', None) or type(error).__name__}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def chat_message(summary: dict) -> tuple[str, str]:
    """(title, body) for a chat: the status line, the numbers behind it, what changed, the
    report's path. Bounded: a summary with 300 findings is still a message."""
    title = summary["text"].split(" - ", 1)[0]
    lines = [summary["text"]]
    for key, word in (("regressions", "regression"), ("suspected", "suspected"),
                      ("acknowledged", "acknowledged")):
        lines += [f"{word}: {message}" for message in summary.get(key) or []]
    if summary.get("error"):
        lines.append(f"error: {summary['error']}")
    lines += [f"changed: {line}" for line in summary.get("environment") or []]
    lines += [f"finding: {finding}" for finding in (summary.get("findings") or [])[:3]]
    if summary.get("report_html"):
        lines.append(f"report: {summary['report_html']}")
    if len(lines) > MAX_BODY_LINES:
        lines = lines[:MAX_BODY_LINES - 1] + [f"... ({len(lines) - MAX_BODY_LINES + 1} more lines in the report)"]
    return title, "\n".join(line if len(line) <= MAX_LINE else line[:MAX_LINE - 1] + "…"
                            for line in lines)


def retry_hint(source: AppriseSource) -> str:
    """How to see apprise's own reason, with the URLs kept out of argv."""
    if source.path:
        return f"run `apprise -vv -b test -c {source.path}` to see why"
    return f'run `APPRISE_URLS="${source.env}" apprise -vv -b test` to see why'


def send(source: AppriseSource, summary: dict) -> list[dict]:
    """Notify every URL of SOURCE; one result per target ({"to", "ok", "status", "error"},
    as the other notifiers give), never raising for a failed target."""
    shown = source.describe()
    try:
        import apprise   # optional (orch[notify]), and 14 MB: only a nightly that uses it
    except ImportError:
        return [{"to": shown, "ok": False, "status": None,
                 "error": f"apprise is not installed ({EXTRA_HINT})"}]
    try:
        urls = read_urls(source)
    except ConfigError as error:
        return [{"to": shown, "ok": False, "status": None, "error": str(error)}]
    if not urls:
        return [{"to": shown, "ok": False, "status": None, "error": "no apprise URL in it"}]
    title, body = chat_message(summary)
    kind = getattr(apprise.NotifyType, NOTIFY_TYPES.get(summary.get("status"), "success").upper())
    results = []
    with _apprise_logs_held():
        for number, url in enumerate(urls, start=1):
            results.append(_send_one(apprise, f"{shown} target {number}", url, title, body, kind,
                                     retry_hint(source)))
    return results


def _send_one(apprise, shown: str, url: str, title: str, body: str, kind, hint: str) -> dict:
    targets = apprise.Apprise()
    if not targets.add(url):
        return {"to": shown, "ok": False, "status": None,
                "error": "not a URL apprise knows (check the scheme; the URL is not shown)"}
    server = next(iter(targets))
    shown = f"{shown} ({server.service_name})"
    try:
        ok = bool(targets.notify(title=title, body=body, notify_type=kind))
    except Exception as error:    # a plugin's own bug must not end the nightly; no message: it may quote the URL
        return {"to": shown, "ok": False, "status": None, "error": f"apprise raised {type(error).__name__}"}
    return {"to": shown, "ok": ok, "status": None,
            "error": None if ok else f"not delivered ({hint}; orch does not show the URL)"}


# apprise's logger, and the HTTP libraries under it: urllib3 logs each request's path at
# DEBUG ("POST /hook/T0SECRET HTTP/1.1"), which is where many services keep the token.
HELD_LOGGERS = ("apprise", "urllib3", "requests", "requests_oauthlib", "oauthlib")


class _apprise_logs_held:
    """While apprise sends, these loggers keep their records to themselves: they can quote
    a URL. Restored afterwards (the webhook path, urllib.request, logs nothing)."""

    def __enter__(self):
        self.saved = []
        for name in HELD_LOGGERS:
            logger = logging.getLogger(name)
            self.saved.append((logger, logger.propagate, logger.handlers[:], logger.disabled))
            logger.propagate, logger.handlers, logger.disabled = False, [logging.NullHandler()], True
        return self

    def __exit__(self, *exc):
        for logger, propagate, handlers, disabled in self.saved:
            logger.propagate, logger.handlers, logger.disabled = propagate, handlers, disabled
