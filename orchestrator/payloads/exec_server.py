"""Payload: a persistent command server inside the container (stdlib only, Python 3.8+).

Started once as `python3 -I -S -c SOURCE` over one `pct exec` channel, it runs one command
at a time, streaming: the command's output goes back as it is written, its input arrives
as it is typed, and a kill message stops it. Per command it saves a new SSH channel, a new
`pct exec` and a new interpreter: about 2 ms instead of 25 ms.

Frames, both ways: kind (1 byte), command id (4 bytes), length (4 bytes), then the body.
  to the server    r run {"argv": [...], "env": {...}, "in_python": bool, "script": "..."}   i input bytes   c end of input
                   k kill (SIGTERM to the group, SIGKILL 2 s later)
  from the server  s started   o stdout bytes   e stderr bytes   x exit {"code": N}
                   n not started {"errno": N, "error": "..."}: nothing ran; the caller
                     may run the command another way (the message it would get differs)
The first frame is ready {"pid": N} (kind "R", id 0).
A command runs without a shell, as the leader of its own process group, with the
environment this server was started with (read back from /proc/self/environ: Python may
have changed its own, e.g. the C-locale coercion of PEP 538) plus the run's env. When the
channel closes (orch went away, a timeout, Ctrl-C), the running command's group is killed,
as orch's reaper does for a command on a channel of its own. Exit code: the command's, or
128+N when signal N ended it.
in_python (argv `python3 - ARGS`, a stdlib payload): the script runs in a fork of this
server's interpreter instead of a new one (_inproc), a process and group of its own all
the same: the same streams, kill and exit code, and nothing it does reaches the server.
Its script may come in the request instead of on stdin: compiled here once and kept, it
costs a fork 1.6 instead of 5 ms of CPU (compiling in the child copies the pages it touches).
"""

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings

from _environ import *  # orch: inlined when shipped
from _inproc import *  # orch: inlined when shipped

HEADER = struct.Struct(">cII")
KILL_GRACE_S = 2.0
CHUNK = 65536
# 3.12 warns of a fork in a process with threads: while the script is forked no other
# command runs, so no thread holds a lock the child needs (it uses only its own fds)
warnings.filterwarnings("ignore", message=r".*multi-threaded, use of fork\(\)",
                        category=DeprecationWarning)


class Output:
    """Frames to orch on fd 1, written whole by one thread at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.gone = False  # orch's end of the channel closed

    def send(self, kind, ident, body=b""):
        data = HEADER.pack(kind, ident, len(body)) + body
        with self.lock:
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(1, view):]
            except OSError:
                self.gone = True


def read_frame(stream):
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    kind, ident, length = HEADER.unpack(header)
    body = stream.read(length) if length else b""
    if len(body) < length:
        return None
    return kind, ident, body


def new_group_options():
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"start_new_session": True}  # setsid: also a new group, made in C (thread-safe)


class Command:
    def __init__(self, ident, request, base_env, output):
        self.ident = ident
        self.output = output
        self.killed_at = None
        env = dict(base_env)
        env.update((os.fsencode(k), os.fsencode(v)) for k, v in (request.get("env") or {}).items())
        argv = request["argv"]
        if request.get("in_python") and runs_here(argv):
            script = request.get("script")
            self.process = ForkedPython(argv, env, script, compiled(script))
        else:
            self.process = subprocess.Popen(
                [os.fsencode(arg) for arg in argv], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, **new_group_options())
        self.input = Input(self.process.stdin)

    def begin(self):
        """Stream the output, then say how the command ended (after its last output)."""
        self.pumps = [threading.Thread(target=self.pump, args=(pipe, kind), daemon=True)
                      for pipe, kind in ((self.process.stdout, b"o"), (self.process.stderr, b"e"))]
        threading.Thread(target=self.finish, daemon=True).start()

    def pump(self, pipe, kind):
        fd = pipe.fileno()
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""
            if not data:
                return
            self.output.send(kind, self.ident, data)
            if self.output.gone:
                self.kill()

    def finish(self):
        for pump in self.pumps:
            pump.start()
        for pump in self.pumps:
            pump.join()
        code = self.process.wait()
        self.input.close()
        code = 128 - code if code < 0 else code
        self.output.send(b"x", self.ident, json.dumps({"code": code}).encode())

    def kill(self):
        """SIGTERM to the command's group; SIGKILL if it is still there after the grace."""
        if self.killed_at is None:
            self.killed_at = time.monotonic()
            signal_group(self.process.pid, signal.SIGTERM)
            timer = threading.Timer(KILL_GRACE_S, self.kill_hard)
            timer.daemon = True
            timer.start()

    def kill_hard(self):
        if self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGKILL)

    def running(self):
        return self.process.poll() is None


COMPILED = {}   # script text -> code: the same payload, container after container
COMPILED_KEPT = 8


def compiled(script):
    """The script's code, None when there is none or it does not compile (the child then
    compiles it again and says why, as python3 would)."""
    if not isinstance(script, str):
        return None
    code = COMPILED.get(script)
    if code is None:
        try:
            code = compile(script, "<stdin>", "exec")
        except (SyntaxError, ValueError):
            return None
        if len(COMPILED) >= COMPILED_KEPT:
            COMPILED.clear()
        COMPILED[script] = code
    return code


