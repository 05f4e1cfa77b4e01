"""Ctrl-C at a chosen moment of a real orch run, and the words orch says for each moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest


NOTHING = "before anything was launched: nothing runs on the targets"


GOES_ON = "The launched run goes on"


@pytest.fixture
def playbook(tmp_path):
    (tmp_path / "inventory.yaml").write_text(
        "hosts:\n  here: {transport: local}\ncontainers:\n  dev: {host: here}\ndefault_target: dev\n")
    path = tmp_path / "book.yaml"
    path.write_text(textwrap.dedent(f"""
        name: interrupt
        targets: [dev]
        vars: {{before: 0}}
        steps:
          - shell: [sleep, "{{{{ before }}}}"]
          - launch: {{command: [sleep, "30"], venv: false, run_dir: "{tmp_path}/run"}}
          - monitor: {{hang_after: 600, gpu_every: 0}}
        """))
    return tmp_path


def interrupt_when(playbook, marker, *extra, number=signal.SIGINT):
    """`orch run`, then SIGINT (or `number`) as soon as a line starts with MARKER; returns
    (code, output)."""
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i",
                                str(playbook / "inventory.yaml"), "run", str(playbook / "book.yaml"),
                                *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    seen = []
    deadline = time.monotonic() + 60
    for raw in process.stdout:
        seen.append(raw.decode(errors="replace"))
        if raw.decode(errors="replace").startswith(marker):
            process.send_signal(number)
            break
        assert time.monotonic() < deadline, "".join(seen)
    rest, _ = process.communicate(timeout=120)
    return process.returncode, "".join(seen) + rest.decode(errors="replace")
