"""Tool-call latency through MCP against the other ways to ask the same thing, side by side
in one run: `exec(["true"])` and a `grep_source` definition lookup of
`is_fx_symbolic_tracing` in the installed torch.

Ways, per question:
  manual        a new `ssh HOST "pct exec VMID -- ..."` process per call (what a user types)
  orch CLI      `orch -i INV exec ...` / `orch -i INV grep-torch --def ...` from a shell: a
                new orch process per call (Python start-up + SSH handshake every time)
  orch API      in-process: the warm ExecSession (exec) or payload_api.search (grep)
  MCP           the `mcp` SDK's stdio client calling `orch mcp`'s tool (one server, warm)

It brings up the sandbox (`orch sandbox up`, idempotent) and gives sb1-201 a real torch
2.13 venv (hard-linked from the test venv), then removes that venv.

    sudo .venv/bin/python benchmarks/mcp_latency.py [-n 100] [--slow-count 20] [--json]

The process-per-call ways (manual, orch CLI) take --slow-count calls (each costs a process
and an SSH handshake: 0.3-2 s); the warm ways take -n calls. Medians and p95 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from benchmarks.timing import asamples_ms, print_table, samples_ms, summary  # noqa: E402
import orch_sandbox as sandboxes  # noqa: E402
from orchestrator.remote import payload_api  # noqa: E402
from orchestrator.targets.fleet import Fleet  # noqa: E402
from orchestrator.remote.session import ExecSession  # noqa: E402
from tests.integration.torch_seed import remove_venv, seed_torch_venv  # noqa: E402

HOST, VMID, TARGET, VENV = "sb1", 201, "sb1-201", "mcp-bench-venv"
NAME = "is_fx_symbolic_tracing"
ORCH = [sys.executable, "-m", "orchestrator"]


def timed(call, count: int) -> dict:
    return summary(samples_ms(call, count))


async def atimed(call, count: int) -> dict:
    return summary(await asamples_ms(call, count))


def process(argv: list[str]):
    def call():
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise SystemExit(f"{shlex.join(argv)} failed: {done.stderr.decode()[-400:]}")
    return call


def manual(ssh_config: str, argv: list[str]):
    return process(["ssh", "-F", ssh_config, HOST, shlex.join(["pct", "exec", str(VMID), "--", *argv])])


async def through_mcp(inventory: str, store: str, count: int) -> dict:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "orchestrator", "-i", inventory, "mcp", "--allow", "exec"],
                                   env={**os.environ, "ORCH_STORE": store})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()

            async def call(tool, arguments):
                result = await session.call_tool(tool, arguments)
                if result.is_error:
                    raise SystemExit(f"{tool}: {result.content[0].text}")
                return result.structured_content

            exec_row = await atimed(lambda: call("exec", {"target": TARGET, "argv": ["true"]}), count)
            grep_row = await atimed(lambda: call("grep_source", {
                "target": TARGET, "pattern": NAME, "definition": True}), count)
            return {"exec": exec_row, "grep": grep_row}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=100)
    parser.add_argument("--slow-count", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    bed = sandboxes.up()
    venv = seed_torch_venv(bed, HOST, VMID, VENV)
    work = tempfile.mkdtemp(prefix="orch-mcp-bench-")
    data = yaml.safe_load(bed.inventory_path.read_text())
    data["containers"][TARGET]["venv"] = venv
    inventory = os.path.join(work, "inventory.yaml")
    with open(inventory, "w") as handle:
        yaml.safe_dump(data, handle)
    ssh_config = str(bed.ssh_config)
    site = f"{venv}/lib/python3.11/site-packages"
    rows: list[dict] = []
    try:
        with Fleet.from_path(inventory) as fleet:
            target = fleet.targets([TARGET])[0]
            session = ExecSession(target)
            api_exec = timed(lambda: session.run(["true"], check=True), args.count)
            api_grep = timed(lambda: payload_api.search(target, NAME, mode="def"), args.count)
            session.close()
        mcp = asyncio.run(through_mcp(inventory, os.path.join(work, "runs.sqlite"), args.count))
        cli_exec = timed(process([*ORCH, "-i", inventory, "exec", TARGET, "--", "true"]), args.slow_count)
        cli_grep = timed(process([*ORCH, "-i", inventory, "grep-torch", "--def", NAME, "-t", TARGET]),
                         args.slow_count)
        manual_exec = timed(manual(ssh_config, ["true"]), args.slow_count)
        manual_grep = timed(manual(ssh_config, ["grep", "-rn", "--include=*.py", f"def {NAME}",
                                                f"{site}/torch"]), args.slow_count)
        for question, ways in (("exec([\"true\"])", [
                ("manual: new ssh + pct exec per call", manual_exec),
                ("orch CLI: `orch exec` from a shell", cli_exec),
                ("orch API: warm session in the container", api_exec),
                ("MCP: `exec` tool call (SDK client, stdio)", mcp["exec"])]),
                (f"grep_source def {NAME}", [
                ("manual: ssh + pct exec grep -rn", manual_grep),
                ("orch CLI: `orch grep-torch --def` from a shell", cli_grep),
                ("orch API: payload_api.search (a channel per call)", api_grep),
                ("MCP: `grep_source` tool call (warm session)", mcp["grep"])])):
            base = ways[0][1]["median_ms"]
            for way, row in ways:
                rows.append({"question": question, "way": way, **row,
                             "x_faster_than_manual": base / row["median_ms"]})
    finally:
        remove_venv(bed, HOST, VMID, VENV)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print_table(["call", "way", "n", "median ms", "p95 ms", "x faster than manual"],
                [[f"`{row['question']}`", row["way"], row["n"], f"{row['median_ms']:.1f}",
                  f"{row['p95_ms']:.1f}", f"{row['x_faster_than_manual']:.1f}"] for row in rows], left=2)
    print(f"\ntarget {TARGET} (torch 2.13 CPU), {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
