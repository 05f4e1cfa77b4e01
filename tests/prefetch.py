"""Builds the test suite's big cached venvs ahead of the tests that need them.

scripts/test.sh starts this in the background when it runs the whole suite, so the
downloads (torch's CPU wheel, the real trainers, pystack, the old torch releases: several
GB on a fresh machine) happen beside the unit tests instead of inside the one test that
first asks. Each builder takes its own lock, so a test that asks meanwhile waits for the
build in progress and never builds twice. Sequential on purpose: on CI's 2 cores, parallel
pip installs would only slow the tests beside them. A failure here is only printed: the
test that needs the venv builds it again and fails visibly.

    python -m tests.prefetch          # what scripts/test.sh runs
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path


def builders():
    """(name, build) in the order the suite needs them: torch first (most tests), the
    trainers' layers on it, pystack, then the old releases (the last sandbox tests)."""
    from tests.support import pystackenv
    from tests.torch.releases import RUNTIME_RELEASES, release_venv
    from tests.support.torchenv import torch_venv
    from tests.trainer import realenv, specforgeenv

    def torch_python() -> Path:
        return Path(torch_venv()) / "bin" / "python"

    yield "torch", torch_venv
    yield "trainers", lambda: realenv.trainers_venv(torch_python())
    yield "lightning", lambda: realenv.lightning_venv(torch_python())
    yield "tensorboard", lambda: realenv.tensorboard_venv(torch_python())
    yield "specforge", lambda: specforgeenv.specforge_venv(torch_python())
    yield "pystack", pystackenv.pystack_wheelhouse
    for version in RUNTIME_RELEASES:
        yield f"torch {version}", lambda version=version: release_venv(version)


def main() -> int:
    failed = 0
    for name, build in builders():
        started = time.monotonic()
        try:
            where = build()
        except Exception:   # noqa: BLE001 - reported, and the test that needs it fails visibly
            failed += 1
            print(f"prefetch: {name} FAILED after {time.monotonic() - started:.0f} s", flush=True)
            traceback.print_exc()
            continue
        print(f"prefetch: {name} ready in {time.monotonic() - started:.0f} s: {where}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
