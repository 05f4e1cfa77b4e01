"""Payload: start a command detached inside the container, watch it, stop it (stdlib only).

Run as `PYTHON -` with ARGS_JSON ({"action": ..., "run_dir": ..., ...}) set into sys.argv[1] by
the script's first line (orch ships the arguments with the script on stdin: a start's env holds
secrets, and the supervisor keeps this process's argv for the whole run; see
orchestrator.payloads.with_args). `PYTHON - ARGS_JSON` works too (tests, by hand).

  start   fork a supervisor (new session, stdin/stdout/stderr on /dev/null) that forks the
          command (its own session and process group, stdin /dev/null, stdout+stderr
          appended to RUN_DIR/output.log), writes RUN_DIR/pid.json, waits for it and writes
          RUN_DIR/exit.json. Neither holds the pipes of this payload, so the SSH channel and
          `pct exec` end at once, and the run survives an SSH drop or the controller's exit.
  status  {"state": "running" | "exited" | "vanished" | "missing", pid, exit_code, signal, ...}
  stop    SIGTERM to the process group, SIGKILL after `grace` seconds; RUN_DIR/stop.json
          records that orch asked (so the monitor can tell "stopped" from "killed"). The
          run's processes that lead groups of their own (torchrun starts each worker in a
          session of its own) are found by their parents in /proc before the first signal
          and again before SIGKILL; any still alive once the run ended is SIGKILLed
          (`strays_killed`), so no worker is left holding GPUs.
  tail    follow RUN_DIR/output.log from byte `offset`: JSON "data" events carry whole
          lines and the byte offset they start at, "beat" events every second carry the
          process state and this payload's own CPU time; the last event is "result" once
          the command ended and its log was read to the end (or after `max_seconds`, with
          state "running": the controller then starts a new tail from its offset).
          `follow` adds glob patterns under RUN_DIR (torchrun's per-rank logs): each file
          found is followed the same way from its offset in `offsets`, its data events
          naming it (`file`, relative to RUN_DIR).

Why polling with a short sleep, not inotify: inotify needs ctypes tricks in the stdlib and
does not see writes through every filesystem a container may use; a stat() every 50-200 ms
costs far under 1 % of a core and keeps the latency well under the 250 ms goal.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

from _protocol import *  # orch: inlined when shipped
from _gpus import *  # orch: inlined when shipped
from _statedir import *  # orch: inlined when shipped

LOG = "output.log"
PID = "pid.json"
EXIT = "exit.json"
STOP = "stop.json"
CMD = "cmd.json"
MARKER = "ORCH_RUN_MARKER"    # in the command's environment: names the run's own process
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

READ_CHUNK = 1 << 20          # the most bytes one data event carries
BEAT_EVERY = 1.0              # seconds between heartbeats (the controller's dead-link detector)
VANISHED_GRACE = 2.0          # a dead pid without exit.json for this long: the supervisor died


def write_json(path, data):
    """Atomic: a reader sees the old file or the whole new one, never half. The temporary
    file has a name nobody can guess and is created exclusively (see _statedir)."""
    fd, part = open_new(os.path.dirname(path), os.path.basename(path))
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(part, path)


def read_json(path):
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | NOFOLLOW)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def checked_run_dir(run_dir, create):
    """The run folder after _statedir's checks (made 0700 by start). A run folder another
    account could change is refused: its pid.json could name any process for `stop` to
    signal, its files could be links to root's."""
    try:
        return payload_folder(run_dir, create)
    except UnsafePath as error:
        fail("unsafe run folder: %s" % error, kind="unsafe-path")


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (the state first: field 3 of
    proc(5) is [0]), or None when the process is gone. The name is cut at its last ")":
    it may hold spaces and parentheses."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _stat_number(pid, index):
    try:
        return int(stat_fields(pid)[index])
    except (TypeError, IndexError, ValueError):
        return None


def start_ticks(pid):
    """The process start time in clock ticks (field 22 of /proc/PID/stat): with the pid it
    names one process for good, so a recycled pid is never taken for the run."""
    return _stat_number(pid, 19)


