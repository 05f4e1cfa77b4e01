"""orch's own files on the controller are private from their creation (umask, never a chmod
after): the run store, run folders, logs and reports may hold environment values, paths and
tokens' names. Commands orch runs on this machine (the local transport) keep the user's umask."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ORCH = [sys.executable, "-m", "orchestrator"]


def test_store_run_folders_logs_and_reports_are_private(tmp_path):
    (tmp_path / "inventory.yaml").write_text(
        "hosts:\n  here: {transport: local}\ncontainers:\n  dev: {host: here}\ndefault_target: dev\n")
    (tmp_path / "book.yaml").write_text(textwrap.dedent(f"""\
        name: private
        targets: [dev]
        steps:
          - launch: {{command: [sh, -c, "echo step 1 loss 2.0; touch {tmp_path}/made-by-the-command"], venv: false, run_dir: "{tmp_path}/run"}}
          - monitor: {{hang_after: 600, gpu_every: 0}}
          - collect: {{}}
        """))
    env = {**os.environ, "ORCH_DATA_DIR": str(tmp_path / "data"), "ORCH_AGENT": "off"}
    for args in (["run", "book.yaml"], ["report", "last"]):
        out = subprocess.run([*ORCH, "-i", "inventory.yaml", *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120,
                             preexec_fn=lambda: os.umask(0o022))
        assert out.returncode == 0, out.stdout + out.stderr
    made = {}
    for folder, dirs, files in os.walk(tmp_path / "data"):
        made[folder] = os.stat(folder).st_mode & 0o777
        for name in files:
            made[os.path.join(folder, name)] = os.stat(os.path.join(folder, name)).st_mode & 0o777
    names = {os.path.basename(path) for path in made}
    assert {"runs.sqlite", "report.html", "report.md", "output.log", "stream.log"} <= names
    assert {path: mode for path, mode in made.items()
            if mode != (0o700 if os.path.isdir(path) else 0o600)} == {}
    # the launcher's own log is private; the launched command ran with the user's umask 022,
    # as in the user's shell
    assert os.stat(tmp_path / "run" / "output.log").st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "made-by-the-command").st_mode & 0o777 == 0o644
