"""The warm agent against the sandbox (docs/guide/agent.md): the same output and exit codes as the
direct path, a command never run twice, a dead or stale agent handled, idle exit, other users
refused, many clients at once, changed inventory and known_hosts picked up.

The exec and forensics tests themselves run through the agent too (the cli_path fixture);
Ctrl-C killing the remote command and streaming stdin are proven there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
import yaml

from orchestrator.agent import protocol
from tests.support.agents import agent_pids, alive, stop_agents

ORCH = [sys.executable, "-m", "orchestrator"]
# every process's command line in the container (it has no procps)
COMMAND_LINES = ["python3", "-c", "import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
                 "    try: print(open('/proc/%s/cmdline' % p).read().replace('\\0', ' ').strip())\n"
                 "    except OSError: pass"]


@pytest.fixture()
def agent_env(tmp_path):
    """An agent folder of the test's own; its agents are stopped at the end."""
    directory = tmp_path / "agent"
    env = {**os.environ, "ORCH_AGENT_DIR": str(directory), "ORCH_AGENT": "require"}
    yield env
    stop_agents(str(directory))
    assert agent_pids(str(directory)) == []


def orch(env, inventory, *args, timeout=120, **kwargs):
    return subprocess.run([*ORCH, "-i", str(inventory), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def the_agent(env) -> int:
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    return pid


def status(env) -> dict:
    out = subprocess.run([*ORCH, "agent", "status", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    return json.loads(out.stdout)


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_same_output_and_exit_codes_as_the_direct_path(sandbox, agent_env, tmp_path):
    direct = {**agent_env, "ORCH_AGENT": "off"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  x: {adress: 1}\n")
    cases = [(sandbox.inventory_path, ["exec", "sb1-200", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]),
             (sandbox.inventory_path, ["exec", "sb1-202", "--", "true"]),
             (sandbox.inventory_path, ["exec", "nowhere", "--", "true"]),
             (sandbox.inventory_path, ["inventory", "check"]),
             (sandbox.inventory_path, ["ct", "list"]),
             (sandbox.inventory_path, ["ct", "status", "sb2-202"]),  # stopped: no uptime
             (sandbox.inventory_path, ["exec", "--bogus-option", "sb1-200", "true"]),
             (bad, ["exec", "x", "--", "true"])]
    for inventory, args in cases:
        expected = orch(direct, inventory, *args)
        got = orch(agent_env, inventory, *args)
        assert (got.returncode, got.stdout, got.stderr) == \
               (expected.returncode, expected.stdout, expected.stderr), args
    served = status(agent_env)
    assert served["commands_served"] == len(cases)
    hosts, sessions = served["fleets"][0]["hosts"], served["fleets"][0]["sessions"]
    # the only channels still open are the warm sessions', none of them busy
    assert hosts["sb1"]["connections"] >= 1 and not any(s["busy"] for s in sessions)
    assert hosts["sb1"]["channels_in_use"] == sum(s["idle"] for s in sessions if s["host"] == "sb1") > 0


def test_connections_stay_warm_between_commands(sandbox, agent_env):
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    pid = the_agent(agent_env)
    before = status(agent_env)["fleets"][0]["hosts"]["sb1"]["connections"]
    for _ in range(5):
        assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    after = status(agent_env)
    assert the_agent(agent_env) == pid and after["commands_served"] == 6
    assert after["fleets"][0]["hosts"]["sb1"]["connections"] == before  # no new handshakes


def test_agent_killed_mid_command_is_an_error_and_never_a_rerun(sandbox, agent_env, fleet):
    ct = fleet.targets(["sb1-200"])[0]
    mark = f"/tmp/agent-once-{uuid.uuid4().hex}"
    process = subprocess.Popen(
        [*ORCH, "-i", str(sandbox.inventory_path), "exec", "sb1-200", "--", "sh", "-c",
         f"echo ran >> {mark}; echo started; exec sleep 407"],
        env=agent_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"started\n"
    os.kill(the_agent(agent_env), signal.SIGKILL)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == protocol.EXIT_AGENT_LOST == 255
    assert b"the orch agent ended while it ran this command" in stderr
    assert b"Traceback" not in stderr
    time.sleep(2)  # a rerun, if there were one, would have written its line by now
    assert ct.run(["cat", mark]).text == "ran\n"
    # its channel closed with the agent: the reaper killed the remote command
    wait_for(lambda: "sleep 407" not in ct.run(COMMAND_LINES).text.splitlines(), 10,
             "the remote command outlived the agent")
    ct.run(["rm", "-f", mark])


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_command_stops_at_once_and_the_agent_serves_the_next(
        sandbox, agent_env, fleet, number):
    """Ctrl-C (or SIGTERM) of a command the agent runs in a warm session: the request's
    interrupt closes the session, the remote command dies, the client gets the direct path's
    exit at once, and the same agent runs the next command."""
    ct = fleet.targets(["sb1-200"])[0]
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    pid = the_agent(agent_env)
    marker = f"sleep {420 + int(number)}"
    process = subprocess.Popen(
        [*ORCH, "-i", str(sandbox.inventory_path), "exec", "sb1-200", "--", "sh", "-c",
         f"echo started; exec {marker}"], env=agent_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"started\n"
    sent = time.monotonic()
    process.send_signal(number)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - sent < 3
    assert process.returncode == 128 + number, stderr
    assert stderr == (b"orch: error: interrupted\n" if number == signal.SIGINT else b"")
    wait_for(lambda: marker not in ct.run(COMMAND_LINES).text.splitlines(), 10,
             "the remote command outlived its interrupt")
    after = orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "echo", "next")
    assert (after.returncode, after.stdout) == (0, "next\n"), after.stderr
    assert the_agent(agent_env) == pid


def test_agent_killed_between_commands_is_replaced(sandbox, agent_env):
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    first = the_agent(agent_env)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), 10, "the agent did not die")
    assert os.path.exists(protocol.socket_path(agent_env["ORCH_AGENT_DIR"]))  # stale now
    out = orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "echo", "again")
    assert (out.returncode, out.stdout) == (0, "again\n"), out.stderr
    assert the_agent(agent_env) != first


def test_a_stale_socket_file_is_replaced(sandbox, agent_env):
    directory = agent_env["ORCH_AGENT_DIR"]
    protocol.private_dir(directory)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(protocol.socket_path(directory))
    stale.close()  # the file stays, nobody listens: what a crashed agent leaves
    out = orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "echo", "fresh")
    assert (out.returncode, out.stdout) == (0, "fresh\n"), out.stderr
    assert status(agent_env)["commands_served"] == 1


def test_the_agent_exits_when_idle(sandbox, agent_env):
    env = {**agent_env, "ORCH_AGENT_IDLE": "1.5"}
    assert orch(env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    pid = the_agent(env)
    assert status(env)["idle_exit_s"] == 1.5
    wait_for(lambda: not alive(pid), 15, "the agent did not exit when idle")
    assert not os.path.exists(protocol.socket_path(env["ORCH_AGENT_DIR"]))


@pytest.fixture()
def agent_env_in_tmp():
    """An agent folder directly under /tmp: the nobody user must be able to reach it once
    its mode is opened up (pytest's own tmp folders are 0700)."""
    parent = tempfile.mkdtemp(prefix="orch-agent-test-")
    os.chmod(parent, 0o711)
    directory = os.path.join(parent, "agent")
    yield {**os.environ, "ORCH_AGENT_DIR": directory, "ORCH_AGENT": "require"}
    stop_agents(directory)
    shutil.rmtree(parent, ignore_errors=True)


def test_other_users_are_refused(sandbox, agent_env_in_tmp):
    agent_env = agent_env_in_tmp
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    directory = agent_env["ORCH_AGENT_DIR"]
    path = protocol.socket_path(directory)
    assert os.stat(directory).st_mode & 0o777 == 0o700
    probe = """
import json, socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(sys.argv[1])
except OSError as error:
    print(json.dumps({"connect": type(error).__name__})); sys.exit()
body = json.dumps({"type": sys.argv[2], "argv": ["exec", "sb1-200", "--", "touch", "/tmp/nobody-was-here"],
                   "cwd": "/", "env": {}, "stdio": []}).encode()
socket.send_fds(sock, [struct.pack(">I", len(body)) + body], [0, 1, 2])
data = b""
while True:
    piece = sock.recv(65536)
    if not piece:
        break
    data += piece
print(json.dumps({"reply": json.loads(data[4:]) if data else None}))
"""

    def as_nobody(kind):
        # the system's python: a user's pyenv or venv under /root is not for nobody
        out = subprocess.run(["/usr/bin/python3", "-I", "-c", probe, path, kind], user="nobody",
                             cwd="/", capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    # the first wall: nobody else can enter the folder
    assert as_nobody("status") == {"connect": "PermissionError"}
    # the second: with the folder and socket opened up, the agent checks the peer's uid
    os.chmod(directory, 0o711)
    os.chmod(path, 0o666)
    try:
        for kind in ("status", "run"):
            assert as_nobody(kind) == {"reply": {"type": "refused", "reason": "another user"}}
    finally:
        os.chmod(directory, 0o700)
        os.chmod(path, 0o600)
    assert status(agent_env)["commands_served"] == 1
    out = orch({**agent_env, "ORCH_AGENT": "off"}, sandbox.inventory_path, "exec", "sb1-200",
               "--", "test", "-e", "/tmp/nobody-was-here")
    assert out.returncode == 1


def test_fifty_concurrent_commands_keep_their_output_apart(sandbox, agent_env):
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    script = 'for i in 1 2 3 4 5; do echo "$1-out-$i"; echo "$1-err-$i" >&2; done; exit $(($1 % 7))'
    processes = [subprocess.Popen([*ORCH, "-i", str(sandbox.inventory_path), "exec",
                                   f"sb{1 + n % 2}-20{n % 2}", "--", "sh", "-c", script, "sh", str(n)],
                                  env=agent_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in range(50)]
    for n, process in enumerate(processes):
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == n % 7, stderr
        assert stdout == "".join(f"{n}-out-{i}\n" for i in range(1, 6))
        assert stderr == "".join(f"{n}-err-{i}\n" for i in range(1, 6))
    assert status(agent_env)["commands_served"] == 51


def _own_known_hosts(sandbox, tmp_path) -> tuple[str, object]:
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    known = tmp_path / "known_hosts"
    known.write_text(sandbox.known_hosts.read_text())
    for host in data["hosts"].values():
        host["known_hosts"] = str(known)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path), known


def test_changed_inventory_and_known_hosts_are_picked_up(sandbox, agent_env, tmp_path):
    inventory, known = _own_known_hosts(sandbox, tmp_path)
    assert orch(agent_env, inventory, "exec", "sb1-200", "--", "true").returncode == 0
    # a new name in the inventory works at once
    data = yaml.safe_load(open(inventory))
    data["containers"]["renamed"] = {"host": "sb1", "vmid": 200}
    open(inventory, "w").write(yaml.safe_dump(data))
    out = orch(agent_env, inventory, "exec", "renamed", "--", "echo", "seen")
    assert (out.returncode, out.stdout) == (0, "seen\n"), out.stderr
    # a host key taken out of known_hosts: refused through the warm agent as on the direct path
    known.write_text("")
    got = orch(agent_env, inventory, "exec", "sb1-200", "--", "true")
    expected = orch({**agent_env, "ORCH_AGENT": "off"}, inventory, "exec", "sb1-200", "--", "true")
    assert (got.returncode, got.stderr) == (expected.returncode, expected.stderr)
    assert got.returncode == 255 and "--trust-new-host-keys" in got.stderr


def test_agent_stop_and_status(sandbox, agent_env):
    none = subprocess.run([*ORCH, "agent", "status"], env=agent_env, capture_output=True, text=True)
    assert none.returncode == 1 and "no agent runs" in none.stdout
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    shown = subprocess.run([*ORCH, "agent", "status"], env=agent_env, capture_output=True, text=True)
    assert shown.returncode == 0 and "sb1: root@" in shown.stdout and "1 connection(s)" in shown.stdout
    pid = the_agent(agent_env)
    stopped = subprocess.run([*ORCH, "agent", "stop"], env=agent_env, capture_output=True, text=True)
    assert stopped.returncode == 0
    wait_for(lambda: not alive(pid), 10, "the agent did not stop")


def _environment(text: str) -> dict:
    """env's output without what differs per connection (the client's port)."""
    pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v for k, v in pairs.items() if k not in ("SSH_CLIENT", "SSH_CONNECTION")}


def test_commands_run_in_one_warm_session_with_the_environment_pct_exec_gives(sandbox, agent_env):
    # orch's container environment: pct exec --keep-env 0 (nothing of the host's session), orch's PATH
    manual = subprocess.run(["ssh", "-F", str(sandbox.ssh_config), "sb1",
                             "pct exec 200 --keep-env 0 -- env"],
                            capture_output=True, text=True, timeout=60)
    assert manual.returncode == 0, manual.stderr
    expected = _environment(manual.stdout)
    expected["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # orch's
    assert "SSH_CONNECTION" not in manual.stdout and "HOME" not in expected
    direct = orch({**agent_env, "ORCH_AGENT": "off"}, sandbox.inventory_path, "exec", "sb1-200", "--", "env")
    warm = [orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "env") for _ in range(2)]
    # nothing added on the way: no LC_CTYPE from a Python helper's locale coercion (PEP 538)
    assert _environment(direct.stdout) == expected
    assert "SSH_CONNECTION" not in direct.stdout   # the host session's, kept out by --keep-env 0
    assert [_environment(out.stdout) for out in warm] == [expected, expected]
    # the commands ran in one session: their parent is the same server process each time
    parents = {orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "sh", "-c",
                    "echo $PPID").stdout for _ in range(3)}
    assert len(parents) == 1
    assert {"host": "sb1", "vmid": 200, "idle": 1, "busy": 0} in status(agent_env)["fleets"][0]["sessions"]


def test_a_container_stopped_under_its_warm_session_is_reported_as_stopped(sandbox, agent_env):
    direct = {**agent_env, "ORCH_AGENT": "off"}
    assert sandbox.run_on_host("sb2", ["pct", "start", "202"], timeout=30).returncode == 0
    try:
        out = orch(agent_env, sandbox.inventory_path, "exec", "sb2-202", "--", "echo", "up")
        assert (out.returncode, out.stdout) == (0, "up\n"), out.stderr
        assert any(s["vmid"] == 202 for s in status(agent_env)["fleets"][0]["sessions"])
    finally:
        assert sandbox.run_on_host("sb2", ["pct", "stop", "202"], timeout=30).returncode == 0
    # the warm session died with the container: the command goes the direct path's way,
    # with its message and exit code, and runs nowhere
    got = orch(agent_env, sandbox.inventory_path, "exec", "sb2-202", "--", "true")
    expected = orch(direct, sandbox.inventory_path, "exec", "sb2-202", "--", "true")
    assert (got.returncode, got.stdout, got.stderr) == (expected.returncode, expected.stdout, expected.stderr)
    assert got.returncode == 4 and "is not running" in got.stderr
    assert not any(s["vmid"] == 202 for s in status(agent_env)["fleets"][0]["sessions"])


def _inventory_with(sandbox, path, **host_values) -> str:
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    for host in data["hosts"].values():
        for key, value in host_values.items():
            if value is None:
                host.pop(key, None)
            else:
                host[key] = value
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_relative_paths_in_the_inventory_are_the_callers(sandbox, agent_env, tmp_path):
    """`known_hosts: keys/known_hosts` means the file in the folder orch runs in, through the
    agent too (it runs in /), and each folder gets its own: one without the keys is refused."""
    inventory = _inventory_with(sandbox, tmp_path / "inventory.yaml", known_hosts="keys/known_hosts")
    keyed, empty = tmp_path / "keyed", tmp_path / "empty"
    for folder in (keyed, empty):
        (folder / "keys").mkdir(parents=True)
    (keyed / "keys" / "known_hosts").write_text(sandbox.known_hosts.read_text())
    (empty / "keys" / "known_hosts").write_text("")
    for folder, code in ((keyed, 0), (empty, 255), (keyed, 0)):
        got = orch(agent_env, inventory, "exec", "sb1-200", "--", "echo", "hi", cwd=folder)
        direct = orch({**agent_env, "ORCH_AGENT": "off"}, inventory, "exec", "sb1-200", "--",
                      "echo", "hi", cwd=folder)
        assert (got.returncode, got.stdout, got.stderr) == (direct.returncode, direct.stdout, direct.stderr)
        assert got.returncode == code, got.stderr
    assert status(agent_env)["commands_served"] == 3


def test_each_client_connects_with_its_own_environment(sandbox, agent_env, tmp_path):
    """The agent was started by a client whose HOME has the host keys; a later client whose
    HOME has none is refused as on the direct path (a warm session's connection, opened
    outside the request, once took the agent's own HOME, i.e. the first client's)."""
    inventory = _inventory_with(sandbox, tmp_path / "inventory.yaml", known_hosts=None)
    homes = {}
    for name, keys in (("first", sandbox.known_hosts.read_text()), ("later", "")):
        home = tmp_path / name
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "known_hosts").write_text(keys)
        homes[name] = {**agent_env, "HOME": str(home)}
    assert orch(homes["first"], inventory, "exec", "sb1-200", "--", "true").returncode == 0
    got = orch(homes["later"], inventory, "exec", "sb1-200", "--", "true")
    direct = orch({**homes["later"], "ORCH_AGENT": "off"}, inventory, "exec", "sb1-200", "--", "true")
    assert (got.returncode, got.stderr) == (direct.returncode, direct.stderr)
    assert got.returncode == 255 and "not in ~/.ssh/known_hosts" in got.stderr
    # and the agent process keeps nothing of the first client's environment but the basics
    with open(f"/proc/{the_agent(agent_env)}/environ", "rb") as environ:
        names = {item.split(b"=", 1)[0].decode() for item in environ.read().split(b"\0") if item}
    assert "ORCH_AGENT" not in names and "PYTEST_CURRENT_TEST" not in names


def test_the_ssh_agent_and_home_are_the_clients(sandbox, agent_env, tmp_path):
    """No identity in the inventory: the key comes from the ssh-agent at the client's
    SSH_AUTH_SOCK (paramiko would look in the agent process's os.environ, which has none),
    or from the default keys under the client's HOME; a client with neither is refused, as
    on the direct path."""
    inventory = _inventory_with(sandbox, tmp_path / "inventory.yaml", identity=None)
    socket_path = str(tmp_path / "ssh-agent.sock")
    ssh_agent = subprocess.Popen(["ssh-agent", "-D", "-a", socket_path], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(socket_path), 10, "ssh-agent did not start")
        subprocess.run(["ssh-add", "-q", str(sandbox.identity)], env={**os.environ, "SSH_AUTH_SOCK": socket_path},
                       check=True, timeout=30, capture_output=True)
        homes = {}
        for name in ("keyless", "keyed"):
            (tmp_path / name / ".ssh").mkdir(parents=True)
            homes[name] = tmp_path / name
        shutil.copy(sandbox.identity, homes["keyed"] / ".ssh" / "id_ed25519")
        base = {k: v for k, v in agent_env.items() if k != "SSH_AUTH_SOCK"}
        clients = [({**base, "HOME": str(homes["keyless"]), "SSH_AUTH_SOCK": socket_path}, 0),
                   ({**base, "HOME": str(homes["keyless"])}, 255),
                   ({**base, "HOME": str(homes["keyed"])}, 0)]
        for env, code in clients:
            got = orch(env, inventory, "exec", "sb1-200", "--", "echo", "hi")
            direct = orch({**env, "ORCH_AGENT": "off"}, inventory, "exec", "sb1-200", "--", "echo", "hi")
            assert (got.returncode, got.stdout, got.stderr) == (direct.returncode, direct.stdout, direct.stderr)
            assert got.returncode == code, got.stderr
        assert status(agent_env)["commands_served"] == 3
    finally:
        ssh_agent.terminate()
        ssh_agent.wait(timeout=10)


def test_a_frozen_agent_costs_a_quick_command_its_accept_bound(sandbox, agent_env):
    """A SIGSTOPped agent once hung every quick command past 40 s: the client falls back
    in-process after ACCEPT_WAIT_S, and the woken agent never runs the command too."""
    from orchestrator.agent.client import ACCEPT_WAIT_S
    assert orch(agent_env, sandbox.inventory_path, "exec", "sb1-200", "--", "true").returncode == 0
    pid = the_agent(agent_env)
    mark = f"/tmp/agent-frozen-{uuid.uuid4().hex}"
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        out = orch({**agent_env, "ORCH_AGENT": "on"}, sandbox.inventory_path, "exec", "sb1-200",
                   "--", "sh", "-c", f"echo ran >> {mark}; echo hi")
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (out.returncode, out.stdout) == (0, "hi\n"), out.stderr
    assert elapsed < ACCEPT_WAIT_S + 5, f"{elapsed:.1f} s"
    time.sleep(2)   # the woken agent has read the request by now
    check = orch({**agent_env, "ORCH_AGENT": "off"}, sandbox.inventory_path, "exec", "sb1-200",
                 "--", "sh", "-c", f"cat {mark}; rm -f {mark}")
    assert check.stdout == "ran\n"
