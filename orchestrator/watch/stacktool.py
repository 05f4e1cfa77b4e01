"""Where `orch stacks` gets pystack in a target: the target venv's own (`python -m pystack`),
else a `pystack` on its PATH, else orch carries it in itself.

Carrying it: pystack is a wheel with a native extension (`_pystack.cpython-311-x86_64-linux-
gnu.so`), so the wheel must fit the python that runs it. The bootstrap payload's `platform`
action says what that python is (implementation, version, machine, glibc or musl); a wheel
that fits is taken from the folder the user names (`--wheelhouse DIR`), else from orch's
cache on the controller, filled by `pip download` for exactly that python and platform. It
is pushed like the bootstrap step's wheels (remote/wheels.py: by sha256, into the target's
wheelhouse) and unpacked by the bootstrap payload into a folder of its own under orch's
state folder there (STATE_DIR/tools/<wheel>), never into the user's venv; the target's
python runs it from there. A wheel that fits no python of the target's is refused before
anything is pushed, with what each wheel is for and what the target has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Optional

from orchestrator.ground import invocation
from orchestrator.ground.errors import BadArgument, OrchError
from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.remote.wheels import Platform, file_sha256, fitting_wheel, push_wheels

TOOL = "pystack"
PIN = "pystack==1.7.2"            # what orch downloads: the version stacks.py's parser is checked on
WHEEL_CACHE = "~/.cache/orch/tool-wheels"
# run from its unpacked folder, as `python -m pystack` would; argv: FOLDER ARGS...
RUNNER = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'pystack'; "
          "runpy.run_module('pystack', run_name='__main__', alter_sys=True)")


def stack_command(target: Target, wheelhouse: Optional[str] = None,
                  progress: Callable[[str], None] = lambda line: None) -> tuple[list[str], str]:
    """The argv prefix that runs pystack in TARGET (`... remote PID` follows), and in words
    which pystack it is."""
    python = target.python()
    if target.venv and target.run([python, "-c", f"import {TOOL}"], timeout=60).ok:
        # `python -m`: a venv copied elsewhere keeps working, its scripts' shebangs would not
        return [python, "-m", TOOL], f"{python} -m {TOOL}"
    if target.run(["sh", "-c", f"command -v {TOOL}"], timeout=30).ok:
        return [TOOL], f"{TOOL} on PATH"
    folder = carried(target, python, wheelhouse, progress)
    return [python, "-c", RUNNER, folder], f"{python} with orch's {TOOL} ({folder})"


def carried(target: Target, python: str, wheelhouse: Optional[str],
            progress: Callable[[str], None]) -> str:
    """The folder in TARGET holding an unpacked pystack wheel that fits PYTHON; pushed and
    unpacked when it is not there yet."""
    tools = f"{target.state_dir()}/tools"
    facts = payload_api.bootstrap(target, "platform", python=python, timeout=120, tools=tools)
    platform = Platform.from_facts(facts)
    wheel = _wheel_for(platform, wheelhouse, progress, where=f"{target.name}'s {python}")
    name = os.path.basename(wheel)
    folder = name[:-len(".whl")]
    dest = f"{tools}/{folder}"
    digest = file_sha256(wheel)
    if ((facts.get("unpacked") or {}).get(folder) or {}).get("sha256") == digest:
        return dest                  # carried in by an earlier run: nothing to push
    remote_dir = f"{target.state_dir()}/wheelhouse"
    progress(f"{target.name} has no {TOOL}: carrying {name} to {dest}")
    push_wheels(target, os.path.dirname(wheel), [name], remote_dir, progress,
                timeout=lambda seconds: seconds)
    payload_api.bootstrap(target, "unpack", python=python, timeout=300,
                          wheel=f"{remote_dir}/{name}", sha256=digest, dest=dest)
    return dest


def _wheel_for(platform: Platform, wheelhouse: Optional[str], progress: Callable[[str], None],
               where: str) -> str:
    """A pystack wheel for PLATFORM: from WHEELHOUSE when given (only from there), else from
    orch's cache, downloaded into it first when none there fits."""
    if platform.implementation != "cpython":
        raise BadArgument(f"{where} is {platform.describe()}: pystack reads CPython processes "
                        "only and runs on CPython")
    # the user's own paths (through the warm agent too: its cwd and HOME are not the user's)
    folder = invocation.current().path(wheelhouse or WHEEL_CACHE)
    if wheelhouse and not os.path.isdir(folder):
        raise BadArgument(f"--wheelhouse {wheelhouse}: no such folder here")
    found, misfits = fitting_wheel(folder, TOOL, platform)
    if found is None and not wheelhouse:
        _download(folder, platform, progress)
        found, misfits = fitting_wheel(folder, TOOL, platform)
    if found is None:
        why = ("; ".join(misfits[:4]) if misfits else f"it holds no {TOOL} wheel")
        raise BadArgument(f"no {TOOL} wheel in {folder} fits {where} ({platform.describe()}): {why}",
                        hint="put one for it there: " + " ".join(
                            ["pip", *download_argv(folder, platform, _short_platforms(platform))[3:]]))
    return found


def download_argv(folder: str, platform: Platform, platforms: Optional[list[str]] = None) -> list[str]:
    """pip download of the pinned pystack for PLATFORM's python, whatever the controller is
    (PLATFORMS: the platform tags asked for, default every one that python accepts)."""
    major, minor = platform.version
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
            "--only-binary=:all:", "--no-deps", "--implementation", "cp",
            "--python-version", f"{major}.{minor}", "--abi", f"cp{major}{minor}", "-d", folder]
    for tag in platforms or platform.platforms():
        argv += ["--platform", tag]
    return argv + [PIN]


def _short_platforms(platform: Platform) -> list[str]:
    """For a command a person types: the names most wheels carry (manylinux2014, ...)."""
    return [tag for tag in platform.platforms() if not tag.startswith("manylinux_")][:2]


def _download(folder: str, platform: Platform, progress: Callable[[str], None]) -> None:
    os.makedirs(folder, exist_ok=True)
    progress(f"downloading {PIN} for {platform.describe()} into {folder}")
    done = subprocess.run(download_argv(folder, platform), capture_output=True, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()
                and not line.startswith("WARNING")][-2:]
        raise OrchError(f"pip download of {PIN} for {platform.describe()} failed: "
                        f"{' '.join(last) or f'exit {done.returncode}'}",
                        hint=f"give orch a folder holding a {TOOL} wheel for that python: "
                             f"orch stacks --wheelhouse DIR")
