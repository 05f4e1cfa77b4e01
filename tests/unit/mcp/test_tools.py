"""`orch mcp` without the sandbox: the policy, the audit trail's masking, the source_read
payload's refusals (run as the controller ships it), the tools over a local target, and
that `orch --help` never imports the MCP SDK."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from orchestrator.ground.errors import ConfigError
from orchestrator.targets.fleet import Fleet
from orchestrator.mcp.audit import AuditLog, audit_rows, mask
from orchestrator.mcp.policy import READ_TOOLS, PolicyRefused, build_policy
from orchestrator.runs.store import RunStore
from tests.fixtures.payloads import FAKE_TORCH, env_with_path, run_payload

INVENTORY = """\
hosts:
  here: {transport: local}
  pve: {address: 192.0.2.1}
containers:
  dev: {host: here}
  dev2: {host: here}
  c1: {host: pve, vmid: 200}
  c2: {host: pve, vmid: 201}
groups:
  both: [dev, dev2]
  cs: [c1, c2]
default_target: dev
"""


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return str(path)


# ------------------------------------------------------------------------- policy
def test_read_only_by_default_and_allowances_add_tools(inventory):
    fleet = Fleet.from_path(inventory)
    assert build_policy().tools() == list(READ_TOOLS)
    assert "exec" not in build_policy().tools()
    assert set(build_policy(["exec"]).tools()) - set(READ_TOOLS) == {"exec"}
    assert set(build_policy(["write"]).tools()) - set(READ_TOOLS) == {
        "fx_tls_apply", "fx_tls_revert", "run_start", "run_stop"}
    with pytest.raises(ConfigError, match="unknown allowance 'root'"):
        build_policy(["root"], inventory=fleet.inventory)


def test_an_allowance_naming_targets_refuses_the_others(inventory):
    fleet = Fleet.from_path(inventory)
    specs = fleet.inventory.resolve
    policy = build_policy(["exec"], ["c1"], inventory=fleet.inventory)
    policy.check("exec", specs(["c1"]))
    policy.check("grep_source", specs(["c2"]))          # reading is not limited
    with pytest.raises(PolicyRefused, match="exec is not allowed on c2"):
        policy.check("exec", specs(["c2"]))
    grouped = build_policy(["write"], ["cs"], inventory=fleet.inventory)
    grouped.check("run_start", specs(["c1", "c2"]))    # a group names its containers


def test_policy_file_merges_and_errors_name_the_line(inventory, tmp_path):
    fleet = Fleet.from_path(inventory)
    good = tmp_path / "policy.yaml"
    good.write_text("allow: [write]\ntargets: [c2]\nhosts: [pve]\n")
    policy = build_policy(["exec"], [], str(good), fleet.inventory)
    assert policy.allow == {"exec", "write"} and policy.targets == {"c2"} and policy.hosts == {"pve"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("allow: [exec]\ntarget: [dev]\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2:1: unknown key 'target'"):
        build_policy(policy_file=str(bad), inventory=fleet.inventory)
    worse = tmp_path / "worse.yaml"
    worse.write_text("allow: exec\n")
    with pytest.raises(ConfigError, match=r"worse.yaml:1:8: allow: must be a list"):
        build_policy(policy_file=str(worse), inventory=fleet.inventory)


# -------------------------------------------------------------------------- audit
def test_secrets_are_masked_in_recorded_arguments():
    masked = mask({"target": "dev", "argv": ["env", "API_TOKEN=s3cret", "--password", "hunter2",
                                             "x=1"], "stdin": "top secret", "vars": {"hf_token": "t"}})
    assert masked["argv"] == ["env", "API_TOKEN=***", "--password", "***", "x=1"]
    assert masked["stdin"] == "<10 bytes>"
    assert masked["vars"] == {"hf_token": "***"}
    assert "s3cret" not in json.dumps(masked) and "hunter2" not in json.dumps(masked)


def test_audit_rows_are_kept_in_the_run_store(tmp_path):
    with RunStore(str(tmp_path / "runs.sqlite")) as store:
        log = AuditLog(store, "s1")
        log.record("exec", {"target": "dev", "argv": ["true"]}, "dev", "ok", "", 0.0123)
        log.record("read_source", {"target": "dev", "path": "../x"}, "dev", "error", "refused", 0.5)
        AuditLog(store, "s2").record("list_targets", {}, "", "ok")
    with RunStore(str(tmp_path / "runs.sqlite")) as store:   # a later process reads them
        rows = audit_rows(store, last=10)
        assert [r["tool"] for r in rows] == ["list_targets", "read_source", "exec"]
        assert rows[2]["arguments"] == {"target": "dev", "argv": ["true"]}
        assert rows[2]["duration_ms"] == 12.3 and rows[1]["error"] == "refused"
        assert [r["tool"] for r in audit_rows(store, session="s1")] == ["read_source", "exec"]
        assert [r["tool"] for r in audit_rows(store, tool="exec")] == ["exec"]


def test_runs_audit_cli_shows_the_trail(tmp_path):
    store_path = tmp_path / "runs.sqlite"
    with RunStore(str(store_path)) as store:
        AuditLog(store, "s1").record("exec", {"target": "dev", "argv": ["A_KEY=v"]}, "dev", "ok")
    env = {**os.environ, "ORCH_STORE": str(store_path)}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "audit", "--json"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["tool"] == "exec" and row["arguments"]["argv"] == ["A_KEY=***"]


# ---------------------------------------------------------- the source_read payload
def read(site, **args):
    return run_payload(sys.executable, "source_read", {"package": "torch", **args},
                       env=env_with_path(site), via_stdin=True)


def test_read_source_returns_the_lines_asked_for():
    result = read(FAKE_TORCH, path="fx/_symbolic_trace.py", start_line=2, end_line=3).expect_result()
    lines = (FAKE_TORCH / "torch/fx/_symbolic_trace.py").read_text().splitlines()
    assert result["text"] == "\n".join(lines[1:3]) + "\n"
    assert (result["start_line"], result["end_line"], result["total_lines"]) == (2, 3, len(lines))
    capped = read(FAKE_TORCH, path="fx/_symbolic_trace.py", max_bytes=10).expect_result()
    assert capped["truncated"] is True and capped["bytes"] <= 10


@pytest.mark.parametrize("path, why", [
    ("../os.py", "'..' part"), ("fx/../../x.py", "'..' part"), ("/etc/passwd", "is absolute"),
    ("~/x.py", "is absolute")])
def test_read_source_refuses_paths_out_of_the_package(path, why):
    error = read(FAKE_TORCH, path=path).expect_error("outside-package")
    assert why in error["message"]


def test_read_source_refuses_a_symlink_out_of_the_package(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(FAKE_TORCH / "torch", site / "torch")
    (tmp_path / "secret.py").write_text("KEY = 1\n")
    os.symlink(tmp_path / "secret.py", site / "torch" / "link.py")
    os.symlink(tmp_path, site / "torch" / "linkdir")
    assert "leads outside the package" in read(site, path="link.py").expect_error("outside-package")["message"]
    assert "leads outside" in read(site, path="linkdir/secret.py").expect_error("outside-package")["message"]
    os.symlink("fx/_symbolic_trace.py", site / "torch" / "inside.py")  # a link within is fine
    assert read(site, path="inside.py").expect_result()["total_lines"] > 0


# ------------------------------------------------------------ tools on a local target
def test_exec_output_is_capped_and_says_so(inventory, tmp_path):
    from orchestrator.mcp.tools import Tools
    with RunStore(str(tmp_path / "runs.sqlite")) as store:
        tools = Tools(Fleet.from_path(inventory), store)
        try:
            result = tools.exec("dev", ["head", "-c", "5000", "/dev/zero"], 30, None, 1000)
            assert (result["stdout_bytes"], result["stdout_truncated"], len(result["stdout"])) == \
                (5000, True, 1000)
            echoed = tools.exec("dev", ["cat"], 30, "a b $(reboot)", 1000)
            assert echoed["stdout"] == "a b $(reboot)" and not echoed["stdout_truncated"]
            assert echoed["via"] == "channel"  # a host, not a container: no warm session
            assert tools.exec("dev", ["sh", "-c", "exit 3"], 30, None, 10)["exit_code"] == 3
            with pytest.raises(ConfigError, match="names 2 containers"):
                tools.exec("both", ["true"], 30, None, 10)
            with pytest.raises(TypeError, match="not a string"):
                tools.exec("dev", "true", 30, None, 10)
        finally:
            tools.close()


def test_orch_help_does_not_import_the_sdk():
    code = "import sys; from orchestrator.cli.app import main; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_orch_mcp_without_the_sdk_says_how_to_install_it(inventory, tmp_path):
    shim = tmp_path / "shim" / "mcp"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'mcp'\", name='mcp')\n")
    env = {**os.environ, "PYTHONPATH": str(shim.parent), "ORCH_STORE": str(tmp_path / "runs.sqlite")}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, "mcp"],
                         capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "needs the MCP SDK" in out.stderr and "orch[mcp]" in out.stderr


def test_a_bad_policy_file_is_a_usage_error(inventory, tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("allow: [exec, sudo]\n")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, "mcp", "--policy",
                          str(bad)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         env={**os.environ, "ORCH_STORE": str(tmp_path / "runs.sqlite")})
    assert out.returncode == 2 and "policy.yaml:1:15: unknown allowance 'sudo'" in out.stderr


# ------------------------------------------------------------ the stdio wire, no threads
def test_fd_lines_and_writer_carry_lines_whole_across_reads_and_a_full_pipe():
    import anyio
    from orchestrator.mcp.wire import FdLines, FdWriter

    big = "x" * 300_000  # more than a pipe holds: the writer must wait for the reader

    async def scenario():
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        got = []

        async def reader():
            async for line in FdLines(read_fd):
                got.append(line)

        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            writer = FdWriter(write_fd)
            await writer.write('{"a": 1}\n{"b"')
            await anyio.sleep(0.01)
            await writer.write(': 2}\n' + big + "\nlast, no newline")
            await writer.flush()
            os.close(write_fd)
        os.close(read_fd)
        return got

    got = anyio.run(scenario)
    assert got == ['{"a": 1}\n', '{"b": 2}\n', big + "\n", "last, no newline"]


def test_a_log_page_never_splits_a_utf8_character():
    from orchestrator.mcp.tools import whole_utf8
    text = "step 1 → loss 0.5 ✓\n".encode()
    pages, offset = [], 0
    while offset < len(text):
        page = whole_utf8(text[offset:offset + 5], at_end=offset + 5 >= len(text))
        pages.append(page.decode("utf-8"))  # strict: a split character would raise here
        offset += len(page)
    assert "".join(pages) == text.decode()
    assert whole_utf8(b"ok \xff\xfe", at_end=False) == b"ok \xff\xfe"  # not UTF-8: unchanged
