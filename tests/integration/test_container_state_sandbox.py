"""Root payloads in a container other accounts share (real sshd, real LXC, real pct): an
unprivileged account of the container cannot turn them against root, a payload past its
timeout does not run on, and an index URL's credentials never show in any argv.

The other account is uid 4242 (setpriv, no login needed): it plants what it can where orch
used to keep its state (/var/tmp/orch) and where a user may point orch (a run_dir).
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import threading
import time

import pytest

from orchestrator.remote import payload_api
from orchestrator.ground.errors import CommandTimeout, OrchError, PayloadError
from orchestrator.targets.fleet import Fleet
from orchestrator.payloads._statedir import STATE_DIR

pytestmark = pytest.mark.sandbox

MALLORY = ["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", "--"]
# What uid 4242 does first: orch's old folders, with a link to root's files in them.
PLANT = """
set -e
mkdir -p /var/tmp/orch/runs/old /var/tmp/orch/wheelhouse
ln -sfn /etc /var/tmp/orch/runs/evil
ln -sfn /root /var/tmp/evil-run
"""


@pytest.fixture(scope="module")
def ct(sandbox):
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        target.venv = None   # the container's own python3: payloads need nothing else
        yield target


@pytest.fixture
def planted(ct):
    ct.run(["rm", "-rf", "/var/tmp/orch", "/var/tmp/evil-run", "/tmp/should-not-run"],
           timeout=30).check()
    ct.run([*MALLORY, "sh", "-c", PLANT], timeout=30).check("planting as uid 4242")
    yield
    ct.run(["rm", "-rf", "/var/tmp/orch", "/var/tmp/evil-run"], timeout=30)


def test_orch_keeps_its_state_in_roots_own_folder_whatever_others_planted(ct, planted):
    assert ct.run([*MALLORY, "mkdir", "-p", f"{STATE_DIR}/runs"], timeout=30).exit_code != 0
    run_dir = f"{ct.state_dir()}/runs/sec-{secrets.token_hex(4)}/launch"
    started = payload_api.launcher(ct, "start", run_dir, argv=["sh", "-c", "echo hi; sleep 1"])
    assert started["pid"] and run_dir.startswith(STATE_DIR + "/runs/")
    modes = ct.run(["stat", "-c", "%U %a %n", STATE_DIR, run_dir], timeout=30).check().text
    assert modes.splitlines() == [f"root 700 {STATE_DIR}", f"root 700 {run_dir}"]
    # nothing of root's went into what uid 4242 made
    assert ct.run(["find", "/var/tmp/orch", "-user", "root"], timeout=30).text == ""
    ct.run(["rm", "-rf", os.path.dirname(run_dir)], timeout=30)


def test_a_run_folder_or_wheelhouse_another_account_controls_is_refused(ct, planted):
    for run_dir in ("/var/tmp/orch/runs/new", "/var/tmp/orch/runs/evil/x", "/var/tmp/evil-run/x"):
        with pytest.raises(PayloadError, match="unsafe run folder") as found:
            payload_api.launcher(ct, "start", run_dir, argv=["touch", "/tmp/should-not-run"])
        assert found.value.kind == "unsafe-path"
    assert ct.run(["test", "-e", "/tmp/should-not-run"], timeout=30).exit_code == 1
    assert ct.run(["ls", "-A", "/root"], timeout=30).text.count(".orch") == 0
    with pytest.raises(PayloadError, match="unsafe wheelhouse: /var/tmp/orch belongs to uid 4242") as found:
        payload_api.bootstrap(ct, "list", dir="/var/tmp/orch/wheelhouse")
    assert found.value.kind == "unsafe-path"


def test_stop_of_a_run_recorded_in_a_planted_folder_signals_nothing(ct, planted):
    """An old run folder under /var/tmp/orch/runs that uid 4242 owns, its pid.json naming a
    root process with the right start time: orch stop refuses it, the process lives."""
    pid = ct.run(["sh", "-c", "setsid sleep 61 >/dev/null 2>&1 < /dev/null & echo $!"],
                 timeout=30).check().text.strip()
    try:
        stat = ct.run(["cat", f"/proc/{pid}/stat"], timeout=30).check().text
        ticks = stat.rsplit(")", 1)[1].split()[19]
        forged = f'{{"pid": {pid}, "start_ticks": {ticks}}}'
        ct.run([*MALLORY, "sh", "-c", 'printf %s "$1" > /var/tmp/orch/runs/old/pid.json', "sh",
                forged], timeout=30).check()
        with pytest.raises(PayloadError, match="unsafe run folder: /var/tmp/orch belongs to uid 4242"):
            payload_api.stop_run(ct, "/var/tmp/orch/runs/old", grace=1)
        assert ct.run(["kill", "-0", pid], timeout=30).exit_code == 0
    finally:
        ct.run(["kill", pid], timeout=30)


def test_three_pathological_greps_past_their_timeout_leave_nothing_running(ct):
    """Python re backtracking for ever on pip's source, three at once on plain channels:
    orch reports the timeout and, in the container, pgrep finds none of them a moment later."""
    pattern = r"^(\w+\s?)*$|zzorch" + secrets.token_hex(3)   # the tail: a name to pgrep for
    needle = pattern.split("|")[1]

    def grep(_):
        try:
            payload_api.search(ct, pattern, package="pip", engine="python", timeout=3)
        except CommandTimeout:
            return "timeout"
        except PayloadError as error:
            return error.kind
        return "finished"

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(grep, range(3)))
    assert outcomes == ["timeout"] * 3
    running = None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        # [x]: pgrep's own command line (and its reaper's) does not match the pattern
        running = ct.run(["pgrep", "-af", f"{needle[:2]}[{needle[2]}]{needle[3:]}"], timeout=30).text
        if not running:
            break
        time.sleep(0.2)
    assert running == ""


def test_index_url_credentials_never_show_in_any_argv(ct, tmp_path):
    """pip gets the index URL from its environment: while a bootstrap runs, no process on
    this machine (the hosts' sshd and pct, and the container's pip: one process namespace
    above theirs) has the password in its command line."""
    secret = "pw-" + secrets.token_hex(8)
    seen, done = [], threading.Event()

    def sample():
        while not done.is_set():
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        if secret.encode() in handle.read():
                            seen.append(pid)
                except OSError:
                    pass
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with pytest.raises(OrchError) as failed:
            payload_api.bootstrap(ct, "install", venv="/tmp/orch-index-venv", hash="h",
                                  packages=["orch-no-such-package==1"],
                                  index_url=f"http://user:{secret}@127.0.0.1:9/simple",
                                  pip_args=["--retries", "0", "--timeout", "2"], timeout=300)
    finally:
        done.set()
        sampler.join()
        ct.run(["rm", "-rf", "/tmp/orch-index-venv"], timeout=60)
    assert "pip install failed" in str(failed.value)
    assert seen == []
    assert secret not in str(failed.value)
