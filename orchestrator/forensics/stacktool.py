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

The wheels of the pinned pystack are pinned by sha256 too (PINNED_SHA256, from PyPI's index
of pystack 1.7.2, each file's published sha256): the download runs in pip's hash-checking
mode (a requirements file with every file's `--hash`, `--require-hashes`), and the wheel
orch carries, from its cache or the user's folder, is checked again before it is pushed
(a cache file with the name of one of them and other bytes is refused). A wheel of
another pystack in a folder the user names (--wheelhouse) is the user's choice and goes
as it is; orch's own cache holds the pinned ones only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Callable, Optional

from orchestrator.ground import invocation
from orchestrator.ground.errors import BadArgument, OrchError
from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.remote.wheels import Platform, file_sha256, fitting_wheel, push_wheels

TOOL = "pystack"
PIN = "pystack==1.7.2"            # what orch downloads: the version stacks.py's parser is checked on
# Every wheel of PIN on PyPI and its published sha256 (PyPI's simple index of pystack, read
# 2026-12-03): CPython 3.9-3.11, 3.12+ (abi3) and the free-threaded 3.13t-3.15t, for
# manylinux x86_64, manylinux aarch64 and musllinux x86_64.
PINNED_SHA256 = {
    "pystack-1.7.2-cp39-cp39-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "b9b7af01b09d683f15c77096499a6553871c421752d4bd1bce400396dfe04725",
    "pystack-1.7.2-cp39-cp39-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "4a9dee4b0d85fce2908dd3c38e7f087f3cb9c2547f291a49fedeaa593f6a0eff",
    "pystack-1.7.2-cp39-cp39-musllinux_1_2_x86_64.whl": "5792860ae9f399d142bd52d27496e8f74918c94a4729753b4062f1739db5b077",
    "pystack-1.7.2-cp310-cp310-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "3aaab546af6def48fb05766d3246263bda3b0932038f510b6c7d23b8c04283db",
    "pystack-1.7.2-cp310-cp310-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "4d56a628d4563d143548cba77d883f251a413bfd8c98009803b8fadbf61a159b",
    "pystack-1.7.2-cp310-cp310-musllinux_1_2_x86_64.whl": "70cedce62d175bdc50cd6fec12da960f8a64e62f2fd1ed6b6c9455e3669a77be",
    "pystack-1.7.2-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "bd087ceafce24beee3c57ab174dc8eb66f8f1b4953ee1b57f3479b3c615e8676",
    "pystack-1.7.2-cp311-cp311-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "7be8bf148310d23a207f6b2258ed5d2bfe42ef61d5296e9a27cff872b0c6b06f",
    "pystack-1.7.2-cp311-cp311-musllinux_1_2_x86_64.whl": "ab389cf1955a5e3aeae4728c826a41286627427ad0030b0578f1a51dba9b4423",
    "pystack-1.7.2-cp312-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "1d9bea3833fe74acece47a904bf1728a01daafae44cb1432e4c94c5312d6869b",
    "pystack-1.7.2-cp312-abi3-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "54048a6380fe7c71fa5935da53779234c1aa69e0172a7c11c6ced51f550eaae8",
    "pystack-1.7.2-cp312-abi3-musllinux_1_2_x86_64.whl": "3bb4953a52d7a8bc4c6070a2e5d5935e0755dc90d2a65fdd46ce38864f8aae5f",
    "pystack-1.7.2-cp313-cp313t-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "7e19baa3cc8c3f8a6bfaf1ab50796c69093dcb8ec0b1ff06b53c91a72ebe518f",
    "pystack-1.7.2-cp313-cp313t-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "2871cc243ca3107acd3a095f9793968c51d114ce08ed53d65ffadc999c7a75f0",
    "pystack-1.7.2-cp313-cp313t-musllinux_1_2_x86_64.whl": "a33aff7ba0c577f421b42ee5d7a84bdaa06b653e57a00e4911d969c345351994",
    "pystack-1.7.2-cp314-cp314t-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "47ef39b1e485dd8bc12b3374dae3015d8a75ab2cfe8e5043d5add03e1686c5d7",
    "pystack-1.7.2-cp314-cp314t-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "e79198c62ae5e5a99016e264e8fd890026181a09cfa792a834957b2ad499c9e9",
    "pystack-1.7.2-cp314-cp314t-musllinux_1_2_x86_64.whl": "97d77c20868c81169da8115a60696aa8d04aab4b0f0446fe1cddda68c2c75bc6",
    "pystack-1.7.2-cp315-cp315t-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "9bfbb44ef1adc1088f7ca4918f3e74a732e964294790dfc9a0bae400dd4f7c46",
    "pystack-1.7.2-cp315-cp315t-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl": "51dd476184573252bbf9117d953799772495f1cb7b334027623b959af8980eda",
    "pystack-1.7.2-cp315-cp315t-musllinux_1_2_x86_64.whl": "a93969542cc17a19ae98f964e97bc49f81477e48a6a812c8c11d4d62351d9fd2",
}
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
    digest = checked_sha256(wheel, pinned_only=not wheelhouse)
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


def checked_sha256(wheel: str, pinned_only: bool) -> str:
    """The wheel's sha256, once it is the pinned one its name says (a wheel of another
    pystack, in the user's own folder, goes as it is unless pinned_only: orch's cache)."""
    name, digest = os.path.basename(wheel), file_sha256(wheel)
    pinned = PINNED_SHA256.get(name)
    if pinned is None and not pinned_only:
        return digest
    if digest != pinned:
        why = (f"its sha256 {digest} is not the one PyPI publishes for it ({pinned})" if pinned
               else f"it is no wheel of {PIN}, the only pystack orch's cache holds")
        raise OrchError(f"refused to carry {wheel}: {why}",
                        hint=f"remove it; orch downloads {PIN} again, checked by pip")
    return digest


def download_argv(folder: str, platform: Platform, platforms: Optional[list[str]] = None,
                  requirements: Optional[str] = None) -> list[str]:
    """pip download of the pinned pystack for PLATFORM's python, whatever the controller is
    (PLATFORMS: the platform tags asked for, default every one that python accepts), in
    pip's hash-checking mode when REQUIREMENTS (hashed_requirements' file) is given."""
    major, minor = platform.version
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
            "--only-binary=:all:", "--no-deps", "--implementation", "cp",
            "--python-version", f"{major}.{minor}", "--abi", f"cp{major}{minor}", "-d", folder]
    for tag in platforms or platform.platforms():
        argv += ["--platform", tag]
    if requirements:
        return argv + ["--require-hashes", "-r", requirements]
    return argv + ["--", PIN]


def hashed_requirements() -> str:
    """PIN with every pinned wheel's sha256, as pip's hash-checking mode reads it."""
    return PIN + "".join(f" \\\n    --hash=sha256:{digest}"
                         for digest in sorted(set(PINNED_SHA256.values()))) + "\n"


def _short_platforms(platform: Platform) -> list[str]:
    """For a command a person types: the names most wheels carry (manylinux2014, ...)."""
    return [tag for tag in platform.platforms() if not tag.startswith("manylinux_")][:2]


def _download(folder: str, platform: Platform, progress: Callable[[str], None]) -> None:
    os.makedirs(folder, exist_ok=True)
    progress(f"downloading {PIN} for {platform.describe()} into {folder}")
    with tempfile.TemporaryDirectory(prefix="orch-pystack-") as scratch:
        requirements = os.path.join(scratch, "requirements.txt")
        with open(requirements, "w") as handle:
            handle.write(hashed_requirements())
        done = subprocess.run(download_argv(folder, platform, requirements=requirements),
                              capture_output=True, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()
                and not line.startswith("WARNING")][-2:]
        raise OrchError(f"pip download of {PIN} for {platform.describe()} failed: "
                        f"{' '.join(last) or f'exit {done.returncode}'}",
                        hint=f"give orch a folder holding a {TOOL} wheel for that python: "
                             f"orch stacks --wheelhouse DIR")
