"""The warm agent with the local transport (no sandbox): a real agent process, real fds
passed over its socket. The SSH side is proven in tests/integration/test_agent_sandbox.py."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import orchestrator
from orchestrator.agent import client, protocol
from orchestrator.payloads._tarstream import TEMP_MARK
from tests.support.agents import agent_pids, stop_agents
from tests.support.cli import two_local_containers

ORCH = [sys.executable, "-m", "orchestrator"]

@pytest.fixture()
def env(tmp_path):
    directory = tmp_path / "agent"
    yield {**os.environ, "ORCH_AGENT_DIR": str(directory), "ORCH_AGENT": "require"}
    stop_agents(str(directory))


@pytest.fixture()
def inventory(tmp_path):
    return two_local_containers(tmp_path)


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


def test_concurrent_requests_each_see_their_own_environment_and_folder(env, tmp_path):
    """Two commands in the agent at once, each with its own environment, folder and
    ./inventory.yaml: each reads its own, as on the direct path (the local command runs in
    the caller's folder there; the agent once ran it in its own, /)."""
    script = 'sleep 1; echo "$ORCH_TEST_VALUE $(pwd)"'
    folders = {}
    for name in ("one", "two"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "inventory.yaml").write_text(
            f"hosts:\n  here: {{transport: local}}\ncontainers:\n  ct-{name}: {{host: here}}\n")
        folders[name] = folder
    assert subprocess.run([*ORCH, "exec", "ct-one", "--", "true"], env={**env, "ORCH_INVENTORY": ""},
                          cwd=folders["one"], timeout=60).returncode == 0   # the agent is warm
    runs = {}
    for mode in ("require", "off"):
        processes = {name: subprocess.Popen(
            [*ORCH, "exec", f"ct-{name}", "--", "sh", "-c", script], cwd=folder,
            env={**env, "ORCH_INVENTORY": "", "ORCH_TEST_VALUE": name, "ORCH_AGENT": mode},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, folder in folders.items()}
        runs[mode] = {name: (p.communicate(timeout=60), p.returncode) for name, p in processes.items()}
    for name, folder in folders.items():
        assert runs["require"][name] == runs["off"][name] == ((f"{name} {folder}\n", ""), 0)
    assert status_of(env)["commands_served"] == 3


def test_an_interrupted_exec_stops_at_once_and_the_agent_serves_the_next(env, inventory):
    """Ctrl-C of an agent-run `exec` of a long command: the interrupt token kills the command
    and the request ends as the direct path's Ctrl-C does ("interrupted", 130), within a
    second or two; the agent goes on serving (nothing raised asynchronously in its threads)."""
    marker = "47.25"   # `sleep 47.25`: the command's process, found by its argv
    for mode in ("require", "require"):   # twice: the second on the same warm agent
        process = subprocess.Popen([*ORCH, "-i", inventory, "exec", "dev", "--", "sleep", marker],
                                   env={**env, "ORCH_AGENT": mode}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not _processes_running("sleep", marker):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        _interrupted_at_once(process)
        deadline = time.monotonic() + 5
        while _processes_running("sleep", marker):
            assert time.monotonic() < deadline, "the interrupted command still runs"
            time.sleep(0.05)
    after = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "next"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert (after.returncode, after.stdout) == (0, "next\n"), after.stderr
    assert status_of(env)["commands_served"] == 3
    assert len(agent_pids(env["ORCH_AGENT_DIR"])) == 1


SIGNAL_RIGHT_AFTER_GO = textwrap.dedent("""\
    import os, signal, socket, sys
    from orchestrator.agent import client
    sent = socket.send_fds
    def go_then_a_signal(*args):
        # the command may run and print before this process runs again: a SIGTERM then
        result = sent(*args)
        os.kill(os.getpid(), signal.SIGTERM)
        return result
    client.socket.send_fds = go_then_a_signal
    print(client.run_in_agent(sys.argv[1:]), flush=True)
    """)


def test_a_signal_right_after_the_command_was_handed_over_is_the_commands(env, inventory):
    """A SIGTERM that arrives the moment "go" is sent (before the client would run another
    line: a loaded machine) is forwarded to the command: exit 143, as on the direct path,
    never the client killed by it with the command left running."""
    marker = "48.5"
    done = subprocess.run([sys.executable, "-c", SIGNAL_RIGHT_AFTER_GO, "-i", inventory, "exec",
                           "dev", "--", "sleep", marker], env=env, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, "143\n"), (done.returncode, done.stderr)
    deadline = time.monotonic() + 5
    while _processes_running("sleep", marker):
        assert time.monotonic() < deadline, "the command outlived its SIGTERM"
        time.sleep(0.05)


def test_cp_runs_in_the_agent_with_the_callers_folder_and_home(env, inventory, tmp_path):
    """Relative and ~ paths of `orch cp` are the caller's, in both directions, as on the
    direct path (the agent's own folder is /); the output is the direct path's."""
    caller, home, remote = tmp_path / "caller", tmp_path / "home", tmp_path / "remote"
    for folder in (caller, home, remote, caller / "back"):
        folder.mkdir()
    (caller / "notes.txt").write_text("from the caller's folder\n")
    (home / "key.txt").write_text("from the caller's home\n")
    runs = {}
    for mode in ("off", "require"):
        env_of = {**env, "ORCH_AGENT": mode, "HOME": str(home)}
        pushed = [subprocess.run([*ORCH, "-i", inventory, "cp", source, f"dev:{remote}/{mode}-{i}"],
                                 env=env_of, cwd=caller, capture_output=True, text=True, timeout=60)
                  for i, source in enumerate(("notes.txt", "~/key.txt"))]
        pulled = subprocess.run([*ORCH, "-i", inventory, "cp", f"dev:{remote}/{mode}-0", "back/"],
                                env=env_of, cwd=caller, capture_output=True, text=True, timeout=60)
        runs[mode] = [(run.returncode, run.stdout, _without_times(run.stderr, mode))
                      for run in pushed + [pulled]]
        copied = {path: path.read_text() if path.exists() else None
                  for path in (caller / "back" / f"{mode}-0", remote / f"{mode}-1")}
        assert list(copied.values()) == ["from the caller's folder\n", "from the caller's home\n"], runs[mode]
    assert runs["require"] == runs["off"] and runs["off"][0][0] == 0, runs
    assert status_of(env)["commands_served"] == 3


def _without_times(text: str, mode: str) -> str:
    """A cp line without its seconds and rate, which vary, and the mode in its names."""
    return re.sub(r"\(sha256 checked, .*\)", "(sha256 checked)", text).replace(mode, "MODE")


def test_an_interrupted_cp_in_the_agent_leaves_no_file_and_the_agent_serves_the_next(
        env, inventory, tmp_path):
    """Ctrl-C of an agent-run pull while its data flows (the sender slowed down by a python3
    of this test's own, first on PATH): the agent's receiver removes what it staged, the
    client exits 130 at once, and the same agent runs the next command."""
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "python3").write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, subprocess, sys, time
        child = subprocess.Popen([{sys.executable!r}, *sys.argv[1:]], stdout=subprocess.PIPE)
        for piece in iter(lambda: child.stdout.read1(65536), b""):
            os.write(1, piece)
            time.sleep(0.25)
        sys.exit(child.wait())
        """))
    (slow / "python3").chmod(0o755)
    (tmp_path / "big.bin").write_bytes(os.urandom(8 << 20))   # 32 s at 64 KiB per 250 ms
    into = tmp_path / "into"
    into.mkdir()
    assert subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "true"], env=env,
                          timeout=60).returncode == 0
    pid = agent_pids(env["ORCH_AGENT_DIR"])
    process = subprocess.Popen(
        [*ORCH, "-i", inventory, "cp", f"dev:{tmp_path}/big.bin", f"{into}/"],
        env={**env, "PATH": f"{slow}:{os.environ['PATH']}"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not any(name.startswith(TEMP_MARK) for name in os.listdir(into)):
        assert time.monotonic() < deadline and process.poll() is None, "no data ever arrived"
        time.sleep(0.02)
    _interrupted_at_once(process)
    assert os.listdir(into) == []
    _wait_until_idle(env)   # the agent's side of the cp winds down (its sender is slow)
    after = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "next"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert (after.returncode, after.stdout) == (0, "next\n"), after.stderr
    assert agent_pids(env["ORCH_AGENT_DIR"]) == pid


def _interrupted_at_once(process: subprocess.Popen) -> None:
    """Ctrl-C of an `orch` client: it ends as the direct path's Ctrl-C does, within 10 s (a
    second or two here; the bound allows a loaded machine and stays far below the commands'
    own 32 s and 47 s, which a client that waited for them would take)."""
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert (process.returncode, out, err) == (130, "", "orch: error: interrupted\n")


def _processes_running(*argv: str) -> bool:
    wanted = "\0".join(argv).encode() + b"\0"
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if cmdline.read() == wanted:
                    return True
        except OSError:
            continue
    return False


def status_of(env) -> dict:
    out = subprocess.run([*ORCH, "agent", "status", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    return json.loads(out.stdout)


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


@pytest.fixture()
def package_copy(tmp_path):
    """A copy of the installed package, first on PYTHONPATH: what a test edits is the copy,
    so the agents of the tests running beside it (their code the installed package) never
    see their code change and step aside mid-test."""
    parent = tmp_path / "copy"
    shutil.copytree(os.path.dirname(orchestrator.__file__), parent / "orchestrator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return parent


# a module the agent imported; a payload it reads and caches; a module it never imported
@pytest.mark.parametrize("name", ["ground/lazy.py", "payloads/exec_server.py", "nightly/rerun.py"])
def test_an_agent_whose_code_changed_steps_aside(env, inventory, package_copy, name):
    """An edit or upgrade in place keeps the socket's name: the old agent must not serve
    the new orch. It refuses (the command runs here instead) and exits. (An agent started
    by the copy runs the copy's code: had it run the installed package's, the edit would go
    unseen and it would serve on.)"""
    # run from the copy's folder: python puts the working folder before PYTHONPATH
    env, here = {**env, "PYTHONPATH": str(package_copy)}, package_copy
    assert subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "true"], env=env,
                          cwd=here, timeout=60).returncode == 0
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    source = package_copy / "orchestrator" / name
    before = os.stat(source)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    out = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "here"],
                         env={**env, "ORCH_AGENT": "on"}, cwd=here, capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stdout) == (0, "here\n"), out.stderr
    deadline = time.monotonic() + 10
    while pid in agent_pids(env["ORCH_AGENT_DIR"]):
        assert time.monotonic() < deadline, "the stale agent did not exit"
        time.sleep(0.05)


def test_every_file_of_the_package_is_stamped(package_copy):
    """New, removed or changed: any file of the package counts, by stat alone."""
    from orchestrator.agentd import server
    installed = os.path.dirname(orchestrator.__file__)
    assert os.path.join(installed, "payloads", "reaper.py") in server._code_stamps()
    package = package_copy / "orchestrator"
    before = server._code_stamps(str(package))
    assert str(package / "payloads" / "reaper.py") in before
    assert str(package / "targets" / "proxmox.py") in before
    added = package / "payloads" / "stamp-probe.txt"
    added.write_text("new")
    assert server._code_stamps(str(package)) != before
    added.unlink()
    assert server._code_stamps(str(package)) == before
    (package / "cli" / "app.py").write_text("# edited in place\n", encoding="utf-8")
    assert server._code_stamps(str(package)) != before


def test_a_wheel_installs_record_is_stamped(tmp_path):
    """Installed from a wheel, the package sits next to its dist-info: a reinstall rewrites
    RECORD even when it leaves every module's stat alike."""
    from orchestrator.agentd import server
    package = tmp_path / "site-packages" / "orchestrator"
    (package / "__pycache__").mkdir(parents=True)
    (package / "cli.py").write_text("")
    record = tmp_path / "site-packages" / "orch-0.1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("orchestrator/cli/app.py,,0\n")
    before = server._code_stamps(str(package))
    assert set(before) == {str(package / "cli.py"), str(record)}
    (package / "__pycache__" / "cli.cpython-311.pyc").write_text("")   # Python's own: ignored
    assert server._code_stamps(str(package)) == before
    record.write_text("orchestrator/cli/app.py,sha256=x,0\n")
    assert server._code_stamps(str(package)) != before


def _status(env) -> dict:
    out = subprocess.run([*ORCH, "agent", "status", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    return json.loads(out.stdout)


def _wait_until_idle(env, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while (_status(env) or {}).get("running"):
        assert time.monotonic() < deadline, "the agent still runs the interrupted command"
        time.sleep(0.1)


def _wait_until_running(env, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not (_status(env) or {}).get("running"):
        assert time.monotonic() < deadline, "the agent never ran the command"
        time.sleep(0.1)


def test_a_frozen_agent_costs_a_quick_command_at_most_the_accept_wait(env, inventory, tmp_path):
    """A SIGSTOPped agent once hung every quick command (no fall-back). Now the client falls
    back after ACCEPT_WAIT_S, and the agent, woken later, never runs the command too."""
    assert subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "true"], env=env,
                          timeout=60).returncode == 0
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    mark = tmp_path / "ran"
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        out = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "sh", "-c",
                              f"echo ran >> {mark}; echo hi"], env={**env, "ORCH_AGENT": "on"},
                             capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (out.returncode, out.stdout) == (0, "hi\n"), out.stderr
    # the fall-back's wait, plus a direct command's own time on a loaded machine (the suite
    # runs on several workers): far below the 60 s of a client that waits for ever
    assert elapsed < client.ACCEPT_WAIT_S + 10, f"{elapsed:.1f} s"
    time.sleep(1.5)   # the woken agent has read the request by now: it must not run it
    assert mark.read_text() == "ran\n"
    assert _status(env)["commands_served"] in (1, 2) and not _status(env)["running"]


def test_the_users_timeout_holds_when_the_agent_freezes_after_accepting(env, inventory, tmp_path):
    """`--timeout` was enforced only inside the agent: a frozen agent kept `--timeout 1`
    waiting forever. The client stops at the timeout and the kill's grace, and says so.
    (Its stderr goes to a file: the frozen agent holds the client's fds, so a pipe would
    see its end only when the agent lets go.)"""
    errors = tmp_path / "stderr"
    with open(errors, "w") as stderr:
        process = subprocess.Popen([*ORCH, "-i", inventory, "exec", "--timeout", "2", "dev",
                                    "--", "sleep", "30"], env=env, stdout=subprocess.DEVNULL,
                                   stderr=stderr)
    _wait_until_running(env)
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        process.wait(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    err = errors.read_text()
    assert process.returncode == 255
    assert "did not end this command within its --timeout of 2 s" in err and "Traceback" not in err
    assert elapsed < 2 + client.USER_TIMEOUT_GRACE_S + 2, f"{elapsed:.1f} s"


def test_quick_commands_run_at_once_while_the_agent_stops(env, inventory):
    """`orch agent stop` lets a running command end; meanwhile new quick commands once
    stalled 10 s each (the socket closed, a new agent could not take the lock). The agent
    now refuses them at once and they run here."""
    long = subprocess.Popen([*ORCH, "-i", inventory, "exec", "dev", "--", "sleep", "4"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_until_running(env)
    assert subprocess.run([*ORCH, "agent", "stop"], env=env, capture_output=True,
                          timeout=60).returncode == 0
    started = time.monotonic()
    quick = subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "echo", "quick"],
                           env={**env, "ORCH_AGENT": "on"}, capture_output=True, text=True,
                           timeout=60)
    elapsed = time.monotonic() - started
    assert (quick.returncode, quick.stdout) == (0, "quick\n"), quick.stderr
    # a stalled one took 10 s; this one is refused at once and runs here (a loaded machine: 6 s)
    assert elapsed < 6, f"{elapsed:.1f} s for a quick command while the agent stops"
    assert long.wait(timeout=60) == 0


@pytest.mark.parametrize("args, expected", [
    (["exec", "--timeout", "5", "dev", "--", "true"], 5.0),
    (["-i", "inv.yaml", "exec", "--json", "--timeout=2.5", "dev", "true"], 2.5),
    (["exec", "dev", "--", "sleep", "--timeout", "9"], None),     # the command's own option
    (["exec", "dev", "true"], None),
    (["exec", "--timeout", "soon", "dev", "true"], None),          # click's error to tell
    (["grep-torch", "--timeout", "5", "x"], None),
])
def test_the_client_reads_execs_timeout(args, expected):
    assert client.user_timeout(args) == expected


def test_an_inventory_edit_that_keeps_size_and_mtime_is_picked_up(env, inventory):
    """`cp -p` of an edited copy keeps the file's size, mtime and inode: the agent once ran
    the next command against the old inventory."""
    assert subprocess.run([*ORCH, "-i", inventory, "exec", "dev2", "--", "true"], env=env,
                          timeout=60).returncode == 0
    before = os.stat(inventory)
    with open(inventory, "r+") as handle:   # in place: the same inode
        text = handle.read()
        handle.seek(0)
        handle.write(text.replace("dev2", "dev3"))
    os.utime(inventory, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(inventory)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)
    out = subprocess.run([*ORCH, "-i", inventory, "exec", "dev3", "--", "echo", "new"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "new\n"), out.stderr


def test_agent_status_of_a_frozen_agent_is_a_sentence(env, inventory):
    assert subprocess.run([*ORCH, "-i", inventory, "exec", "dev", "--", "true"], env=env,
                          timeout=60).returncode == 0
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    os.kill(pid, signal.SIGSTOP)
    try:
        out = subprocess.run([*ORCH, "agent", "status"], env=env, capture_output=True, text=True,
                             timeout=60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert out.returncode == 1 and "did not answer within" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
