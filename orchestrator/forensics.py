"""Torch forensics on targets: source search, the fx-tls patch, the FX race reproducer.

Thin controller-side calls of the payloads in orchestrator/payloads/; the CLI commands and
the playbook steps both use these, so a step does exactly what the command does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Optional

from orchestrator import __version__, console
from orchestrator.payloads import run_payload
from orchestrator.remote.container import Target

SEARCH_TIMEOUT = 300.0
PATCH_TIMEOUT = 600.0
RACE_TIMEOUT = 900.0
PATCH_ACTIONS = ("status", "diff", "apply", "revert")


def locate_package(target: Target, package: str = "torch") -> dict:
    return run_payload(target, "torch_locate", {"package": package}, timeout=60)


def search_source(target: Target, pattern: str, *, package: str = "torch", fixed: bool = False,
                  word: bool = False, ignore_case: bool = False, context: int = 0,
                  mode: str = "grep", show: bool = False, engine: str = "auto",
                  max_hits: int = 1000, on_event: Optional[Callable[[dict], None]] = None) -> dict:
    """Search a package's installed Python source; returns the result with 'matches' added."""
    matches: list[dict] = []

    def collect(event: dict) -> None:
        if event.get("event") in ("hit", "def"):
            matches.append(event)
        if on_event:
            on_event(event)

    args = {"package": package, "pattern": pattern, "fixed": fixed, "word": word,
            "ignore_case": ignore_case, "context": context, "mode": mode, "show": show,
            "engine": engine, "max_hits": max_hits}
    result = run_payload(target, "source_search", args, timeout=SEARCH_TIMEOUT, on_event=collect)
    return {**result, "matches": matches}


def fx_patch(target: Target, action: str) -> dict:
    if action not in PATCH_ACTIONS:
        raise ValueError(f"unknown fx-tls action {action!r}")
    return run_payload(target, "fx_patch", {"action": action, "orch_version": __version__},
                       timeout=PATCH_TIMEOUT)


@contextlib.contextmanager
def finish_before_interrupt(action: str):
    """While a patch apply/revert runs, the first Ctrl-C lets it finish instead of leaving it
    behind: the payload goes on in the target anyway (a channel closing does not stop it), so
    leaving at once would report "interrupted" for a change that then completes. Yields a
    list that is non-empty once Ctrl-C was pressed; a second Ctrl-C raises KeyboardInterrupt
    (the caller says the outcome is not known)."""
    pressed: list[float] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed          # signal handlers belong to the main thread
        return

    def on_interrupt(number, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(1.0)
        console.warn(f"interrupted: letting the {action} in progress finish (it takes seconds "
                     "and leaves no half-patched file); Ctrl-C again to leave without knowing "
                     "its outcome")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def verify_fx_race(target: Target, trials: int = 5,
                   on_event: Optional[Callable[[dict], None]] = None) -> dict:
    return run_payload(target, "fx_race", {"trials": trials, "timeout": 120},
                       timeout=RACE_TIMEOUT, on_event=on_event)
