"""A launch step's env (HF_TOKEN, ...) never shows in any argv, on the host or in the container,
while the run starts and while it runs, and the trainer still gets it (real sshd, real LXC).

The secret is looked for in every /proc/PID/cmdline: on the sandbox's hosts (their sshd,
`pct exec` and `lxc-attach` run in this machine's process namespace) by a thread polling every
few milliseconds during `orch run`, and inside the container, while the launched command runs,
by a scanner that reads the secret from stdin (so the scan never puts it in an argv itself).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.targets.fleet import Fleet
from orchestrator.runs.store import RunStore

pytestmark = pytest.mark.sandbox

TARGET = "sb1-200"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]

# Runs in the container: the pids whose argv holds the secret given on stdin.
SCAN = """
import os, sys
secret = sys.stdin.buffer.read()
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        with open('/proc/%s/cmdline' % pid, 'rb') as handle:
            cmdline = handle.read()
    except OSError:
        continue
    if secret in cmdline:
        print(pid, cmdline.replace(b'\\0', b' ')[:200].decode(errors='replace'))
print('scanned')
"""

# The trainer: proves it got the secret (its hash, not the value) and stays up a while.
TRAINER = ("import hashlib, os, time; print('token-sha256', hashlib.sha256("
           "os.environ['HF_TOKEN'].encode()).hexdigest(), flush=True); time.sleep(8); print('done')")


def host_argvs_with(secret: bytes) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if secret in cmdline:
            found.append(cmdline.replace(b"\0", b" ")[:300].decode(errors="replace"))
    return found


def test_launch_env_is_in_no_argv_and_reaches_the_trainer(sandbox, tmp_path):
    secret = "hf_" + secrets.token_hex(16)
    book = tmp_path / "secret-launch.yaml"
    book.write_text(
        "name: secret-launch\n"
        f"targets: [{TARGET}]\n"
        "steps:\n"
        "  - launch:\n"
        f"      command: [python3, -c, \"{TRAINER}\"]\n"
        "      venv: false\n"
        f"      env: {{HF_TOKEN: '{secret}', PLAIN: visible}}\n")
    environment = {**os.environ, "ORCH_DATA_DIR": str(tmp_path / "data")}
    environment.pop("ORCH_STORE", None)

    seen_on_host: list[str] = []
    done = threading.Event()

    def watch_host():
        while not done.is_set():
            seen_on_host.extend(host_argvs_with(secret.encode()))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch_host, daemon=True)
    watcher.start()
    try:
        run = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "run", str(book)],
                             cwd=REPO, env=environment,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-4000:]
        assert secret not in run.stdout

        fleet = Fleet.from_path(str(sandbox.inventory_path))
        try:
            target = fleet.targets([TARGET])[0]
            scan = target.run(["python3", "-c", SCAN], stdin=secret.encode(), timeout=60)
            assert scan.exit_code == 0 and "scanned" in scan.text, scan.stderr_tail()
            in_container = [line for line in scan.text.splitlines() if line != "scanned"]
            with RunStore(str(tmp_path / "data" / "runs.sqlite")) as store:
                record = store.get("last")
            run_dir = record.launch["targets"][TARGET]["run_dir"]
            log = ""
            for _ in range(100):
                log = target.run(["cat", f"{run_dir}/output.log"], timeout=30).text
                if "done" in log:
                    break
                time.sleep(0.2)
        finally:
            fleet.close()
    finally:
        done.set()
        watcher.join(5)

    assert in_container == [], "the secret is in an argv in the container"
    assert seen_on_host == [], "the secret is in an argv on the host"
    assert f"token-sha256 {hashlib.sha256(secret.encode()).hexdigest()}" in log
