"""`orch schedule`: a real scheduler runs `orch nightly`, orch only writes its entry.

systemd (a .service + .timer pair rendered from templates/orch-nightly.*.j2, user or system
units) where systemd runs, else one crontab line. Each entry carries a marker naming the
playbook key (nightly.playbook_key) so list and remove find exactly orch's own entries.

Quoting: the command stays an argv list until the one place each format needs text:
systemd's ExecStart= rules (systemd_quote) or, for cron, `sh -c` rules (shlex.join), plus
cron's own '%' escape. No user input is ever pasted into either unquoted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import jinja2

from orchestrator.ground import paths
from orchestrator.ground.errors import ConfigError, OrchError
from orchestrator.nightly.rerun import playbook_key
from orchestrator.runs.report import templates_dir

UNIT_PREFIX = "orch-nightly-"
CRON_MARKER = "# orch-schedule "
UNIT_MARKER = "# orch-schedule: "
# Environment a scheduled run must share with the installing shell to find the same store.
CARRIED_ENV = ("ORCH_DATA_DIR", "ORCH_STORE", "ORCH_INVENTORY", "ORCH_TEMPLATES", "XDG_DATA_HOME")


@dataclass
class Entry:
    """One scheduled nightly: what it runs and where it is written."""
    playbook: str             # absolute path
    at: str                   # HH:MM
    kind: str                 # systemd-user | systemd-system | cron
    key: str
    argv: list[str]           # the command the scheduler runs
    workdir: str
    env: dict
    files: list[str]          # unit files, or the crontab file ("crontab" for the user's)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_at(at: str) -> tuple[int, int]:
    match = re.fullmatch(r"([01]?\d|2[0-3]):([0-5]\d)", (at or "").strip())
    if not match:
        raise ConfigError(f"--at {at!r}: expected HH:MM on a 24-hour clock, e.g. 02:30")
    return int(match.group(1)), int(match.group(2))


def nightly_argv(playbook: str, *, targets: list[str], extra_vars: list[str],
                 inventory: Optional[str], extra_args: list[str] = ()) -> list[str]:
    """The scheduled command: this interpreter (the venv orch is installed in) -m orchestrator."""
    argv = [sys.executable, "-m", "orchestrator"]
    if inventory:
        argv += ["-i", inventory if inventory == "sandbox" else os.path.abspath(inventory)]
    argv += ["nightly", playbook]
    for target in targets:
        argv += ["-t", target]
    for pair in extra_vars:
        argv += ["-e", pair]
    return argv + list(extra_args)


def carried_env() -> dict:
    return {name: os.environ[name] for name in CARRIED_ENV if os.environ.get(name)}


# A scheduler entry is line-based: a newline (or CR, ESC, ...) in a path or an argument would
# end a line of the unit or the crontab and start one of the caller's. Tab is the exception:
# every format here quotes or escapes it.
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# systemd.time(7) spans: "6h", "90min", "1h 30min", "2.5h", "infinity"
TIME_SPAN = re.compile(r"infinity|(?:\d+(?:\.\d+)?\s*(?:us|usec|ms|msec|s|sec|second|seconds|m|"
                       r"min|minute|minutes|h|hr|hour|hours|d|day|days|w|week|weeks)?\s*)+")


def check_entry(entry: "Entry") -> None:
    """Refuse what no scheduler line can carry safely (ConfigError: exit 2)."""
    values = [("the playbook path", entry.playbook), ("the working directory", entry.workdir)]
    values += [("an argument", arg) for arg in entry.argv]
    values += [(f"environment variable {name}", f"{name}={value}") for name, value in entry.env.items()]
    for what, value in values:
        found = CONTROL_CHARACTER.search(value)
        if found:
            raise ConfigError(f"{what} {value!r} holds a control character ({found.group()!r}): "
                              "a schedule entry cannot carry it")


def check_timeout(timeout: str) -> str:
    text = str(timeout).strip()
    if not TIME_SPAN.fullmatch(text):
        raise ConfigError(f"--timeout {timeout!r}: expected a systemd time span, e.g. 6h, 90min, "
                          "1h 30min, or infinity")
    return text


# ------------------------------------------------------------------ systemd
def systemd_quote(arg: str) -> str:
    """One ExecStart= word: systemd splits on whitespace, honours "..." with C escapes, and
    expands %specifiers and $VARIABLES, so escape all of those."""
    text = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    if text and not re.search(r"[\s\"'\\;]", text):
        return text
    return f'"{text}"'


def systemd_env(assignment: str) -> str:
    """One Environment= assignment: quoted, C-escaped, %specifiers escaped; '$' is literal
    there (systemd does no variable expansion in Environment=)."""
    text = assignment.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return '"' + text.replace("\n", "\\n").replace("\t", "\\t") + '"'


def systemd_value(text: str) -> str:
    """A free-text value (Description=, WorkingDirectory=): the %specifiers escaped, one line;
    a trailing backslash would join the next line of the unit to it, so it is refused."""
    text = str(text).replace("%", "%%").replace("\n", " ")
    if text.endswith("\\"):
        raise ConfigError(f"{text!r} ends with a backslash, which systemd reads as a line "
                          "continuation: rename it")
    return text


def unit_dir(system: bool) -> str:
    if system:
        return "/etc/systemd/system"
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "systemd", "user")


def unit_names(key: str) -> tuple[str, str]:
    return f"{UNIT_PREFIX}{key}.service", f"{UNIT_PREFIX}{key}.timer"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates_dir()), autoescape=False,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["sdq"] = systemd_quote
    env.filters["sdv"] = systemd_value
    env.filters["sdenv"] = systemd_env
    return env


def render_systemd(entry: Entry, *, timeout: str = "6h") -> dict[str, str]:
    """{unit file name: text} for the .service and the .timer."""
    hour, minute = parse_at(entry.at)
    check_entry(entry)
    service, timer = unit_names(entry.key)
    marker = UNIT_MARKER + json.dumps({"playbook": entry.playbook, "at": entry.at,
                                       "kind": entry.kind, "key": entry.key})
    context = {"entry": entry, "marker": marker, "service": service, "timer": timer,
               "exec_start": " ".join(systemd_quote(a) for a in entry.argv),
               "on_calendar": f"*-*-* {hour:02d}:{minute:02d}:00", "timeout": check_timeout(timeout),
               "system": entry.kind == "systemd-system"}
    env = _templates()
    return {service: env.get_template("orch-nightly.service.j2").render(context),
            timer: env.get_template("orch-nightly.timer.j2").render(context)}


# ------------------------------------------------------------------ cron
def cron_line(entry: Entry, *, log: Optional[str] = None) -> str:
    """MM HH * * * cd DIR && exec env VAR=... ARGV... >>LOG 2>&1 # orch-schedule {...}

    cron hands the command to /bin/sh: every word goes through shlex.quote exactly once.
    Then cron's one rule of its own: an unescaped % ends the command, so % becomes \\%.
    """
    hour, minute = parse_at(entry.at)
    check_entry(entry)
    log = log or os.path.join(paths.data_dir(), "logs", f"nightly-{entry.key}.log")
    env_words = [f"{k}={v}" for k, v in sorted(entry.env.items())]
    command = (f"cd {shlex.quote(entry.workdir)} && "
               + shlex.join(["exec", "env", *env_words, *entry.argv])
               + f" >>{shlex.quote(log)} 2>&1")
    marker = json.dumps({"playbook": entry.playbook, "at": entry.at, "key": entry.key},
                        separators=(",", ":"))
    line = f"{minute} {hour} * * * {command.replace('%', chr(92) + '%')} {CRON_MARKER}{marker}"
    if "\n" in line:
        raise ConfigError("a crontab entry cannot hold a newline (check the arguments)")
    return line


def parse_cron_line(line: str) -> Optional[dict]:
    """An orch crontab line -> {minute, hour, command (sh text), marker}; None for other lines."""
    if CRON_MARKER not in line or line.lstrip().startswith("#"):
        return None
    body, _, marker = line.rpartition(" " + CRON_MARKER)
    fields = body.split(None, 5)
    if len(fields) != 6:
        return None
    try:
        meta = json.loads(marker)
    except ValueError:
        return None
    return {"minute": fields[0], "hour": fields[1], "dom": fields[2], "month": fields[3],
            "dow": fields[4], "command": fields[5].replace("\\%", "%"), "marker": meta}


def _read_crontab(crontab_file: Optional[str]) -> list[str]:
    if crontab_file:
        if not os.path.exists(crontab_file):
            return []
        with open(crontab_file, encoding="utf-8") as handle:
            return handle.read().splitlines()
    if not shutil.which("crontab"):
        raise OrchError("cron is not installed here (no `crontab` command)",
                        hint="install cron (apt-get install cron); or, where systemd runs, drop "
                             "--cron for a systemd timer; --dest DIR writes the units for review")
    done = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        if "no crontab" in done.stderr.lower():
            return []
        raise OrchError(f"crontab -l failed: {done.stderr.strip()}")
    return done.stdout.splitlines()


def _write_crontab(lines: list[str], crontab_file: Optional[str]) -> None:
    text = "\n".join(lines) + "\n" if lines else ""
    if crontab_file:
        os.makedirs(os.path.dirname(os.path.abspath(crontab_file)), exist_ok=True)
        tmp = f"{crontab_file}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, crontab_file)
        return
    done = subprocess.run(["crontab", "-"], input=text, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OrchError(f"crontab - failed: {done.stderr.strip()}")


# ------------------------------------------------------------------ install / list / remove
def systemd_available() -> bool:
    """systemd is the init system here (sd_booted()'s own test) and systemctl exists."""
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def choose_kind(*, cron: bool, system: bool, dest: Optional[str]) -> str:
    if cron:
        return "cron"
    if dest or systemd_available():
        return "systemd-system" if system else "systemd-user"
    return "cron"


def make_entry(playbook: str, at: str, *, kind: str, targets: list[str], extra_vars: list[str],
               inventory: Optional[str], workdir: Optional[str] = None) -> Entry:
    hour, minute = parse_at(at)
    at = f"{hour:02d}:{minute:02d}"
    absolute = os.path.abspath(os.path.expanduser(playbook))
    if not os.path.isfile(absolute):
        raise ConfigError(f"no playbook {playbook} ({absolute})")
    return Entry(playbook=absolute, at=at, kind=kind, key=playbook_key(absolute),
                 argv=nightly_argv(absolute, targets=targets, extra_vars=extra_vars,
                                   inventory=inventory),
                 workdir=os.path.abspath(workdir or os.getcwd()), env=carried_env(), files=[])


def install(entry: Entry, *, dest: Optional[str] = None, crontab_file: Optional[str] = None,
            enable: bool = True, timeout: str = "6h") -> Entry:
    """Write the entry (replacing one for the same playbook); enable the timer when the units
    went to the real unit directory and systemd runs."""
    if entry.kind == "cron":
        line = cron_line(entry)
        os.makedirs(os.path.join(paths.data_dir(), "logs"), exist_ok=True)
        lines = [l for l in _read_crontab(crontab_file)
                 if (parse_cron_line(l) or {}).get("marker", {}).get("key") != entry.key]
        _write_crontab(lines + [line], crontab_file)
        entry.files = [crontab_file or "crontab"]
        return entry
    directory = dest or unit_dir(entry.kind == "systemd-system")
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, text in render_systemd(entry, timeout=timeout).items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        written.append(path)
    entry.files = written
    if enable and dest is None and systemd_available():
        _systemctl(entry.kind, ["daemon-reload"])
        _systemctl(entry.kind, ["enable", "--now", unit_names(entry.key)[1]])
    return entry


def _systemctl(kind: str, args: list[str]) -> None:
    argv = ["systemctl"] + (["--user"] if kind == "systemd-user" else []) + args
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise OrchError(f"{shlex.join(argv)} failed: {done.stderr.strip()}")


def list_entries(*, dest: Optional[str] = None, crontab_file: Optional[str] = None,
                 include_cron: bool = True) -> list[dict]:
    """Every orch schedule: systemd user and system units (or DEST), and crontab entries."""
    found = []
    directories = [(dest, None)] if dest else [(unit_dir(False), "systemd-user"),
                                                (unit_dir(True), "systemd-system")]
    for directory, _kind in directories:
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            if not (name.startswith(UNIT_PREFIX) and name.endswith(".timer")):
                continue
            path = os.path.join(directory, name)
            meta = _unit_marker(path)
            if meta is None:
                continue
            service = os.path.join(directory, name[:-len(".timer")] + ".service")
            found.append({**meta, "files": [path] + ([service] if os.path.exists(service) else [])})
    if include_cron and (crontab_file or (not dest and shutil.which("crontab"))):
        try:
            lines = _read_crontab(crontab_file)
        except OrchError:
            lines = []
        for line in lines:
            parsed = parse_cron_line(line)
            if parsed:
                found.append({**parsed["marker"], "kind": "cron",
                              "files": [crontab_file or "crontab"], "line": line})
    return found


def _unit_marker(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(UNIT_MARKER):
                    return json.loads(line[len(UNIT_MARKER):])
    except (OSError, ValueError):
        return None
    return None


def remove(playbook: str, *, dest: Optional[str] = None, crontab_file: Optional[str] = None,
           disable: bool = True) -> list[str]:
    """Remove every schedule of PLAYBOOK; returns what was removed (files or 'crontab')."""
    key = playbook_key(playbook)
    removed = []
    for item in list_entries(dest=dest, crontab_file=crontab_file):
        if item.get("key") != key:
            continue
        if item["kind"] == "cron":
            lines = [l for l in _read_crontab(crontab_file)
                     if (parse_cron_line(l) or {}).get("marker", {}).get("key") != key]
            _write_crontab(lines, crontab_file)
            removed.append(crontab_file or "crontab")
            continue
        if disable and dest is None and systemd_available():
            _systemctl(item["kind"], ["disable", "--now", unit_names(key)[1]])
        for path in item["files"]:
            os.unlink(path)
            removed.append(path)
        if disable and dest is None and systemd_available():
            _systemctl(item["kind"], ["daemon-reload"])
    return removed
