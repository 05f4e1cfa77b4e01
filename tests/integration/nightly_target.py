"""The target, playbook and run size of the `orch nightly` sandbox tests: the stand-in trainer's
playbook on sb1-201, in a venv of each test file's own (its store and history are its own too)."""

from __future__ import annotations

import os

HOST, VMID, TARGET = "sb1", 201, "sb1-201"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, "playbooks", "dflash-sandbox.yaml")


def small_run(venv: str, steps: int) -> list[str]:
    """The playbook's -e options for a small, quick night in venv. degraded_below=0: these tests
    judge throughput by comparison, and a busy 2-core CI machine must not turn a run "degraded"
    on its own."""
    return ["-e", f"venv={venv}", "-e", f"steps={steps}", "-e", "log_every=2", "-e", "verify_trials=1",
            "-e", "degraded_below=0", "-e", "hang_after=90"]
