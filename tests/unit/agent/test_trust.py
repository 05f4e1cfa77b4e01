"""The client trusts no socket it has not checked (docs/guide/agent.md, Security model): a command's
environment and its fds 0-2 go only to an agent of our own uid, in a folder only we control.
The fake listeners run as `nobody`, so these tests need root (the suite's usual user here)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from orchestrator.agent import protocol
from tests.support.agents import agent_pids, stop_agents

ORCH = [sys.executable, "-m", "orchestrator"]

# A listener as `nobody`: reports how many connections came and how many bytes and fds
# they carried. The system's python: a venv under /root is not for nobody.
LISTENER = textwrap.dedent("""\
    import json, socket, sys
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(8)
    listener.settimeout(float(sys.argv[2]))
    print("ready", flush=True)
    seen = {"connections": 0, "bytes": 0, "fds": 0}
    try:
        while True:
            conn, _ = listener.accept()
            seen["connections"] += 1
            conn.settimeout(5)
            while True:
                data, fds, _, _ = socket.recv_fds(conn, 65536, 8)
                seen["bytes"] += len(data)
                seen["fds"] += len(fds)
                if not data:
                    break
    except (socket.timeout, OSError):
        pass
    print(json.dumps(seen), flush=True)
    """)

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="the fake listener runs as nobody: needs root")



def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")


@pytest.fixture()
def inventory(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  here: {transport: local}\ncontainers:\n  dev: {host: here}\n")
    return str(path)


def start_listener(path: str, wait_s: float = 3.0) -> subprocess.Popen:
    process = subprocess.Popen(["/usr/bin/python3", "-I", "-c", LISTENER, path, str(wait_s)],
                               user="nobody", stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    return process


def listener_saw(process: subprocess.Popen) -> dict:
    return json.loads(process.communicate(timeout=30)[0])


def orch_exec(env, inventory, mode="on"):
    return subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "ran"],
                          env={**env, "ORCH_AGENT": mode}, capture_output=True, text=True, timeout=60)


@pytest.fixture()
def agent_dir(tmp_path):
    directory = str(tmp_path / "agent")
    yield directory
    stop_agents(directory)


@needs_root
def test_a_listener_of_another_uid_gets_zero_bytes(agent_dir, inventory):
    """The folder is ours and 0700, but the process on the socket is nobody's (its socket was
    moved in): the client checks SO_PEERCRED before it sends a byte or an fd."""
    _nobody()
    protocol.private_dir(agent_dir)
    drop = tempfile.mkdtemp(prefix="orch-trust-")
    os.chmod(drop, 0o777)
    try:
        listener = start_listener(os.path.join(drop, "s.sock"))
        os.rename(os.path.join(drop, "s.sock"), protocol.socket_path(agent_dir))
        env = {**os.environ, "ORCH_AGENT_DIR": agent_dir}
        out = orch_exec(env, inventory)
        required = orch_exec(env, inventory, "require")
        seen = listener_saw(listener)
        assert seen["connections"] >= 1 and (seen["bytes"], seen["fds"]) == (0, 0)
        assert (out.returncode, out.stdout) == (0, "ran\n"), out.stderr   # ran here instead
        assert "not using the agent" in out.stderr and "uid 65534" in out.stderr
        assert required.returncode == protocol.EXIT_AGENT_LOST
        assert agent_pids(agent_dir) == []
    finally:
        os.rmdir(drop)


@needs_root
def test_a_folder_of_another_uid_is_never_connected_to(inventory):
    """`sudo -E`: $ORCH_AGENT_DIR (or $XDG_RUNTIME_DIR) is the invoking user's. root's client
    does not even connect to the socket there."""
    nobody = _nobody()
    above = tempfile.mkdtemp(prefix="orch-trust-")   # under /tmp: nobody can reach it
    os.chmod(above, 0o755)
    directory = os.path.join(above, "theirs")
    os.mkdir(directory, 0o700)
    os.chown(directory, nobody.pw_uid, nobody.pw_gid)
    try:
        listener = start_listener(protocol.socket_path(directory))
        out = orch_exec({**os.environ, "ORCH_AGENT_DIR": directory}, inventory)
        assert (out.returncode, out.stdout) == (0, "ran\n"), out.stderr
        assert f"belongs to uid {nobody.pw_uid}, not to uid 0" in out.stderr
        assert listener_saw(listener) == {"connections": 0, "bytes": 0, "fds": 0}
    finally:
        shutil.rmtree(above)


@pytest.mark.parametrize("kind", ["symlink", "mode-0755"])
def test_a_symlinked_or_open_agent_folder_is_refused(tmp_path, inventory, kind):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    if kind == "symlink":
        directory = tmp_path / "link"
        directory.symlink_to(real)
    else:
        directory = real
        os.chmod(real, 0o755)
    try:
        out = orch_exec({**os.environ, "ORCH_AGENT_DIR": str(directory)}, inventory)
        assert (out.returncode, out.stdout) == (0, "ran\n"), out.stderr
        reason = "is a symbolic link" if kind == "symlink" else "has mode 0755, not 0700"
        assert reason in out.stderr and "running the command here" in out.stderr
        assert os.listdir(real) == [] and agent_pids(str(directory)) == []
        assert os.stat(real).st_mode & 0o777 == (0o700 if kind == "symlink" else 0o755)
    finally:
        stop_agents(str(directory))


def test_folders_above_must_be_closed_to_others(tmp_path):
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)       # anyone may rename our folder away and put theirs
    (open_parent / "agent").mkdir(mode=0o700)
    assert "is writable by other users" in protocol.unsafe_dir(str(open_parent / "agent"))
    os.chmod(open_parent, 0o1777)      # sticky, as /tmp: only we may rename what is ours
    assert protocol.unsafe_dir(str(open_parent / "agent")) is None
    assert protocol.unsafe_dir(str(tmp_path / "missing")) is None   # made 0700 on first use
