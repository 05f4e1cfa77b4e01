"""The warm agent with the local transport (no sandbox): a real agent process, real fds
passed over its socket. The SSH side is proven in tests/integration/test_agent_sandbox.py."""

from __future__ import annotations

import os
import pty
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import orchestrator.lazy
from orchestrator.agent import protocol
from tests.agents import agent_pids, stop_agents

ORCH = [sys.executable, "-m", "orchestrator"]


@pytest.fixture()
def env(tmp_path):
    directory = tmp_path / "agent"
    yield {**os.environ, "ORCH_AGENT_DIR": str(directory), "ORCH_AGENT": "require"}
    stop_agents(str(directory))


@pytest.fixture()
def inventory(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent("""\
        hosts:
          here: {transport: local}
        containers:
          dev: {host: here}
          dev2: {host: here}
        groups:
          both: [dev, dev2]
        """))
    return str(path)


def on_a_terminal(env, *args) -> bytes:
    """What orch writes to a (new, 0 x 0) pseudo-terminal: stdout and stderr together."""
    leader, follower = pty.openpty()
    try:
        subprocess.run([*ORCH, *args], env=env, stdin=follower, stdout=follower, stderr=follower,
                       timeout=60)
        os.set_blocking(leader, False)
        output = b""
        while True:
            try:
                piece = os.read(leader, 65536)
            except (BlockingIOError, OSError):
                return output
            output += piece
    finally:
        os.close(leader)
        os.close(follower)


def test_terminal_output_is_the_direct_paths(env, inventory):
    """Colours and table width as on the direct path (a new pty reports 0 x 0: rich takes it as
    unknown, 80 columns; the agent once drew every table 0 columns wide, i.e. nothing)."""
    for args in (["inventory", "check"], ["exec", "dev", "--", "echo", "hi"], ["ct", "list"],
                 ["exec", "nowhere", "--", "true"]):
        direct = on_a_terminal({**env, "ORCH_AGENT": "off"}, "-i", inventory, *args)
        through_agent = on_a_terminal(env, "-i", inventory, *args)
        assert through_agent == direct, args
        assert direct.strip(), args
    assert len(agent_pids(env["ORCH_AGENT_DIR"])) == 1


def test_relative_inventory_is_read_from_the_callers_folder(env, inventory, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "inventory.yaml").write_text("hosts:\n  there: {transport: local}\n"
                                          "containers:\n  only-here: {host: there}\n")
    for folder, target, code in ((other, "only-here", 0), (tmp_path, "only-here", 2)):
        out = subprocess.run([*ORCH, "exec", target, "--", "true"], env={**env, "ORCH_INVENTORY": ""},
                             cwd=folder, capture_output=True, text=True, timeout=60)
        direct = subprocess.run([*ORCH, "exec", target, "--", "true"], cwd=folder, timeout=60,
                                env={**env, "ORCH_INVENTORY": "", "ORCH_AGENT": "off"},
                                capture_output=True, text=True)
        assert (out.returncode, out.stdout, out.stderr) == (direct.returncode, direct.stdout, direct.stderr)
        assert out.returncode == code, out.stderr


def test_environment_is_the_callers(env, inventory):
    for value in ("one", "two"):
        out = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "sh", "-c", "echo $ORCH_TEST_VALUE"],
                             env={**env, "ORCH_TEST_VALUE": value}, capture_output=True, text=True, timeout=60)
        assert out.stdout == f"{value}\n", out.stderr


def test_an_agent_that_refuses_means_the_direct_path(env, inventory):
    """Before "accepted" any trouble falls back (ORCH_AGENT=on); require makes it an error."""
    directory = env["ORCH_AGENT_DIR"]
    protocol.private_dir(directory)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(protocol.socket_path(directory))
    listener.listen(8)  # a socket that takes connections and closes them: a dying agent
    try:
        process = subprocess.Popen([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "ran"],
                                   env={**env, "ORCH_AGENT": "on"}, stdout=subprocess.PIPE, text=True)
        conn, _ = listener.accept()
        conn.close()
        assert process.communicate(timeout=60)[0] == "ran\n" and process.returncode == 0
        process = subprocess.Popen([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "ran"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        conn, _ = listener.accept()
        conn.close()
        out, err = process.communicate(timeout=60)
        assert (process.returncode, out) == (255, "") and "ORCH_AGENT=require" in err
    finally:
        listener.close()


def test_concurrent_requests_never_mix_their_output(env, inventory):
    script = "for i in $(seq 200); do echo $1-$i; echo $1-err-$i >&2; done"
    processes = [subprocess.Popen([*ORCH, "-i", inventory, "exec", "dev", "--", "sh", "-c", script, "sh", str(n)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in range(12)]
    for n, process in enumerate(processes):
        out, err = process.communicate(timeout=120)
        assert out == "".join(f"{n}-{i}\n" for i in range(1, 201))
        assert err == "".join(f"{n}-err-{i}\n" for i in range(1, 201))


# a module the agent imported; a payload it reads and caches; a module it never imported
@pytest.mark.parametrize("name", ["lazy.py", "payloads/exec_server.py", "nightly.py"])
def test_an_agent_whose_code_changed_steps_aside(env, inventory, name):
    """An edit or upgrade in place keeps the socket's name: the old agent must not serve
    the new orch. It refuses (the command runs here instead) and exits."""
    assert subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "true"], env=env,
                          timeout=60).returncode == 0
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    source = os.path.join(os.path.dirname(orchestrator.lazy.__file__), name)
    before = os.stat(source)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    try:
        out = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "here"],
                             env={**env, "ORCH_AGENT": "on"}, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout) == (0, "here\n"), out.stderr
        deadline = time.monotonic() + 10
        while pid in agent_pids(env["ORCH_AGENT_DIR"]):
            assert time.monotonic() < deadline, "the stale agent did not exit"
            time.sleep(0.05)
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_every_file_of_the_package_is_stamped(tmp_path):
    """New, removed or changed: any file of the installed package counts, by stat alone."""
    from orchestrator.agentd import server
    server._remember_code()
    assert not server._code_changed()
    package = os.path.dirname(orchestrator.lazy.__file__)
    assert os.path.join(package, "payloads", "reaper.py") in server._CODE_STAMPS
    assert os.path.join(package, "proxmox.py") in server._CODE_STAMPS
    added = os.path.join(package, "payloads", f"stamp-probe-{os.getpid()}.txt")
    with open(added, "w") as handle:
        handle.write("new")
    try:
        assert server._code_changed()
    finally:
        os.unlink(added)
    assert not server._code_changed()


def test_a_wheel_installs_record_is_stamped(tmp_path):
    """Installed from a wheel, the package sits next to its dist-info: a reinstall rewrites
    RECORD even when it leaves every module's stat alike."""
    from orchestrator.agentd import server
    package = tmp_path / "site-packages" / "orchestrator"
    (package / "__pycache__").mkdir(parents=True)
    (package / "cli.py").write_text("")
    record = tmp_path / "site-packages" / "orch-0.1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("orchestrator/cli.py,,0\n")
    before = server._code_stamps(str(package))
    assert set(before) == {str(package / "cli.py"), str(record)}
    (package / "__pycache__" / "cli.cpython-311.pyc").write_text("")   # Python's own: ignored
    assert server._code_stamps(str(package)) == before
    record.write_text("orchestrator/cli.py,sha256=x,0\n")
    assert server._code_stamps(str(package)) != before