class ForkedPython:
    """`python3 - ARGS` in a fork of this interpreter, with the parts of Popen that Command
    uses: pid, stdin/stdout/stderr pipes, poll, wait (a signal's death: -N)."""

    def __init__(self, argv, env, script=None, code=None):
        pipes = [os.pipe() for _ in range(3)]
        pid = os.fork()
        if pid == 0:
            self.child(argv, env, pipes, script, code)
        try:
            os.setpgid(pid, pid)   # also here, as reaper.start: a kill may come at once
        except OSError:
            pass
        self.pid, self.returncode, self.reaping = pid, None, threading.Lock()
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        self.stdin = os.fdopen(pipes[0][1], "wb", buffering=0)
        self.stdout = os.fdopen(pipes[1][0], "rb", buffering=0)
        self.stderr = os.fdopen(pipes[2][0], "rb", buffering=0)

    @staticmethod
    def child(argv, env, pipes, script, code):
        try:
            os.setpgid(0, 0)
            for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(number, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for fd, (read, write) in enumerate(pipes):
                os.dup2(read if fd == 0 else write, fd)
            for name in os.listdir("/proc/self/fd"):   # the server's channel and pipes
                if int(name) > 2:                        # are not the script's
                    try:
                        os.close(int(name))
                    except OSError:
                        pass
        except BaseException:
            os._exit(126)
        run_here(argv, env, script, code)

    def wait(self):
        # polled, never a blocking waitpid under the lock: the main thread's poll (a
        # closing channel's kill) must not wait for the script's end
        delay = 0.001
        while self.poll() is None:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def poll(self):
        # one reaper at a time (finish's wait, the main thread's poll), as Popen keeps it
        with self.reaping:
            if self.returncode is None:
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.returncode = self.status_code(status)
            return self.returncode

    @staticmethod
    def status_code(status):
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def signal_group(pid, number):
    try:
        os.killpg(pid, number)
    except OSError:
        pass


class Input(threading.Thread):
    """Writes the command's input from a thread of its own: a command that does not read
    must not stop the server from reading a kill."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe = pipe
        self.pieces = []
        self.ready = threading.Condition()
        self.start()

    def put(self, data):
        with self.ready:
            self.pieces.append(data)
            self.ready.notify()

    def close(self):
        self.put(None)

    def run(self):
        while True:
            with self.ready:
                while not self.pieces:
                    self.ready.wait()
                data = self.pieces.pop(0)
            if data is None:
                break
            try:
                self.pipe.write(data)
            except OSError:
                break  # the command closed its input: the rest is dropped, as a pipe would
        try:
            self.pipe.close()
        except OSError:
            pass


def start(ident, body, base_env, output):
    try:
        request = json.loads(body.decode("utf-8", "surrogateescape"))
        command = Command(ident, request, base_env, output)
    except OSError as error:
        reply = {"errno": error.errno, "error": error.strerror or str(error)}
        output.send(b"n", ident, json.dumps(reply).encode())
        return None
    except (ValueError, KeyError, TypeError) as error:
        output.send(b"n", ident, json.dumps({"errno": 0, "error": "bad request: %s" % error}).encode())
        return None
    output.send(b"s", ident)
    command.begin()
    return command


class Stop:
    """SIGTERM, SIGHUP or SIGINT end the server (SystemExit in its main thread, which may be
    blocked reading a frame). While a command is being started the signal is held until
    the command is in `running`: raised in the middle of start(), it left the finally below
    nothing to kill, and the command (a group of its own) outlived the server."""

    def __init__(self):
        self.holding = False
        self.pending = None

    def __call__(self, number, frame):
        if self.holding:
            self.pending = number
            return
        raise SystemExit(128 + number)

    @contextlib.contextmanager
    def held(self):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending is not None:
                raise SystemExit(128 + self.pending)


def main():
    base_env = start_environment()
    output = Output()
    running = []   # the command now running, if any
    stop = Stop()
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, stop)
    output.send(b"R", 0, json.dumps({"pid": os.getpid()}).encode())
    try:
        serve(sys.stdin.buffer, base_env, output, running, stop.held)
    finally:
        # orch went away (the channel closed, or we were told to stop): take the running
        # command with us, as the reaper does for a command on a channel of its own
        if running and running[0].running():
            running[0].kill()
            deadline = time.monotonic() + KILL_GRACE_S + 0.5
            while running[0].running() and time.monotonic() < deadline:
                time.sleep(0.02)
            running[0].kill_hard()


def serve(stream, base_env, output, running, held):
    while True:
        frame = read_frame(stream)
        if frame is None:
            return
        kind, ident, body = frame
        current = running[0] if running else None
        if kind == b"r":
            if current is not None and current.running():
                output.send(b"n", ident, b'{"errno": 16, "error": "busy"}')
                continue
            with held():
                running[:] = [command for command in [start(ident, body, base_env, output)]
                              if command]
        elif current is None or ident != current.ident:
            continue  # input or a kill for a command that already ended
        elif kind == b"i":
            current.input.put(body)
        elif kind == b"c":
            current.input.close()
        elif kind == b"k":
            current.kill()


if __name__ == "__main__":
    main()
