"""Tasks (UPIDs) the way PVE::RESTEnvironment::fork_worker runs them, for the emulated
`pvesh`, `pct` and the HTTPS API.

- The CLI runs a task in the foreground ("sync"): its output goes to stdout and to the
  task log, its error to stderr, and the command still exits 0 with the UPID as result.
- The API runs it in the background and answers the UPID at once.
- Either way the truth is the task log: its last line is `TASK OK` or `TASK ERROR: ...`,
  which /nodes/NODE/tasks/UPID/status reports as `exitstatus`.
"""

import os
import re
import subprocess
import sys
import time

import pvelib
from pvelib import PveError

# Real: /var/log/pve/tasks. Here the host's private runtime directory (a tmpfs that
# vanishes with the host): the machine's /var/log is shared by every sandbox host.
TASK_DIR = "/run/lxc/pve-tasks"
UPID_PATTERN = re.compile(r"UPID:(?P<node>[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):"
                          r"(?P<pid>[0-9A-F]{8}):(?P<pstart>[0-9A-F]{8,9}):"
                          r"(?P<starttime>[0-9A-F]{8}):(?P<type>[^:\s]+):(?P<id>[^:\s]*):"
                          r"(?P<user>[^:\s]+):$")


def new_upid(kind, vmid, pid):
    return (f"UPID:{pvelib.nodename()}:{pid:08X}:{_process_start(pid):08X}:"
            f"{int(time.time()):08X}:{kind}:{vmid}:root@pam:")


def _process_start(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return int(handle.read().rpartition(")")[2].split()[19])
    except OSError:
        return 0


def parse_upid(upid):
    found = UPID_PATTERN.fullmatch(upid)
    if not found:
        raise PveError(f"unable to parse worker upid '{upid}'")
    return found.groupdict()


def log_path(upid):
    return os.path.join(TASK_DIR, upid)


def run(kind, vmid, work, background=False):
    """Run work(log) as a task; returns the UPID. work writes lines with log(text) and
    raises PveError to fail the task."""
    os.makedirs(TASK_DIR, exist_ok=True)
    if background:
        return _run_in_background(kind, vmid, work)
    upid = new_upid(kind, vmid, os.getpid())
    error = _work(upid, work, echo=sys.stdout)
    if error is not None:
        sys.stdout.flush()
        sys.stderr.write(error + "\n")   # the task's error; pvesh still exits 0
        sys.stderr.flush()
    return upid


def _run_in_background(kind, vmid, work):
    """fork_worker without sync: the worker detaches, the caller gets the UPID at once."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        os.close(read_end)
        upid = new_upid(kind, vmid, os.getpid())
        open(log_path(upid), "a").close()
        os.write(write_end, upid.encode())
        os.close(write_end)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _work(upid, work, echo=None)
        os._exit(0)
    os.close(write_end)
    os.waitpid(first, 0)
    with os.fdopen(read_end, "rb") as pipe:
        upid = pipe.read().decode()
    if not upid:
        raise PveError("got no worker upid - start worker failed")
    return upid


def _work(upid, work, echo):
    """Run the task body, writing its log; returns its error text or None."""
    with open(log_path(upid), "a", encoding="utf-8") as log_file:
        def log(text):
            for line in text.rstrip("\n").split("\n"):
                log_file.write(line + "\n")
                log_file.flush()
                if echo is not None:
                    echo.write(line + "\n")
                    echo.flush()
        try:
            work(log)
        except PveError as error:
            message = " ".join(error.message.strip().split("\n"))
            log_file.write(f"TASK ERROR: {message}\n")
            return message
        log_file.write("TASK OK\n")
    return None


def status(upid):
    """/nodes/NODE/tasks/UPID/status: running, or stopped with its exitstatus."""
    info = parse_upid(upid)
    lines = read_log(upid)
    result = {"upid": upid, "node": info["node"], "pid": int(info["pid"], 16),
              "pstart": int(info["pstart"], 16), "starttime": int(info["starttime"], 16),
              "type": info["type"], "id": info["id"], "user": info["user"],
              "status": "running"}
    last = lines[-1] if lines else ""
    if last == "TASK OK":
        result.update(status="stopped", exitstatus="OK")
    elif last.startswith("TASK ERROR: "):
        result.update(status="stopped", exitstatus=last[len("TASK ERROR: "):])
    elif not _alive(result["pid"]):
        result.update(status="stopped", exitstatus="unexpected status")
    return result


def read_log(upid):
    parse_upid(upid)
    try:
        with open(log_path(upid), encoding="utf-8", errors="replace") as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        raise PveError(f"no such task '{upid}'") from None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the tasks: starting a container, with its hookscript -------------------------------------

def start_container(vmid, log):
    """vm_start: the pre-start hookscript (if any), then lxc-start."""
    config = pvelib.load_config(vmid)
    hookscript = config.get("hookscript")
    if hookscript:
        run_hookscript(vmid, hookscript, "pre-start", log)
    pvelib.lxc_command(["lxc-start", "-n", vmid],
                       f"command 'lxc-start -n {vmid}' failed: exit code 1")


def run_hookscript(vmid, volume, phase, log):
    """PVE::GuestHelpers::exec_hookscript: STORAGE:snippets/NAME, run with VMID PHASE."""
    path = snippet_path(volume)
    if not os.access(path, os.X_OK):
        raise PveError(f"hookscript error for {vmid} on {phase}: script '{path}' "
                       "is not executable")
    process = subprocess.run([path, vmid, phase], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, check=False)
    if process.stdout:
        log(process.stdout.decode("utf-8", "replace"))
    if process.returncode != 0:
        raise PveError(f"hookscript error for {vmid} on {phase}: command '{path} {vmid} "
                       f"{phase}' failed: exit code {process.returncode}")


def snippet_path(volume):
    storage, _, name = volume.partition(":")
    if not name.startswith("snippets/") or "/../" in f"/{name}/":
        raise PveError(f"unable to parse volume ID '{volume}'")
    return os.path.join(storage_path(storage), name)


def storage_path(storage):
    """The path of a `dir:` storage in /etc/pve/storage.cfg."""
    current = None
    try:
        with open(os.path.join(pvelib.PVE_DIR, "storage.cfg"), encoding="utf-8") as handle:
            for line in handle:
                if line and not line[0].isspace():
                    kind, _, name = line.partition(":")
                    current = name.strip() if kind.strip() == "dir" else None
                elif current == storage and line.split()[:1] == ["path"]:
                    return line.split(None, 1)[1].strip()
    except FileNotFoundError:
        pass
    if storage == "local":
        return "/var/lib/vz"
    raise PveError(f"storage '{storage}' does not exist")