def alive(info):
    pid = info.get("pid")
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    ticks = start_ticks(pid)
    if ticks is None or ticks != info.get("start_ticks"):
        return False   # another process now has the pid (or pid.json names no start time)
    if info.get("marker") and not has_marker(pid, info["marker"]):
        return False
    # A zombie (exited, not yet reaped by the supervisor) is not running any more.
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def has_marker(pid, marker):
    """Whether process pid was started with this run's marker in its environment: a pid
    and start time alone can be copied from /proc into a forged pid.json."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            environ = handle.read()
    except OSError:
        return False
    return ("%s=%s" % (MARKER, marker)).encode() in environ.split(b"\0")


# ------------------------------------------------------------------------- start
def read_to_end(fd):
    """Everything written to a pipe until its last writer closes it; closes fd."""
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def start(args):
    run_dir = args["run_dir"]
    argv = args["argv"]
    if not argv or not all(isinstance(a, str) for a in argv):
        fail("the command must be a non-empty list of strings")
    existing = read_json(os.path.join(run_dir, PID))
    if existing and alive(existing) and not os.path.exists(os.path.join(run_dir, EXIT)):
        fail("a run is already going in %s (pid %s); stop it first" % (run_dir, existing["pid"]))
    for name in (PID, EXIT, STOP):
        try:
            os.unlink(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass

    env = dict(os.environ)
    venv = args.get("venv")
    if venv:
        # What `source VENV/bin/activate` does, without a shell.
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env.pop("PYTHONHOME", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in (args.get("env") or {}).items():
        env[str(key)] = str(value)
    marker = os.urandom(16).hex()
    env[MARKER] = marker
    cwd = args.get("cwd") or run_dir
    log_path = os.path.join(run_dir, LOG)
    write_json(os.path.join(run_dir, CMD), {
        "argv": argv, "cwd": cwd, "env_keys": sorted((args.get("env") or {}).keys()),
        "venv": venv, "started_at": time.time(), "log": log_path})

    report_r, report_w = os.pipe()
    supervisor = os.fork()
    if supervisor == 0:
        os.close(report_r)
        try:
            supervise(argv, env, cwd, run_dir, log_path, report_w, marker)
        finally:
            os._exit(0)
    os.close(report_w)
    report = read_to_end(report_r)
    os.waitpid(supervisor, 0)  # the supervisor forks once more and its parent half exits
    try:
        info = json.loads(report.decode() or "{}")
    except ValueError:
        info = {}
    if info.get("error"):
        fail(info["error"])
    if not info.get("pid"):
        fail("the supervisor did not report the command's pid (see %s)" % log_path)
    emit("result", run_dir=run_dir, log=log_path, **info)


def supervise(argv, env, cwd, run_dir, log_path, report_w, marker):
    """Runs in a forked child: detach, fork the command, report its pid, wait, record."""
    os.setsid()
    # Fork once more so the process that waits is not the payload's direct child: the
    # payload can reap its child at once and exit, and nothing of it lingers.
    if os.fork() != 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # Keep none of the payload's other descriptors: an inherited pipe of the SSH channel
    # would keep `pct exec` (and the channel) open for as long as the run lasts.
    keep = sorted((report_w, devnull))
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 65536)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
    # exec failures travel back on a close-on-exec pipe: EOF means the exec worked.
    exec_r, exec_w = os.pipe()
    os.set_inheritable(exec_w, False)
    child = os.fork()
    if child == 0:
        try:
            os.close(exec_r)
            os.close(report_w)
            os.setsid()  # its own session and process group: `stop` signals the group
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.closerange(3, exec_w)
            os.closerange(exec_w + 1, 65536)
            os.chdir(cwd)
            for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(number, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as error:  # noqa: BLE001 - report any reason and leave
            try:
                os.write(exec_w, ("cannot run %s: %s" % (argv[0], error)).encode())
            finally:
                os._exit(127)
    os.close(exec_w)
    failure = read_to_end(exec_r)
    ticks = start_ticks(child)
    info = {"pid": child, "pgid": child, "start_ticks": ticks, "supervisor": os.getpid(),
            "started_at": time.time(), "marker": marker}
    if failure:
        os.waitpid(child, 0)
        os.write(log_fd, (failure.decode("utf-8", "replace") + "\n").encode())
        write_json(os.path.join(run_dir, EXIT), {"exit_code": 127, "signal": None,
                                                 "ended_at": time.time(), "exec_error": True})
        os.write(report_w, json.dumps({"error": failure.decode("utf-8", "replace")}).encode())
        os.close(report_w)
        return
    write_json(os.path.join(run_dir, PID), info)
    os.write(report_w, json.dumps(info).encode())
    os.close(report_w)

    # The supervisor outlives signals aimed at it: it passes them on to the command and
    # keeps waiting, so exit.json is always written.
    def forward(number, _frame):
        try:
            os.killpg(child, number)
        except OSError:
            pass
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status = None
            break
    code, sig = None, None
    if status is not None:
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            code = 128 + sig
    write_json(os.path.join(run_dir, EXIT), {"exit_code": code, "signal": sig,
                                             "ended_at": time.time()})


# ------------------------------------------------------------------------ status
def describe(run_dir):
    info = read_json(os.path.join(run_dir, PID))
    ended = read_json(os.path.join(run_dir, EXIT))
    stop = read_json(os.path.join(run_dir, STOP))
    log_path = os.path.join(run_dir, LOG)
    try:
        size = os.stat(log_path).st_size
    except OSError:
        size = 0
    if info is None and ended is None:
        state = "missing" if not os.path.isdir(run_dir) else "starting"
        return {"state": state, "run_dir": run_dir, "log_size": size}
    info = info or {}
    running = alive(info)
    if ended is not None and not running:
        state = "exited"
    elif running:
        state = "running"
    else:
        state = "vanished"  # no exit.json and no process: the supervisor was killed too
    result = {"state": state, "run_dir": run_dir, "log_size": size, "pid": info.get("pid"),
              "started_at": info.get("started_at"), "stop_requested": stop is not None}
    if ended:
        result.update(exit_code=ended.get("exit_code"), signal=ended.get("signal"),
                      ended_at=ended.get("ended_at"))
    return result


def status(args):
    emit("result", **describe(args["run_dir"]))


# -------------------------------------------------------------------------- stop
def stop(args):
    run_dir = args["run_dir"]
    grace = float(args.get("grace", 10.0))
    current = describe(run_dir)
    if current["state"] != "running":
        emit("result", already=True, sent=None, **current)
        return
    pgid = current["pid"]
    try:
        leader = os.getpgid(pgid) == pgid
    except OSError:
        leader = False
    if not leader:   # the command leads its own group (setsid): anything else is not the run
        fail("pid %d is not the leader of the run's process group: not signalling it" % pgid,
             kind="not-the-run")
    write_json(os.path.join(run_dir, STOP), {"requested_at": time.time(),
                                             "reason": args.get("reason", "orch stop")})
    sent = "SIGTERM"
    strays = descendants(pgid)        # before any signal: the parent links are still there
    _signal_group(pgid, signal.SIGTERM)
    if not _wait_ended(run_dir, grace):
        sent = "SIGKILL"
        strays.update(descendants(pgid))
        _signal_group(pgid, signal.SIGKILL)
        _wait_ended(run_dir, 10.0)
    emit("result", already=False, sent=sent, strays_killed=kill_strays(strays, pgid),
         **describe(run_dir))


def descendants(root):
    """{pid: start ticks} of every process under root, by the parent links in /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = parent_of(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    found, todo = {}, [root]
    while todo and len(found) < 100000:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found[child] = start_ticks(child)
                todo.append(child)
    return found


def parent_of(pid):
    return _stat_number(pid, 1)   # field 4 of proc(5): the parent's pid


def kill_strays(strays, pgid):
    """SIGKILL each process of the run outside its process group that is still the same
    process (pid and start time) and alive: the run has ended, it has nothing to wait for."""
    killed = 0
    for pid, ticks in strays.items():
        if ticks is None or start_ticks(pid) != ticks:
            continue                   # gone, or its pid now names another process
        try:
            if os.getpgid(pid) == pgid:
                continue               # the group's own: the group's signal reached it
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


def _signal_group(pgid, number):
    try:
        os.killpg(pgid, number)
    except ProcessLookupError:
        pass


def _wait_ended(run_dir, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if describe(run_dir)["state"] != "running":
            # Give the supervisor a moment to write exit.json after the process is gone.
            end = time.time() + 2.0
            while time.time() < end and not os.path.exists(os.path.join(run_dir, EXIT)):
                time.sleep(0.05)
            return True
        time.sleep(0.1)
    return False


# -------------------------------------------------------------------------- tail
class Followed(object):
    """One more log file (a rank's), read like output.log from its own offset."""

    def __init__(self, run_dir, rel, offset):
        self.path = os.path.join(run_dir, rel)
        self.rel = rel
        self.offset = offset
        self.handle = None

    def read(self, ended):
        """Emits the new whole lines (all of it once the run ended); True if it sent any."""
        if self.handle is None:
            try:
                self.handle = os.fdopen(os.open(self.path, os.O_RDONLY | NOFOLLOW), "rb")
            except OSError:
                return False
        size = os.fstat(self.handle.fileno()).st_size
        if size < self.offset:
            self.offset = 0
        if size <= self.offset:
            return False
        self.handle.seek(self.offset)
        data = self.handle.read(min(size - self.offset, READ_CHUNK))
        cut = line_cut(data, ended)
        if not cut:
            return False
        emit("data", file=self.rel, at=self.offset, text=data[:cut].decode("utf-8", "surrogateescape"))
        self.offset += cut
        return True

    def done(self):
        if self.handle is None:
            return not os.path.exists(self.path)   # found, then removed: nothing to read
        return os.fstat(self.handle.fileno()).st_size <= self.offset


def line_cut(data, ended):
    """How much of data to send: up to its last line end (a newline, or the carriage return
    that ends a progress-bar redraw); all of it when the run ended or the chunk is full."""
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    if cut == 0 and (ended or len(data) >= READ_CHUNK):
        cut = len(data)
    return cut


MAX_FOLLOWED = 1024   # logs followed beside output.log: the run decides how many match


def discover(run_dir, patterns, followed, offsets):
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(run_dir, pattern))):
            if len(followed) >= MAX_FOLLOWED:
                return
            rel = os.path.relpath(path, run_dir)
            if rel not in followed and os.path.isfile(path):
                followed[rel] = Followed(run_dir, rel, int(offsets.get(rel, 0)))


