"""The transport against a stock sshd (issue 15): channel limits, env that arrives, a killed
connection, streaming both ways with bounded memory, remote commands that die with orch,
argument parsing and hostile arguments.

Every sandbox host runs OpenSSH's stock limits (MaxSessions 10, AcceptEnv LANG LC_* only):
the first test proves it, so the others cannot pass against a loosened server.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import paramiko
import pytest
import yaml

from orchestrator.ground.errors import BadArgument, ConnectionLost
from orchestrator.targets.fleet import Fleet
from tests.support.agents import agent_pids

ORCH = [sys.executable, "-m", "orchestrator"]
# every process's command line in the container, without needing procps there
COMMAND_LINES = ["python3", "-c", "import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
             "    try: print(open('/proc/%s/cmdline' % p).read().replace('\\0', ' ').strip())\n"
             "    except OSError: pass"]


def orch(sandbox, *args, timeout=120, **kwargs):
    return subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), *args],
                          capture_output=True, timeout=timeout, **kwargs)


def raw_client(sandbox, host: str) -> paramiko.SSHClient:
    """A plain paramiko connection, orch's accounting bypassed: what the server allows."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(sandbox.known_hosts))
    client.connect(sandbox.address(host), username="root", key_filename=str(sandbox.identity),
                   allow_agent=False, look_for_keys=False, timeout=10)
    return client


# --- 1. stock sshd limits ------------------------------------------------------------------------

def test_sandbox_sshd_has_stock_limits(sandbox):
    client = raw_client(sandbox, "sb1")
    try:
        channels = [client.get_transport().open_session(timeout=10) for _ in range(10)]
        started = time.monotonic()
        with pytest.raises(paramiko.ChannelException, match="Connect failed"):
            client.get_transport().open_session(timeout=10)
        assert time.monotonic() - started < 2, "the 11th channel is refused at once"
        for channel in channels:
            channel.close()
        channel = None
        deadline = time.monotonic() + 5
        while channel is None:   # sshd frees a closed session a moment after our CLOSE
            try:
                channel = client.get_transport().open_session(timeout=10)
            except paramiko.ChannelException:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        channel.update_environment({"FOO": "bar"})   # sshd ignores it without AcceptEnv
        channel.exec_command('printf "%s" "${FOO-unset}"')
        assert channel.makefile().read() == b"unset"
    finally:
        client.close()


def test_fifty_concurrent_commands_through_one_host(ct):
    outcomes = [None] * 50

    def one(index):
        try:
            outcomes[index] = ct.run(["sh", "-c", 'sleep 0.3; echo "$0"', str(index)],
                                     timeout=120).text.strip()
        except Exception as error:  # noqa: BLE001 - the test reports every failure
            outcomes[index] = repr(error)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == [str(i) for i in range(50)]
    connections = ct.host._connections
    assert 1 <= len(connections) <= 4 and all(c.capacity <= 10 for c in connections)


