"""orch cp against the sandbox (real sshd, real LXC, real pct): a tree's round trip, a
50 MB file both ways with its sha256 and orch's peak RSS (on the direct path and through the
warm agent), and a link broken mid-transfer, which leaves no file under the final name on
either side."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.ground.errors import ConnectionLost, OrchError
from orchestrator.payloads._tarstream import TEMP_MARK
from orchestrator.remote import transfer
from orchestrator.remote.session import SessionPool
from orchestrator.targets.fleet import Fleet
from tests.support.agents import agent_pids, stop_agents
from tests.support.trees import leftovers, make_tree, snapshot

pytestmark = pytest.mark.sandbox

BIG_MB = 50
# orch exec's own bound (tests of streamed output): the copy must not raise it with its size
RSS_LIMIT_MB = 64


def random_file(path, megabytes: int):
    """A file of random bytes (nothing for a compressor to shorten), written a MiB at a time."""
    with open(path, "wb") as handle:
        for _ in range(megabytes):
            handle.write(os.urandom(1 << 20))
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return random_file(tmp_path_factory.mktemp("big") / "big.bin", BIG_MB)


def a_remote_dir(ct, prefix: str, removal_timeout: float):
    """A fresh folder /tmp/PREFIX-RANDOM in the container for one test (yielded), removed after
    it; the tests with more files in it give its removal longer."""
    folder = f"/tmp/{prefix}-{secrets.token_hex(4)}"
    ct.run(["mkdir", "-p", folder], timeout=30).check()
    yield folder
    ct.run(["rm", "-rf", folder], timeout=removal_timeout)


@pytest.fixture
def remote_dir(ct):
    yield from a_remote_dir(ct, "cp-test", removal_timeout=60)


def run_measured(sandbox, *args):
    """`orch ARGS` in its own process (the direct path): (exit code, stderr, peak RSS in MB).
    The peak is the process's VmHWM in /proc, read until it exits (a fork's rusage would
    count the test process's own pages from before the exec)."""
    env = {**os.environ, "ORCH_AGENT": "off"}
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i",
                                str(sandbox.inventory_path), *args], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]

    def watch():
        while process.poll() is None:
            try:
                with open(f"/proc/{process.pid}/status") as status:
                    for line in status:
                        if line.startswith("VmHWM:"):
                            peak[0] = max(peak[0], int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stderr = process.stderr.read()
    process.wait(timeout=300)
    watcher.join()
    return process.returncode, stderr.decode(), peak[0] / 1024


def remote_sha(ct, path):
    return ct.run(["sha256sum", path], timeout=120).check().text.split()[0]


def sha(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for piece in iter(lambda: handle.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def round_trip_file(sandbox, ct, remote_dir, big, tmp_path) -> tuple[float, float]:
    """`orch cp` pushes the file big into remote_dir/big.bin and pulls it back into tmp_path,
    each time exit 0 and sha256 equal; returns orch's peak RSS in MB (push, pull)."""
    code, err, pushed_rss = run_measured(sandbox, "cp", str(big), f"sb1-200:{remote_dir}/big.bin")
    assert code == 0, err
    assert remote_sha(ct, f"{remote_dir}/big.bin") == sha(big)
    code, err, pulled_rss = run_measured(sandbox, "cp", f"sb1-200:{remote_dir}/big.bin",
                                         str(tmp_path / "back.bin"))
    assert code == 0, err
    assert sha(tmp_path / "back.bin") == sha(big)
    return pushed_rss, pulled_rss


def test_a_tree_round_trips_through_the_container(sandbox, ct, remote_dir, tmp_path):
    tree = make_tree(tmp_path / "src")
    code, err, _ = run_measured(sandbox, "cp", "-r", str(tree), f"sb1-200:{remote_dir}/")
    assert code == 0, err
    listing = ct.run(["stat", "-c", "%a %n", f"{remote_dir}/tree/sub/run.sh",
                      f"{remote_dir}/tree/secret"], timeout=30).check().text.split("\n")
    assert listing[:2] == [f"751 {remote_dir}/tree/sub/run.sh", f"600 {remote_dir}/tree/secret"]
    code, err, _ = run_measured(sandbox, "cp", "-r", f"sb1-200:{remote_dir}/tree",
                                str(tmp_path / "back"))
    assert code == 0, err
    assert snapshot(tmp_path / "back") == snapshot(tree)
    assert "sha256 checked" in err


def test_a_large_file_both_ways_with_its_sha256_and_bounded_memory(sandbox, ct, remote_dir,
                                                                   big, tmp_path):
    pushed_rss, pulled_rss = round_trip_file(sandbox, ct, remote_dir, big, tmp_path)
    print(f"peak RSS of orch: push {pushed_rss:.0f} MB, pull {pulled_rss:.0f} MB "
          f"for {BIG_MB} MB")
    assert pushed_rss < RSS_LIMIT_MB and pulled_rss < RSS_LIMIT_MB


def _memory_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def test_through_the_warm_agent_both_ways_with_the_callers_folder(sandbox, ct, remote_dir, big,
                                                                tmp_path):
    """The quick path users get by default: the copy runs in the agent, with local paths the
    caller's (a relative name from the caller's folder), the sha256 checked, and the agent's
    memory not growing with the file (its peak over its resident size before: a few MB of
    queue and window)."""
    env = {**os.environ, "ORCH_AGENT_DIR": str(tmp_path / "agent"), "ORCH_AGENT": "require"}
    caller = tmp_path / "caller"
    caller.mkdir()
    os.link(big, caller / "big.bin")
    orch = [sys.executable, "-m", "orchestrator", "-i", str(sandbox.inventory_path)]
    try:
        subprocess.run([*orch, "exec", "sb1-200", "--", "true"], env=env, check=True, timeout=120)
        (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
        before = _memory_mb(pid, "VmRSS")
        for args in (["big.bin", f"sb1-200:{remote_dir}/"],
                     [f"sb1-200:{remote_dir}/big.bin", "back.bin"]):
            done = subprocess.run([*orch, "cp", *args], env=env, cwd=caller, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0 and "sha256 checked" in done.stderr, done.stderr
        assert remote_sha(ct, f"{remote_dir}/big.bin") == sha(big) == sha(caller / "back.bin")
        grown = _memory_mb(pid, "VmHWM") - before
        print(f"the agent's peak over its resident size before: {grown:.0f} MB for {BIG_MB} MB")
        assert grown < 32
        assert agent_pids(env["ORCH_AGENT_DIR"]) == [pid]
    finally:
        stop_agents(env["ORCH_AGENT_DIR"])


def test_a_copy_takes_a_channel_of_its_own_where_commands_take_a_warm_session(sandbox, remote_dir,
                                                                            tmp_path):
    source = tmp_path / "small.txt"
    source.write_text("bulk\n")
    with Fleet.from_path(str(sandbox.inventory_path), sessions=SessionPool()) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        assert target.run(["true"]).exit_code == 0 and target.via == "session"
        transfer.push(target, str(source), f"{remote_dir}/small.txt")
        assert target.via == "channel"
        transfer.pull(target, f"{remote_dir}/small.txt", str(tmp_path / "back.txt"))
        assert target.via == "channel" and (tmp_path / "back.txt").read_text() == "bulk\n"
        assert target.run(["true"]).exit_code == 0 and target.via == "session"


def _breaking_after(host, count):
    """An on_data callback that closes the host's connections after `count` bytes (the
    link breaks under the transfer)."""
    seen = {"bytes": 0, "broken": False}

    def on_data(size):
        seen["bytes"] += size
        if seen["bytes"] >= count and not seen["broken"]:
            seen["broken"] = True
            host.close()
    return on_data, seen


def test_a_link_broken_under_a_push_leaves_no_file_under_its_final_name(sandbox, remote_dir, big):
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        on_data, seen = _breaking_after(target.host, 10 << 20)
        with pytest.raises(OrchError) as raised:
            transfer.push(target, str(big), f"{remote_dir}/big.bin", on_data=on_data)
        assert seen["broken"] and isinstance(raised.value, ConnectionLost), raised.value
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        deadline = time.monotonic() + 15   # the payload's end: EOF, or the reaper's SIGTERM
        while True:
            names = target.run(["ls", "-A", remote_dir], timeout=30).check().text.split()
            if not names or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "big.bin" not in names
        assert [n for n in names if n.startswith(TEMP_MARK)] == []


def test_a_link_broken_under_a_pull_leaves_no_file_under_its_final_name(sandbox, ct, remote_dir,
                                                                      big, tmp_path):
    transfer.push(ct, str(big), f"{remote_dir}/big.bin")
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        on_data, seen = _breaking_after(target.host, 10 << 20)
        with pytest.raises(OrchError) as raised:
            transfer.pull(target, f"{remote_dir}/big.bin", str(tmp_path / "back.bin"),
                          on_data=on_data)
        assert seen["broken"]
        assert isinstance(raised.value, ConnectionLost) or "ended before" in str(raised.value)
    assert os.listdir(tmp_path) == [] and leftovers(tmp_path) == []


def test_a_group_push_reaches_every_container(sandbox, tmp_path):
    source = tmp_path / "note.txt"
    source.write_bytes(b"to all\n")
    folder = f"/tmp/cp-group-{secrets.token_hex(4)}"
    code, err, _ = run_measured(sandbox, "cp", str(source), f"running:{folder}")
    try:
        assert code == 0, err
        assert err.count("sha256 checked") == 4
    finally:
        run_measured(sandbox, "exec", "running", "--", "rm", "-f", folder)


MALLORY = ["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", "--"]


def test_a_destination_folder_another_account_linked_elsewhere_is_refused(sandbox, ct, tmp_path):
    """uid 4242 of the container turns the folder a push goes to into a link to root's
    own folder: root's receiver once followed it (open by path) and wrote there."""
    victim, mine = f"/root/victim-{secrets.token_hex(4)}", f"/tmp/m4242-{secrets.token_hex(4)}"
    ct.run(["mkdir", "-m", "0700", victim], timeout=30).check()
    ct.run(["mkdir", "-m", "0777", mine], timeout=30).check()
    try:
        ct.run([*MALLORY, "ln", "-s", victim, f"{mine}/drop"], timeout=30).check("planting as uid 4242")
        (tmp_path / "payload.sh").write_text("#!/bin/sh\necho planted\n")
        code, err, _ = run_measured(sandbox, "cp", str(tmp_path / "payload.sh"), f"sb1-200:{mine}/drop/")
        assert code == 1 and "symbolic link of uid 4242, another account's" in err, err
        assert ct.run(["ls", "-A", victim], timeout=30).check().text == ""
        ct.run([*MALLORY, "rm", f"{mine}/drop"], timeout=30).check()
        ct.run(["ln", "-s", victim, f"{mine}/drop"], timeout=30).check()   # root's own link
        code, err, _ = run_measured(sandbox, "cp", str(tmp_path / "payload.sh"), f"sb1-200:{mine}/drop/")
        assert code == 0, err
        assert ct.run(["cat", f"{victim}/payload.sh"], timeout=30).check().text == "#!/bin/sh\necho planted\n"
    finally:
        ct.run(["rm", "-rf", victim, mine], timeout=30)
