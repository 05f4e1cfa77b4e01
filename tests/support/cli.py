"""orch as a user runs it (any command, a fresh process), against an inventory of this machine
(the local transport)."""

import subprocess
import sys
import textwrap

import pytest


@pytest.fixture()
def inventory(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent("""\
        hosts:
          here: {transport: local}
        containers:
          dev: {host: here, venv: /nonexistent/venv}
          dev2: {host: here}
        groups:
          both: [dev, dev2]
        default_target: dev
        """))
    return str(path)


def orch(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True,
                          text=True, input=stdin, timeout=120)