def test_more_sessions_than_the_server_allows_are_learned_not_failed(sandbox):
    # An inventory claiming MaxSessions 30 on one connection: sshd refuses the 11th
    # channel; orch must lower its count for that connection and wait, not fail.
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        ct = fleet.targets(["sb2-200"])[0]
        ct.host.settings.max_sessions, ct.host.settings.connections = 30, 1
        ct.host._connection_limit = 1
        outcomes = []
        threads = [threading.Thread(target=lambda: outcomes.append(
            ct.run(["sleep", "0.5"], timeout=60).exit_code)) for _ in range(25)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes == [0] * 25
        assert len(ct.host._connections) == 1 and ct.host._connections[0].capacity <= 10


def many_aliases_inventory(sandbox, tmp_path, count=14) -> str:
    """`count` inventory containers on one host (CTs 200 and 201 under many names) in one
    group: what a fan-out over more containers than MaxSessions looks like to orch."""
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    names = []
    for index in range(count):
        name = f"wide-{index}"
        data["containers"][name] = {"host": "sb1", "vmid": 200 + index % 2}
        names.append(name)
    data["groups"]["wide"] = names
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_exec_on_a_group_larger_than_max_sessions(cli_path, sandbox, tmp_path):
    inventory = many_aliases_inventory(sandbox, tmp_path, count=30)
    out = subprocess.run([*ORCH, "-i", inventory, "exec", "wide", "--", "sh", "-c",
                          "sleep 0.5; echo done"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.splitlines())
    assert lines == sorted(f"[wide-{i}] done" for i in range(30))


# --- 3. env that arrives -------------------------------------------------------------------------

ODD_ENV = {"FOO": "bar baz", "EMPTY": "", "QUOTES": "it's \"$HOME\" `x` $(y)",
           "LINES": "a\nb\tc", "UNI": "ünï ✓", "not-an-identifier": "ok", "-dash": "d"}
SHOW_ENV = ["python3", "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def test_env_arrives_on_the_host_and_in_the_container(fleet, ct):
    host = fleet.host("sb1")
    for target in (host, ct):
        seen = json.loads(target.run(SHOW_ENV, env=ODD_ENV, check=True).text)
        assert {k: seen.get(k) for k in ODD_ENV} == ODD_ENV, target.name
    # a program whose name holds '=' is still run as the program, not taken as a variable
    assert ct.run(["/bin/sh=x"], env={"FOO": "1"}).exit_code == 127


def test_shell_step_env_arrives(sandbox, tmp_path):
    proof = f"/tmp/orch-env-proof-{os.getpid()}"
    (tmp_path / "env.yaml").write_text(textwrap.dedent(f"""\
        name: env-proof
        targets: [sb1-200]
        steps:
          - shell:
              argv: [sh, -c, 'printf "%s" "$FOO" > {proof}']
              env: {{FOO: "bar baz"}}
        """))
    env = {**os.environ, "ORCH_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "run", str(tmp_path / "env.yaml")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        ct = fleet.targets(["sb1-200"])[0]
        assert ct.get(proof) == b"bar baz"
        ct.run(["rm", "-f", proof])


# --- 4. a killed connection ------------------------------------------------------------------------

def sshd_pids_serving(sandbox, host: str, client_port: int) -> set[int]:
    """The host's sshd processes holding the connection from our client_port."""
    listing = sandbox.run_on_host(host, ["ss", "-Htnp", "state", "established"], check=True)
    pids = set()
    for line in listing.stdout.decode().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].endswith(f":{client_port}"):
            pids |= {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
    return pids


def client_ports(pid: int) -> set[int]:
    listing = subprocess.run(["ss", "-Htnp", "state", "established"], capture_output=True,
                             text=True, check=True).stdout
    return {int(line.split()[2].rsplit(":", 1)[1]) for line in listing.splitlines()
            if f"pid={pid}," in line}


def kill_connection(sandbox, host: str, client_port: int) -> None:
    pids = sshd_pids_serving(sandbox, host, client_port)
    assert pids, f"no sshd serves port {client_port}"
    sandbox.run_on_host(host, ["kill", "-9", *map(str, pids)], check=True)


def test_killed_connection_raises_a_typed_error(sandbox):
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        ct = fleet.targets(["sb2-200"])[0]
        ct.run(["true"], check=True)
        port = ct.host._connections[0].transport.sock.getsockname()[1]
        timer = threading.Timer(1.0, kill_connection, args=(sandbox, "sb2", port))
        timer.start()
        try:
            with pytest.raises(ConnectionLost, match="broke while sleep 20 ran in sb2-200"):
                ct.run(["sleep", "20"], timeout=60)
        finally:
            timer.join()
        assert ct.run(["echo", "back"]).text == "back\n"   # a new connection next time


def test_killed_connection_in_orch_exec_is_reported(cli_path, sandbox):
    process = subprocess.Popen([*ORCH, "-i", str(sandbox.inventory_path), "exec", "sb2-201",
                                "--", "sh", "-c", "echo started; sleep 20"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"started\n"
    # through the agent, the connection is the agent's (with others, warm, beside it)
    pid = process.pid if cli_path == "direct" else agent_pids(os.environ["ORCH_AGENT_DIR"])[0]
    ports = [port for port in client_ports(pid) if sshd_pids_serving(sandbox, "sb2", port)]
    assert len(ports) == 1 if cli_path == "direct" else ports
    for port in ports:
        kill_connection(sandbox, "sb2", port)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 255
    assert b"connection to host sb2 broke" in stderr and b"Traceback" not in stderr


# --- 5. streaming ----------------------------------------------------------------------------------

def test_stdin_streams_to_the_command(cli_path, sandbox):
    process = subprocess.Popen(
        ["bash", "-c", 'printf "x\\n" | (cat; sleep 8) | "$@"', "stream",
         *ORCH, "-i", str(sandbox.inventory_path), "exec", "sb1-200", "--", "head", "-n1"],
        stdout=subprocess.PIPE)
    started = time.monotonic()
    line = process.stdout.readline()
    elapsed = time.monotonic() - started
    process.wait(timeout=30)
    assert line == b"x\n" and elapsed < 5, f"x arrived after {elapsed:.1f} s"


def test_large_output_streams_to_a_file_byte_exact(cli_path, sandbox, tmp_path):
    size = 30 * 1024 * 1024
    out_path = tmp_path / "out.bin"
    with open(out_path, "wb") as sink:
        done = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "exec", "sb1-200", "--",
                               "python3", "-c", "import sys\nfor i in range(%d): "
                               "sys.stdout.buffer.write(bytes([i %% 251]) * 1024)" % (size // 1024)],
                              stdout=sink, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0, done.stderr
    data = out_path.read_bytes()
    assert len(data) == size and data[:1024] == b"\0" * 1024 and data[-1] == (size // 1024 - 1) % 251


# --- 6. remote commands die with orch ----------------------------------------------------------------

def remote_sleeps(ct, marker: str) -> list[str]:
    return [line for line in ct.run(COMMAND_LINES, check=True).text.splitlines()
            if line.strip() == f"sleep {marker}"]


def wait_until_gone(ct, marker: str, seconds: float = 8.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while remote_sleeps(ct, marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return remote_sleeps(ct, marker)


def test_timeout_kills_the_remote_command(cli_path, sandbox, ct):
    out = orch(sandbox, "exec", "--timeout", "2", "sb1-200", "--", "sleep", "301", text=True)
    assert out.returncode == 255 and "sleep 301 in sb1-200" in out.stderr
    assert wait_until_gone(ct, "301") == []


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_kills_the_remote_command(cli_path, sandbox, ct, number):
    marker = str(310 + int(number))
    process = subprocess.Popen([*ORCH, "-i", str(sandbox.inventory_path), "exec", "sb1-200",
                                "sh", "-c", f"echo started; sleep {marker}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"started\n"
    assert remote_sleeps(ct, marker)
    process.send_signal(number)
    process.wait(timeout=30)
    assert process.returncode == 128 + number
    assert wait_until_gone(ct, marker) == []


def test_interrupt_of_a_group_exec_kills_every_command(cli_path, sandbox, tmp_path, fleet):
    inventory = many_aliases_inventory(sandbox, tmp_path, count=4)
    process = subprocess.Popen([*ORCH, "-i", inventory, "exec", "wide", "--", "sleep", "333"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    one, two = fleet.targets(["sb1-200", "sb1-201"])
    deadline = time.monotonic() + 20
    while len(remote_sleeps(one, "333") + remote_sleeps(two, "333")) < 4:
        assert time.monotonic() < deadline, "the commands did not start"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    assert process.returncode == 130
    assert wait_until_gone(one, "333") == [] and wait_until_gone(two, "333") == []


def test_a_command_under_the_reaper_keeps_its_exit_code(cli_path, sandbox):
    out = orch(sandbox, "exec", "sb1-200", "sh", "-c", "exit 7")
    assert out.returncode == 7
    out = orch(sandbox, "exec", "sb1-200", "sh", "-c", "kill -9 $$")
    assert out.returncode == 137


# --- 7. argument parsing and hostile arguments ----------------------------------------------------

def test_everything_after_the_target_belongs_to_the_command(cli_path, sandbox):
    script = "import sys; print(sys.argv[1:])"
    out = orch(sandbox, "exec", "sb1-200", "python3", "-c", script, "--timeout", "1", "--json",
               text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--timeout', '1', '--json']"
    out = orch(sandbox, "exec", "sb1-200", "--timeout", "1", "true", text=True)
    assert out.returncode == 2 and "options go before TARGET" in out.stderr


def test_long_arguments_beyond_what_sshd_takes(cli_path, sandbox, ct):
    # two 100 KiB arguments: the command string (200 KiB) exceeds what `$SHELL -c` can take
    big = ["a" * 100_000, "b'\"$x\n" * 20_000]
    script = "import sys, hashlib; print([hashlib.sha256(a.encode()).hexdigest() for a in sys.argv[1:]]); print(sys.stdin.read())"
    expected = [hashlib.sha256(a.encode()).hexdigest() for a in big]
    result = ct.run(["python3", "-c", script, *big], stdin=b"and stdin", check=True)
    assert result.text.splitlines() == [repr(expected), "and stdin"]
    out = orch(sandbox, "exec", "sb1-200", "--", "python3", "-c", script, *big, text=True,
               input="via orch")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [repr(expected), "via orch"]
    # one argument longer than Linux passes at all: a clear error before anything runs
    with pytest.raises(BadArgument, match="MAX_ARG_STRLEN"):
        ct.run(["echo", "c" * 200_000])


def test_non_utf8_argument_arrives_byte_exact(cli_path, sandbox):
    out = subprocess.run([os.fsencode(sys.executable), b"-m", b"orchestrator", b"-i",
                          os.fsencode(str(sandbox.inventory_path)), b"exec", b"sb1-200", b"--",
                          b"python3", b"-c", b"import os, sys; print(os.fsencode(sys.argv[1]).hex())",
                          b"caf\xe9 \xff"], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == b"caf\xe9 \xff".hex()


def test_peer_closing_after_accept_gives_one_clean_line(tmp_path):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def accept_and_close():
        try:
            while True:
                connection, _ = server.accept()
                connection.close()
        except OSError:  # the test closed the server
            pass
    thread = threading.Thread(target=accept_and_close, daemon=True)
    thread.start()
    (tmp_path / "inv.yaml").write_text(
        f"hosts:\n  rude: {{address: 127.0.0.1, port: {port}, connect_timeout: 5}}\n"
        "containers:\n  ct: {host: rude, vmid: 200}\n")
    out = subprocess.run([*ORCH, "-i", str(tmp_path / "inv.yaml"), "exec", "ct", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    server.close()
    assert out.returncode == 255
    assert "Traceback" not in out.stderr and "paramiko" not in out.stderr.lower()
    assert out.stderr.count("\n") == 1 and "SSH to host rude" in out.stderr, out.stderr


# --- 11. errors of a group name the container ----------------------------------------------------

def test_group_errors_name_the_container(cli_path, sandbox, tmp_path):
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["hosts"]["nowhere"] = {"address": "127.0.0.1", "port": 1, "connect_timeout": 2}
    data["containers"]["lost-ct"] = {"host": "nowhere", "vmid": 200}
    data["groups"]["mixed"] = ["sb1-200", "lost-ct"]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([*ORCH, "-i", str(path), "exec", "mixed", "--", "echo", "hi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 255
    assert "[sb1-200] hi" in out.stdout
    # the failed targets are listed at the end, one line each, after a count
    assert "error: 1 of 2 targets failed:" in out.stderr, out.stderr
    assert re.search(r"(?m)^  lost-ct: cannot reach host nowhere", out.stderr), out.stderr
