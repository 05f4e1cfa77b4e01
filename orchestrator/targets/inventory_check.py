"""`orch inventory check` as plain data: probe every container at once and say, per
container, whether it is reachable and running, its python, venv and GPUs, and what is
wrong. The CLI prints the rows as a table or JSON; the MCP tool returns them.
"""

from __future__ import annotations

from typing import Callable, Optional

from orchestrator.config.concurrency import DEFAULT_JOBS
from orchestrator.targets import distro

from orchestrator.remote import payload_api
from orchestrator.ground.errors import ConnectionProblem, OrchError, PayloadError
from orchestrator.targets.fleet import each_concurrently
from orchestrator.remote.container import Target


def check_targets(targets: list[Target], jobs: int = DEFAULT_JOBS,
                  on_done: Optional[Callable[[Target, object], None]] = None) -> list[dict]:
    """One row per target: {"target", "where", "ok", "reachable", "running", ...}; a target
    the probe could not run on has "error" (the sentence), one it ran on has "problems".
    At most `jobs` are probed at once; on_done is told of each as it ends."""
    rows = []
    for target, report in zip(targets, each_concurrently(targets, check_target, jobs,
                                                         on_done=on_done)):
        if isinstance(report, OrchError):
            rows.append({"target": target.name, "where": target.describe(), "ok": False,
                         "reachable": reachable(report), "running": False, "error": str(report)})
        else:
            rows.append({"target": target.name, "where": target.describe(), **report})
    return rows


def check_target(target: Target) -> dict:
    """The probe's answer judged against the inventory (venv present, the GPUs it names seen);
    raises the probe's error unless the cause is a missing python3 (then a report saying how
    to install it)."""
    try:
        probe = payload_api.probe(target)
    except OrchError as error:
        # a host or link that failed is no missing python: asking again would only wait
        # for it a second time
        if isinstance(error, (PayloadError, ConnectionProblem)) or not distro.python_missing(
                target, payload_api.SYSTEM_PYTHON):
            raise
        return python_missing_report(target)
    venv = probe.get("venv")
    problems = []
    if venv is not None and not venv["present"]:
        problems.append(f"venv {venv['path']} missing")
    gpus = probe.get("gpus")
    if target.gpus and isinstance(gpus, list):
        seen = {gpu["index"] for gpu in gpus}
        missing = [g for g in target.gpus if g not in seen]
        if missing:
            problems.append(f"GPUs {missing} not seen by nvidia-smi")
    elif target.gpus and gpus is None:
        problems.append("no nvidia-smi in the container")
    return {"ok": not problems, "reachable": True, "running": True,
            "python_version": probe.get("python_version"), "venv": venv, "gpus": gpus,
            "ripgrep": probe.get("ripgrep"), "problems": problems}


def python_missing_report(target: Target) -> dict:
    """A container without python3: nothing of orch's runs there; say how to install it."""
    missing = distro.PythonMissing(target, "python3", distro.os_release(target))
    fix = "; ".join(missing.fix) or "install python3 (3.8 or newer) with its package manager"
    return {"ok": False, "reachable": True, "running": True, "python_version": None,
            "venv": None, "gpus": None, "ripgrep": None, "os": missing.release.pretty_name,
            "fix": missing.fix,
            "problems": [f"python3 is not installed ({missing.release.pretty_name}): {fix}"]}


def reachable(error: OrchError) -> bool:
    return not isinstance(error, ConnectionProblem)


def row_texts(row: dict) -> dict:
    """A row's facts in short words, for a table that fits 80 columns: python, venv (ok,
    missing), gpus ("-" when none); and `problems`, the sentences printed below the table."""
    venv = row.get("venv") or {}
    gpus = row.get("gpus")
    problems = [row["error"]] if row.get("error") else list(row.get("problems", []))
    if isinstance(gpus, dict) and gpus.get("error"):
        problems.append(f"nvidia-smi: {gpus['error']}")
    return {
        "python": row.get("python_version") or "-",
        "venv": ("ok" if venv.get("present") else "missing") if venv else "-",
        "gpus": ("-" if gpus is None else "error" if isinstance(gpus, dict)
                 else ",".join(str(g["index"]) for g in gpus) or "none"),
        "problems": problems,
    }
