"""Memory of `orch mcp` answering an exec whose output is large: the server's resident set
before the call and its peak (VmHWM) after, for a 1 KiB answer.

    python benchmarks/mcp_exec_memory.py                      # against the sandbox, 200 MB
    python benchmarks/mcp_exec_memory.py --size 50 --json

The server is started the way an MCP host starts it (stdio, the SDK's own client); its
process is found as this process's child and its /proc status read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def server_pid() -> int:
    """The `orch ... mcp` child of this process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                words = cmdline.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"mcp" in words:
            return int(entry)
    raise SystemExit("the MCP server process was not found")


def memory_mb(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024
    return fields


async def measure(inventory: str, target: str, size_mb: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as scratch:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "orchestrator", "-i", inventory, "mcp", "--allow", "exec"],
            env={**os.environ, "ORCH_STORE": os.path.join(scratch, "runs.sqlite")})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("exec", {"target": target, "argv": ["true"]})  # warm
                pid = server_pid()
                before = memory_mb(pid)
                result = await session.call_tool("exec", {
                    "target": target, "argv": ["head", "-c", str(size_mb << 20), "/dev/zero"],
                    "max_output_bytes": 1024, "timeout_s": 600})
                after = memory_mb(pid)
        data = result.structured_content or {}
        return {"size_mb": size_mb, "target": target, "stdout_bytes": data.get("stdout_bytes"),
                "answer_bytes": len(result.content[0].text), "rss_before_mb": round(before["VmRSS"], 1),
                "peak_after_mb": round(after["VmHWM"], 1), "via": data.get("via")}


def main() -> None:
    sandbox_dir = os.environ.get("ORCH_SANDBOX_DIR", "/var/lib/orch-sandbox")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", default=os.path.join(sandbox_dir, "inventory.yaml"))
    parser.add_argument("--target", default="sb1-200")
    parser.add_argument("--size", type=int, default=200, metavar="MB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    row = asyncio.run(measure(args.inventory, args.target, args.size))
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        print(f"{row['size_mb']} MB through exec on {row['target']} ({row['via']}): server RSS "
              f"{row['rss_before_mb']} MB before, peak {row['peak_after_mb']} MB after; "
              f"answer {row['answer_bytes']} bytes")


if __name__ == "__main__":
    main()
