"""orch as a user runs it (any command, a fresh process), against an inventory of this machine
(the local transport)."""

import subprocess
import sys
import textwrap

import pytest


def two_local_containers(tmp_path, dev_venv: str = "", default_target: str = "") -> str:
    """Writes tmp_path/inv.yaml: containers dev and dev2 on this machine (the local transport)
    and the group both of them, with dev's venv and a default target where given; returns its
    path."""
    dev = f"{{host: here, venv: {dev_venv}}}" if dev_venv else "{host: here}"
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts:
          here: {{transport: local}}
        containers:
          dev: {dev}
          dev2: {{host: here}}
        groups:
          both: [dev, dev2]
        """) + (f"default_target: {default_target}\n" if default_target else ""))
    return str(path)


@pytest.fixture()
def inventory(tmp_path):
    return two_local_containers(tmp_path, dev_venv="/nonexistent/venv", default_target="dev")


def orch(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True,
                          text=True, input=stdin, timeout=120)