def tail(args):
    run_dir = args["run_dir"]
    offset = int(args.get("offset", 0))
    patterns = [p for p in (args.get("follow") or []) if isinstance(p, str)]
    offsets = args.get("offsets") or {}
    followed = {}
    min_sleep = float(args.get("min_interval", 0.05))
    max_sleep = float(args.get("max_interval", 0.2))
    max_seconds = float(args.get("max_seconds", 3600.0))
    gpu_every = float(args.get("gpu_every", 0) or 0)
    gpus = args.get("gpus") or []
    has_smi = gpu_every > 0 and nvidia_smi_present()
    log_path = os.path.join(run_dir, LOG)

    # One tail per follower: a newer tail of the same follower (after a reconnect) makes an
    # older one, still running on a half-dead connection, leave at its next heartbeat.
    owner_path = owner = None
    if args.get("follower"):
        owner_path = os.path.join(run_dir, ".tail-%s" % args["follower"])
        owner = "%d-%d" % (os.getpid(), time.time_ns() if hasattr(time, "time_ns") else 0)
        fd, part = open_new(run_dir, os.path.basename(owner_path))
        with os.fdopen(fd, "w") as handle:
            handle.write(owner)
        os.replace(part, owner_path)

    started = time.time()
    state = describe(run_dir)
    emit("hello", tail_pid=os.getpid(), **_beat_fields(state, offset))
    handle = None
    sleep = min_sleep
    next_beat = started + BEAT_EVERY
    next_gpu = started
    gone_since = None
    while True:
        if handle is None:
            try:
                handle = os.fdopen(os.open(log_path, os.O_RDONLY | NOFOLLOW), "rb")
            except FileNotFoundError:
                handle = None
        got = False
        size = os.fstat(handle.fileno()).st_size if handle is not None else 0
        if handle is not None:
            if size < offset:
                emit("truncated", at=offset, size=size)
                offset = 0
            if size > offset:
                handle.seek(offset)
                data = handle.read(min(size - offset, READ_CHUNK))
                ended = state["state"] in ("exited", "vanished", "missing")
                cut = line_cut(data, ended)  # a last line without its newline, or one huge line
                if cut:
                    emit("data", at=offset, text=data[:cut].decode("utf-8", "surrogateescape"))
                    offset += cut
                    got = True
        if patterns:
            if not followed or time.time() >= next_beat:
                discover(run_dir, patterns, followed, offsets)
            ended = state["state"] in ("exited", "vanished", "missing")
            for extra in followed.values():
                got = extra.read(ended) or got
        now = time.time()
        if now >= next_beat:
            # The process state is read once a second: cheap, and the exit is seen soon enough.
            next_beat = now + BEAT_EVERY
            state = describe(run_dir)
            if owner_path is not None and _superseded(owner_path, owner):
                emit("result", superseded=True, **_beat_fields(state, offset))
                return
            emit("beat", **_beat_fields(state, offset))
            if has_smi and now >= next_gpu:
                next_gpu = now + gpu_every
                sample = query_gpus(gpus, timeout=10)
                if isinstance(sample, list):
                    # The process state with each sample: the controller summarises the
                    # samples taken while the workers ran, not those after they ended.
                    emit("gpu", gpus=sample, t=round(now, 3), state=state["state"])
        if state["state"] in ("exited", "vanished", "missing") and not got:
            if state["state"] == "vanished" and now - (gone_since or now) < VANISHED_GRACE:
                # The supervisor may be writing exit.json right now: look again shortly.
                gone_since = gone_since or now
                time.sleep(0.1)
                state = describe(run_dir)
                continue
            if patterns:
                discover(run_dir, patterns, followed, offsets)
            rest = [f for f in followed.values() if not f.done()]
            if (handle is None or os.fstat(handle.fileno()).st_size <= offset) and not rest:
                emit("result", **_beat_fields(state, offset))
                return
        if now - started >= max_seconds:
            emit("result", rotate=True, **_beat_fields(state, offset))
            return
        if got:
            sleep = min_sleep
        else:
            time.sleep(sleep)
            sleep = min(max_sleep, sleep * 1.5)


def _superseded(owner_path, owner):
    try:
        with open(owner_path) as current:
            return current.read() != owner
    except OSError:
        return False


def _beat_fields(state, offset):
    times = os.times()
    fields = dict(state)
    fields["offset"] = offset
    fields["cpu_s"] = round(times[0] + times[1], 4)
    fields["now"] = time.time()
    return fields


ACTIONS = {"start": start, "status": status, "stop": stop, "tail": tail}


def main():
    leave_quietly_on_hangup()   # a tail whose controller went away just ends
    try:
        args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    except ValueError as error:
        fail("bad arguments: %s" % error)
    action = args.get("action")
    if action not in ACTIONS:
        fail("unknown action %r (start, status, stop, tail)" % (action,))
    if not args.get("run_dir"):
        fail("run_dir is required")
    checked_run_dir(args["run_dir"], create=action == "start")
    ACTIONS[action](args)


if __name__ == "__main__":
    main()
