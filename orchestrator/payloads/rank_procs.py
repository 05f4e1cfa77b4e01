"""Payload: the torchrun rank workers below a process (stdlib only, Linux /proc).

Run as `PYTHON - '{"pid": 4242}'`; prints one JSON result line:
{"event": "result", "pid": 4242, "alive": true,
 "ranks": [{"pid", "ppid", "rank", "local_rank", "world_size", "cmdline"}]} (by rank).

torchrun's elastic agent runs in the torchrun process itself and starts one worker process
per local rank, each with RANK, LOCAL_RANK, WORLD_SIZE and TORCHELASTIC_RUN_ID in its
environment. The workers are found among the descendants of `pid` (parents from
/proc/PID/stat) by those variables; a descendant whose parent already has the same RANK
(a DataLoader worker, a compile worker, which inherit the environment) is not a rank of
its own. Reading another process's environ needs its owner or root (orch's payloads run as
root in a container). Bounded: at most MAX_PROCS processes are looked at, MAX_ENVIRON bytes
of each environment and 400 characters of each command line.
"""

import os
import sys

from _protocol import *  # orch: inlined when shipped

ARG_SPEC = {"pid": (int, REQUIRED)}
MAX_PROCS = 65536
MAX_ENVIRON = 1 << 20
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def parent_of(pid):
    """The ppid from /proc/PID/stat; the command name may hold spaces and parentheses, so
    the fields are read after its last ')'."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def descendants(root):
    children = {}
    for count, name in enumerate(os.listdir("/proc")):
        if count >= MAX_PROCS:
            break
        if name.isdigit():
            parent = parent_of(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    found, todo = [], list(children.get(root, []))
    while todo and len(found) < MAX_PROCS:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            data = handle.read(MAX_ENVIRON)
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode("ascii", "replace") in RANK_VARS:
            out[key.decode()] = value.decode("utf-8", "replace")[:200]
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            data = handle.read(4096)
    except OSError:
        return ""
    return data.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:400]


def number(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def run(args):
    root = args["pid"]
    if not os.path.isdir("/proc/%d" % root):
        return {"pid": root, "alive": False, "ranks": []}
    ranks = []
    envs = {}
    for pid in descendants(root):
        env = envs[pid] = environ(pid)
        if "TORCHELASTIC_RUN_ID" not in env or number(env.get("RANK")) is None:
            continue
        ppid = parent_of(pid)
        parent_env = envs.get(ppid) if ppid in envs else environ(ppid) if ppid else {}
        if parent_env.get("RANK") == env["RANK"]:
            continue        # a worker's own child (DataLoader, compile worker): the same rank
        ranks.append({"pid": pid, "ppid": ppid, "rank": number(env["RANK"]),
                      "local_rank": number(env.get("LOCAL_RANK")),
                      "world_size": number(env.get("WORLD_SIZE")), "cmdline": cmdline(pid)})
    ranks.sort(key=lambda r: (r["rank"], r["pid"]))
    return {"pid": root, "alive": True, "ranks": ranks}


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
