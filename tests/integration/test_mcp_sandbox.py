"""`orch mcp` against the sandbox (real sshd, real LXC containers, real torch 2.13 in one of
them), driven by clients we did not write: the MCP SDK's own stdio client, and the MCP
Inspector's command-line mode (npm). The agent replay follows the seed story with a
scripted client: find the flag, read it, status, the DFlash playbook (fx-race with its
remediation), apply, verify, run again (ok), stop a run, revert.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'orch[mcp]')")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from orchestrator.mcp.policy import READ_TOOLS  # noqa: E402
from tests.fixtures.evil_sdist import attack_packages, make_evil_sdist  # noqa: E402
from tests.integration.torch_seed import remove_venv, seed_torch_venv  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_TARGET, TORCH_HOST, TORCH_VMID, VENV = "sb2-200", "sb2", 200, "mcp-venv"
INSPECTOR = "@modelcontextprotocol/inspector@0.14.3"
INSPECTOR_CACHE = os.path.expanduser("~/.cache/orch-test/mcp-inspector-0.14.3")


@pytest.fixture(scope="module")
def inventory(sandbox, tmp_path_factory):
    """The sandbox's inventory, with sb2-200's venv pointing at a private torch venv."""
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["containers"][TORCH_TARGET]["venv"] = f"/root/{VENV}"
    path = tmp_path_factory.mktemp("mcp") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def hosts_inventory(inventory, tmp_path_factory):
    """The same, without the groups named like the hosts: there, a bare `sb1` is the host."""
    data = yaml.safe_load(open(inventory).read())
    for host in data["hosts"]:
        data["groups"].pop(host, None)
    path = tmp_path_factory.mktemp("mcp-hosts") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def torch_venv_in_container(sandbox):
    seed_torch_venv(sandbox, TORCH_HOST, TORCH_VMID, VENV)
    yield f"/root/{VENV}"
    remove_venv(sandbox, TORCH_HOST, TORCH_VMID, VENV)


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "runs.sqlite")


class Agent:
    """A scripted MCP client: every call counted, results typed (structuredContent)."""

    def __init__(self, session: ClientSession):
        self.session = session
        self.calls = 0

    async def ok(self, tool: str, **arguments) -> dict:
        result = await self.session.call_tool(tool, arguments)
        self.calls += 1
        assert not result.is_error, f"{tool}: {result.content[0].text}"
        data = result.structured_content
        assert json.loads(result.content[0].text) == data  # the text is the same JSON
        return data

    async def error(self, tool: str, **arguments) -> str:
        result = await self.session.call_tool(tool, arguments)
        self.calls += 1
        assert result.is_error and result.structured_content is None, result
        return result.content[0].text


@contextlib.asynccontextmanager
async def serve(inventory: str, store: str, *server_args: str):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "orchestrator", "-i", inventory, "mcp", *server_args],
        env={**os.environ, "ORCH_STORE": store}, cwd=REPO)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield Agent(session)


def audit(store: str, *args: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "audit", "--json", *args],
                         capture_output=True, text=True, env={**os.environ, "ORCH_STORE": store},
                         check=True)
    return json.loads(out.stdout)


# ------------------------------------------------------------------ tools and schemas
def test_read_only_by_default_the_changing_tools_are_not_even_listed(inventory, store):
    async def scenario():
        async with serve(inventory, store) as agent:
            listed = (await agent.session.list_tools()).tools
            assert sorted(t.name for t in listed) == sorted(READ_TOOLS)
            assert all(t.annotations.read_only_hint for t in listed)
            grep = next(t for t in listed if t.name == "grep_source")
            schema = grep.input_schema
            assert schema["required"] == ["target", "pattern"]
            assert schema["properties"]["max_hits"]["maximum"] == 5000
            assert schema["properties"]["definition"]["type"] == "boolean"
            assert grep.output_schema["type"] == "object"
            message = await agent.error("exec", target="sb1-200", argv=["reboot"])
            assert message == "Unknown tool: exec"
            assert "Unknown tool" in await agent.error("fx_tls_apply", target="sb1-200")
            assert "Unknown tool" in await agent.error("run_start", playbook="playbooks/dflash-sandbox.yaml")
            [resource] = (await agent.session.list_resources()).resources
            read = await agent.session.read_resource(resource.uri)
            assert json.loads(read.contents[0].text)["default_target"] == "sb1-200"
            prompt = await agent.session.get_prompt("diagnose_fx_race", {"target": "sb1-200"})
            assert "fx_tls_status(target='sb1-200')" in prompt.messages[0].content.text
    asyncio.run(scenario())


def test_exec_argv_is_data_outputs_capped_and_the_session_stays_warm(inventory, store):
    async def scenario():
        async with serve(inventory, store, "--allow", "exec") as agent:
            exec_tool = next(t for t in (await agent.session.list_tools()).tools if t.name == "exec")
            assert exec_tool.input_schema["properties"]["argv"]["type"] == "array"
            assert exec_tool.input_schema["properties"]["argv"]["items"] == {"type": "string"}
            assert exec_tool.annotations.destructive_hint is True
            out = exec_tool.output_schema
            assert out["properties"]["stdout_truncated"]["type"] == "boolean"
            assert out["properties"]["exit_code"]["type"] == "integer" and "stdout_bytes" in out["required"]
            hostile = ["$(touch /tmp/pwned)", "a b; rm -rf /", "`id`", "'\"", "\\n"]
            result = await agent.ok("exec", target="sb1-200", argv=[
                "python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *hostile])
            assert json.loads(result["stdout"]) == hostile and result["exit_code"] == 0
            gone = await agent.ok("exec", target="sb1-200", argv=["test", "-e", "/tmp/pwned"])
            assert gone["exit_code"] == 1
            big = await agent.ok("exec", target="sb1-200", argv=["head", "-c", "300000", "/dev/zero"],
                                 max_output_bytes=1000)
            assert (big["stdout_bytes"], big["stdout_truncated"], len(big["stdout"])) == (300000, True, 1000)
            fed = await agent.ok("exec", target="sb1-200", argv=["cat"], stdin="line 1\nline 2\n")
            assert fed["stdout"] == "line 1\nline 2\n"
            slow = await agent.error("exec", target="sb1-200", argv=["sleep", "30"], timeout_s=1)
            assert "did not finish within 1 s" in slow
            failed = await agent.ok("exec", target="sb1-200", argv=["sh", "-c", "echo no >&2; exit 7"])
            assert (failed["exit_code"], failed["stderr"]) == (7, "no\n")
            # A shell string is not an argv: refused by the schema, not run.
            assert "argv" in await agent.error("exec", target="sb1-200", argv="reboot")
            timings = [(await agent.ok("exec", target="sb1-200", argv=["true"]))
                       for _ in range(10)]
            assert all(t["via"] == "session" for t in timings)
            # Still one session: the command server in the container has the same pid.
            pids = {(await agent.ok("exec", target="sb1-200", argv=["sh", "-c", "echo $PPID"]))["stdout"]
                    for _ in range(3)}
            assert len(pids) == 1
    asyncio.run(scenario())


def test_errors_are_tool_errors_with_orchs_hint(inventory, store):
    async def scenario():
        async with serve(inventory, store, "--allow", "exec") as agent:
            unknown = await agent.error("exec", target="nope", argv=["true"])
            assert "unknown target 'nope'" in unknown and "hint: known targets: sb1-200" in unknown
            stopped = await agent.error("exec", target="sb1-202", argv=["true"])
            assert "sb1-202 (CT 202 on host sb1) is not running" in stopped
            assert "hint: start it with `orch ct start sb1-202`" in stopped
            group = await agent.error("grep_source", target="running", pattern="x")
            assert "names 4 containers; name one" in group
            # sb1-200 has no torch in its venv: the payload's own sentence comes back.
            missing = await agent.error("fx_tls_status", target="sb1-200")
            assert "sb1-200" in missing
            rows = (await agent.ok("inventory_check", targets=["sb1-200", "sb1-202"]))["rows"]
            assert rows[0]["reachable"] and rows[0]["python_version"]
            assert not rows[1]["ok"] and "not running" in rows[1]["error"]
            listed = await agent.ok("list_targets")
            assert {c["name"]: c["vmid"] for c in listed["containers"]}["sb2-201"] == 201
            assert listed["groups"]["stopped"] == ["sb1-202", "sb2-202"]
    asyncio.run(scenario())


def test_an_allowance_for_one_target_refuses_the_others(inventory, store, tmp_path):
    async def scenario():
        async with serve(inventory, store, "--allow", "exec", "--allow-target", "sb1-200") as agent:
            assert (await agent.ok("exec", target="sb1-200", argv=["true"]))["exit_code"] == 0
            refused = await agent.error("exec", target="sb2-201", argv=["true"])
            assert "exec is not allowed on sb2-201" in refused and "only sb1-200" in refused
        policy = tmp_path / "policy.yaml"
        policy.write_text("allow: [write]\ntargets: [sb2]\n")   # a group: sb2's containers
        async with serve(inventory, store, "--policy", str(policy)) as agent:
            names = {t.name for t in (await agent.session.list_tools()).tools}
            assert {"fx_tls_apply", "run_stop"} <= names and "exec" not in names
            refused = await agent.error("fx_tls_revert", target="sb1-201")
            assert "fx_tls_revert is not allowed on sb1-201" in refused
    asyncio.run(scenario())


def test_every_call_is_audited_with_secrets_masked(inventory, store):
    async def scenario():
        async with serve(inventory, store, "--allow", "exec") as agent:
            await agent.ok("exec", target="sb1-200", argv=["env", "API_TOKEN=s3cret-value", "true"],
                           stdin="password: hunter2")
            await agent.error("exec", target="sb1-202", argv=["true"])
            await agent.ok("list_targets")
            await agent.error("fx_tls_apply", target="sb1-200")       # not listed
            await agent.error("exec", target="sb1-200", argv="reboot")  # not an argv
    asyncio.run(scenario())
    rows = audit(store)
    assert [r["tool"] for r in rows] == ["exec", "fx_tls_apply", "list_targets", "exec", "exec"]
    not_argv, not_listed, listed, stopped, first = rows
    assert not_listed["outcome"] == "refused" and "Unknown tool" in not_listed["error"]
    assert not_argv["outcome"] == "refused" and not_argv["arguments"]["argv"] == "reboot"
    assert listed["outcome"] == "ok" and listed["target"] == ""
    assert first["outcome"] == "ok" and first["target"] == "sb1-200" and first["duration_ms"] > 0
    assert first["arguments"]["argv"] == ["env", "API_TOKEN=***", "true"]
    assert first["arguments"]["stdin"] == "<17 bytes>"
    assert stopped["outcome"] == "error" and "is not running" in stopped["error"]
    everything = json.dumps(rows)
    assert "s3cret-value" not in everything and "hunter2" not in everything
    assert len({r["session"] for r in rows}) == 1


def test_hosts_themselves_and_template_vars_are_refused_and_audited(hosts_inventory, store, tmp_path):
    """A Proxmox host's own name is no target for any tool (read-only ones too) unless
    --allow-host names it; run_start vars holding a template are refused before anything is
    rendered: no file on the controller, the refusal in the audit trail."""
    mark = tmp_path / "escaped"
    payload = "{{ lipsum.__globals__['os'].system('touch %s') }}" % mark

    async def scenario():
        async with serve(hosts_inventory, store, "--allow", "exec", "--allow", "write",
                         "--allow-target", "sb1-200", "--allow-playbook", "playbooks") as agent:
            for tool, arguments in [("exec", {"target": "sb1", "argv": ["id"]}),
                                    ("grep_source", {"target": "sb1", "pattern": "x"}),
                                    ("fx_tls_status", {"target": "sb2"})]:
                refused = await agent.error(tool, **arguments)
                assert "MCP tools act in containers only" in refused and "--allow-host" in refused
            refused = await agent.error("run_start", playbook="playbooks/dflash-sandbox.yaml",
                                        vars={"drafters": payload}, targets=["sb1-200"])
            assert "vars.drafters holds template syntax" in refused
            assert (await agent.ok("exec", target="sb1-200", argv=["true"]))["exit_code"] == 0
        async with serve(hosts_inventory, store, "--allow", "exec", "--allow-host", "sb1") as agent:
            on_host = await agent.ok("exec", target="sb1", argv=["sh", "-c", "command -v pct"])
            assert on_host["exit_code"] == 0            # the host itself: allowed by name
            assert "--allow-host sb2" in await agent.error("exec", target="sb2", argv=["true"])
    asyncio.run(scenario())
    assert not mark.exists()
    rows = list(reversed(audit(store)))
    assert [(r["tool"], r["target"], r["outcome"]) for r in rows] == [
        ("exec", "sb1", "refused"), ("grep_source", "sb1", "refused"),
        ("fx_tls_status", "sb2", "refused"), ("run_start", "sb1-200", "refused"),
        ("exec", "sb1-200", "ok"), ("exec", "sb1", "ok"), ("exec", "sb2", "refused")]
    assert rows[3]["arguments"]["vars"]["drafters"] == payload   # recorded as sent


def test_write_on_one_container_neither_runs_code_nor_reads_files_on_the_controller(
        inventory, store, tmp_path):
    """The report's two doors, through the SDK's stdio client against `orch mcp` holding
    write on sb1-200 only: dflash.yaml's packages as pip options (38c2ac6's controller built
    the sdist in its own pip download: the canary was written), trainer_file naming a file
    of the controller (pushed in, then read_file), and run_start on a private key (its
    error echoed the key). Each is refused and audited as refused; no canary, no byte."""
    canary = tmp_path / "canary"
    make_evil_sdist(tmp_path / "sdists", canary)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    secret = key.read_text()

    async def scenario():
        async with serve(inventory, store, "--allow", "write", "--allow", "exec",
                         "--allow-target", "sb1-200", "--allow-playbook", "playbooks") as agent:
            said = [await agent.error("run_start", playbook="dflash-sandbox.yaml", vars={
                        "wheelhouse": str(tmp_path / "wh"),
                        "packages": attack_packages(tmp_path / "sdists")}),
                    await agent.error("run_start", playbook="dflash-sandbox.yaml",
                                      vars={"trainer_file": str(key)}),
                    await agent.error("run_start", playbook=str(key), targets=["sb1-200"])]
            listed = await agent.ok("exec", target="sb1-200", argv=[
                "sh", "-c", "grep -rl 'OPENSSH PRIVATE' /var/lib/orch/runs 2>/dev/null | wc -l"])
            return said, listed
    said, listed = asyncio.run(scenario())
    assert "does not let an MCP client set 'wheelhouse'" in said[0]
    assert "does not let an MCP client set 'trainer_file'" in said[1]
    assert "is not a playbook of the folders" in said[2]
    time.sleep(1)
    assert not canary.exists() and not (tmp_path / "wh").exists()
    body = "".join(line for line in secret.splitlines() if "PRIVATE" not in line)
    everything = " ".join(said) + json.dumps(audit(store))
    assert not any(body[at:at + 8] in everything for at in range(len(body) - 8))
    assert listed["stdout"].strip() == "0"
    rows = list(reversed(audit(store)))
    assert [(r["tool"], r["outcome"]) for r in rows] == [("run_start", "refused")] * 3 + [("exec", "ok")]


def test_a_large_output_pages_through_its_resource_link(inventory, store):
    script = ("import sys\nfor i in range(200000): sys.stdout.write(f'{i:08d} ' + 'x' * 40 + '\\n')\n"
              "sys.stderr.write('warn\\n' * 100000 + 'the real error\\n')\n")

    async def scenario():
        async with serve(inventory, store, "--allow", "exec") as agent:
            result = await agent.session.call_tool("exec", {"target": "sb1-200", "argv": ["python3", "-c", script],
                                                            "max_output_bytes": 2000})
            data = result.structured_content
            [link, _] = [c for c in result.content if c.type == "resource_link"]
            pages, offset = [], 0
            while offset < data["stdout_bytes"]:
                page = await agent.session.read_resource(f"{link.uri}?offset={offset}&length=1048576")
                pages.append(page.contents[0].text)
                offset += len(pages[-1].encode())
            return data, link, "".join(pages)
    data, link, text = asyncio.run(scenario())
    lines = text.splitlines()
    assert data["stdout_truncated"] and len(data["stdout"]) == 2000 and link.size == data["stdout_bytes"]
    assert len(lines) == 200000 and lines[-1].startswith("00199999 ")
    assert data["stderr_tail"].endswith("the real error\n")


@pytest.mark.torch
def test_source_tools_stay_inside_the_package(inventory, store, torch_venv_in_container):
    async def scenario():
        async with serve(inventory, store, "--allow", "exec") as agent:
            found = await agent.ok("grep_source", target=TORCH_TARGET, pattern="_is_fx_tracing_flag",
                                   fixed=True, max_hits=3)
            assert found["version"].startswith("2.13.0") and len(found["matches"]) == 3
            assert found["truncated"] is True
            package_dir = found["site_packages"] + "/torch"
            for path in ("../os.py", "/etc/passwd", "fx/../../os.py"):
                refused = await agent.error("read_source", target=TORCH_TARGET, path=path)
                assert "only files inside the package" in refused or "is absolute" in refused
            link = package_dir + "/orch_mcp_link.py"
            await agent.ok("exec", target=TORCH_TARGET, argv=["ln", "-sf", "/etc/shadow", link])
            try:
                refused = await agent.error("read_source", target=TORCH_TARGET, path="orch_mcp_link.py")
                assert "leads outside the package" in refused
            finally:
                await agent.ok("exec", target=TORCH_TARGET, argv=["rm", "-f", link])
    asyncio.run(scenario())


# ----------------------------------------------------------------- the MCP Inspector
def inspector() -> list[str]:
    """The Inspector's CLI, installed once into a cache folder (CI downloads it once)."""
    binary = os.path.join(INSPECTOR_CACHE, "node_modules", ".bin", "mcp-inspector")
    os.makedirs(os.path.dirname(INSPECTOR_CACHE), exist_ok=True)
    with open(INSPECTOR_CACHE + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(binary):
            try:
                done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error",
                                       "--prefix", INSPECTOR_CACHE, INSPECTOR],
                                      capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as error:
                pytest.skip(f"cannot install the MCP Inspector ({INSPECTOR}) with npm: {error}")
            if done.returncode != 0 or not os.path.exists(binary):
                pytest.skip(f"cannot install the MCP Inspector ({INSPECTOR}) with npm: "
                            f"{done.stderr.strip()[-500:]}")
    return [binary, "--cli"]


@pytest.mark.torch
def test_the_mcp_inspector_lists_and_calls_tools(inventory, store, torch_venv_in_container):
    server = [sys.executable, "-m", "orchestrator", "-i", inventory, "mcp", "--allow", "exec"]
    env = {**os.environ, "ORCH_STORE": store}

    def run(*args):
        done = subprocess.run([*inspector(), *server, *args], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    listed = run("--method", "tools/list")
    names = {t["name"] for t in listed["tools"]}
    assert names == set(READ_TOOLS) | {"exec"}
    grep = next(t for t in listed["tools"] if t["name"] == "grep_source")
    assert set(grep["inputSchema"]["required"]) == {"target", "pattern"}

    called = run("--method", "tools/call", "--tool-name", "exec", "--tool-arg", "target=sb1-200",
                 "--tool-arg", 'argv=["python3", "-c", "print(2 + 3)"]')
    assert not called.get("isError") and called["structuredContent"]["stdout"] == "5\n"

    found = run("--method", "tools/call", "--tool-name", "grep_source",
                "--tool-arg", f"target={TORCH_TARGET}", "--tool-arg", "pattern=is_fx_symbolic_tracing",
                "--tool-arg", "definition=true")
    [match] = found["structuredContent"]["matches"]
    assert match["path"] == "torch/fx/_symbolic_trace.py" and match["kind"] == "function"
    assert [r["tool"] for r in audit(store)][:2] == ["grep_source", "exec"]


# -------------------------------------------------------------------- the agent replay
@pytest.mark.torch
def test_agent_replay_of_the_seed_story(inventory, store, torch_venv_in_container):
    playbook = os.path.join(REPO, "playbooks", "dflash-sandbox.yaml")

    async def wait_for_verdict(agent, run_id):
        deadline = time.monotonic() + 900
        while True:
            status = await agent.ok("run_status", run_id=run_id, wait_s=30)
            if status["verdict"] != "running" or time.monotonic() > deadline:
                return status

    async def scenario():
        started = time.monotonic()
        async with serve(inventory, store, "--allow", "write", "--allow", "exec",
                         "--allow-target", TORCH_TARGET, "--allow-playbook", "playbooks") as agent:
            # 1. Where is the flag read? The definition, then the file around it.
            found = await agent.ok("grep_source", target=TORCH_TARGET, pattern="is_fx_symbolic_tracing",
                                   definition=True, show=True)
            [definition] = found["matches"]
            assert definition["path"] == "torch/fx/_symbolic_trace.py"
            assert "return _is_fx_tracing_flag and not torch.compiler.is_compiling()" in definition["body"]
            source = await agent.ok("read_source", target=TORCH_TARGET, path="fx/_symbolic_trace.py",
                                    start_line=definition["line"], end_line=definition["line"] + 5)
            assert source["text"].startswith("def is_fx_symbolic_tracing")
            assert source["total_lines"] > source["end_line"]
            # 2. Is this torch affected?
            assert (await agent.ok("fx_tls_status", target=TORCH_TARGET))["status"] == "vulnerable"
            diff = await agent.ok("fx_tls_diff", target=TORCH_TARGET)
            assert "threading.local()" in diff["diff"]
            # 3. The DFlash run, unpatched: fx-race, with the remediation.
            started_run = await agent.ok("run_start", playbook=playbook, targets=[TORCH_TARGET],
                                         vars={"race": True, "patch": False})
            first = started_run["run_id"]
            status = await wait_for_verdict(agent, first)
            assert status["verdict"] == "fx-race", status
            race = next(f for f in status["findings"] if f["signature"] == "fx-race")
            assert f"patch fx-threads apply -t {TORCH_TARGET}" in race["remediation"]
            assert any(s["kind"] == "launch" and s["status"] in ("ok", "changed") for s in status["steps"])
            assert status["progress"]["targets"][TORCH_TARGET]["drafters"]
            # The log, paged by byte offsets, has the error.
            text, offset, pages = "", 0, 0
            while True:
                page = await agent.ok("run_log", run_id=first, offset=offset, max_bytes=4096)
                text, offset, pages = text + page["text"], page["next_offset"], pages + 1
                if page["eof"]:
                    break
            assert pages >= 2 and len(text.encode()) == page["size"]
            assert "Detected that you are using FX to symbolically trace" in text
            # 4. Apply, verify, run again.
            assert (await agent.ok("fx_tls_apply", target=TORCH_TARGET))["status"] == "patched"
            verified = await agent.ok("verify_fx_race", target=TORCH_TARGET, trials=3)
            assert verified["verdict"] == "fixed", verified
            second = (await agent.ok("run_start", playbook=playbook, targets=[TORCH_TARGET],
                                     vars={"race": True}))["run_id"]
            status = await wait_for_verdict(agent, second)
            assert status["verdict"] == "ok", status
            assert status["summary"]["drafters_ok"] == 3
            assert status["targets"][0]["fx_tls_state"] == "patched"
            runs = (await agent.ok("runs_list", last=2))["runs"]
            assert [(r["run_id"], r["verdict"]) for r in runs] == [(second, "ok"), (first, "fx-race")]
            compared = await agent.ok("runs_compare", base=first, new=second)
            assert (compared["base"], compared["new"]) == (first, second)
            assert compared["verdict"] == {"base": "fx-race", "new": "ok"}
            assert compared["throughput"]["total"]["new"] and not compared["regressed"]
            calls, wall = agent.calls, time.monotonic() - started
            # 5. A long run, stopped by the agent; then back to the pristine torch.
            third = (await agent.ok("run_start", playbook=playbook, targets=[TORCH_TARGET],
                                    vars={"steps": 100000, "hang_after": 600}))["run_id"]
            while True:
                page = await agent.ok("run_log", run_id=third)
                if page["launched"] and page["size"] > 0:
                    break
                await asyncio.sleep(1)
            stopped = await agent.ok("run_stop", run_id=third, grace_s=5)
            assert stopped["ok"] and stopped["targets"][0]["sent"]
            assert (await wait_for_verdict(agent, third))["verdict"] == "killed"
            assert (await agent.ok("fx_tls_revert", target=TORCH_TARGET))["status"] == "vulnerable"
            # The allowance names one target: another one is refused.
            assert "not allowed on sb1-200" in await agent.error("fx_tls_apply", target="sb1-200")
        print(f"\nagent replay: {calls} tool calls, {wall:.1f} s wall time to the ok run")
        return calls, wall

    calls, wall = asyncio.run(scenario())
    assert calls >= 12
    tools = [r["tool"] for r in audit(store, "--last", "500")]
    assert tools.count("run_start") == 3 and "fx_tls_apply" in tools and "run_stop" in tools


# ------------------------------------------------------------------ read_file
def test_read_file_reads_a_run_folder_and_nothing_outside_it(sandbox, inventory, store):
    """A file of a run folder in a real container, in two pages, its sha256 as read there;
    a link from the run folder to /etc/shadow and /etc/shadow itself are refused."""
    import hashlib
    import secrets
    from orchestrator.targets.fleet import Fleet
    folder = f"/var/lib/orch/runs/mcp-read-{secrets.token_hex(4)}"
    body = ("step 1 loss 2.5 ✓\n" * 5000).encode()
    with Fleet.from_path(inventory) as fleet:
        ct = fleet.targets(["sb1-200"])[0]
        ct.run(["mkdir", "-p", folder], timeout=30).check()
        ct.put(f"{folder}/output.log", body)
        ct.run(["ln", "-s", "/etc/shadow", f"{folder}/shadow"], timeout=30).check()
        try:
            async def scenario():
                async with serve(inventory, store) as agent:
                    first = await agent.ok("read_file", target="sb1-200",
                                           path=f"{folder}/output.log", max_bytes=50001)
                    rest = await agent.ok("read_file", target="sb1-200",
                                          path=f"{folder}/output.log",
                                          offset=first["next_offset"], max_bytes=1 << 20)
                    link = await agent.error("read_file", target="sb1-200", path=f"{folder}/shadow")
                    shadow = await agent.error("read_file", target="sb1-200", path="/etc/shadow")
                    return first, rest, link, shadow
            first, rest, link, shadow = asyncio.run(scenario())
        finally:
            ct.run(["rm", "-rf", folder], timeout=30)
    assert first["size"] == len(body) and not first["eof"] and rest["eof"]
    assert (first["data"] + rest["data"]).encode() == body
    assert first["sha256"] == hashlib.sha256(first["data"].encode()).hexdigest()
    assert "not inside the folders this client may read" in link and "root:" not in link
    assert "not inside the folders this client may read" in shadow
    outcomes = [row["outcome"] for row in audit(store, "--tool", "read_file")]
    assert outcomes == ["refused", "refused", "ok", "ok"]
