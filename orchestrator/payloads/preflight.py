"""Payload: a multi-node run's pre-flight, on one node — stdlib only.

Two actions, run with the container's python (`PYTHON - ARGS_JSON`):

- "listen" (on the node that will host the rendezvous): bind TCP `port` on the endpoint's
  address `host` (every address when `host` is none of this container's: a forwarded
  one), print {"event": "listening", "port"} and answer each connection that first sends
  one of the nodes' nonces (`nonces`: their sha256, so this argv gives none away) with
  `token`; a connection that sends anything else gets nothing and takes no node's place.
  End once every nonce came, after `seconds`, or (with `stop_on_stdin`, as orch runs it)
  as soon as a line or EOF arrives on stdin, so the port is free again before anything is
  launched. The result is {"accepted": N, "refused": M}. A port already taken is the
  error kind "port-taken".
- "check" (on every node): connect to `host`:`port`, send the node's `nonce`, and read the
  token back (so it is our listener that answered, not something else on that port), and
  report what the node offers. Result:

    {"endpoint": {"ok": bool, "error": "..." | null, "seconds": 0.01} | null (connect false),
     "shm": {"path": "/dev/shm", "total_bytes": N, "free_bytes": N} | {"error": "..."},
     "interfaces": ["eth0", "lo"],          # /sys/class/net, at most 256 names
     "gpus": rows of _gpus.query_gpus | null (no nvidia-smi) | {"error": ...}}

Judging (versions, thresholds, interface patterns) is the controller's
(orchestrator/targets/preflight.py): the payload only measures.
"""

import hashlib
import os
import select
import socket
import sys
import time

from _protocol import *  # orch: inlined when shipped
from _gpus import *  # orch: inlined when shipped

ARG_SPEC = {"action": (str, REQUIRED), "host": (str, None), "port": (int, REQUIRED),
            "token": (str, REQUIRED), "timeout": (float, 3.0), "nonces": (list, []),
            "nonce": (str, ""), "seconds": (float, 30.0), "gpus": (list, []),
            "stop_on_stdin": (bool, False), "connect": (bool, True)}
MAX_INTERFACES = 256
MAX_NONCE = 128          # bytes a connection may send before its nonce's newline
NONCE_WAIT_S = 1.0       # how long the listener waits for one connection's nonce
SHM = "/dev/shm"
EADDRNOTAVAIL = 99


def listen(args):
    if not args["nonces"]:
        raise PayloadError("listen needs the nodes' nonces", "bad-args")
    server = _server(args["host"], args["port"])
    with server:
        emit("listening", port=args["port"])
        return _answer(server, args)


def _server(host, port):
    """A socket on the endpoint's address; on every address when that is not one of ours."""
    if host:
        try:
            family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            return socket.create_server(address, family=family)
        except OSError as error:
            if getattr(error, "errno", None) != EADDRNOTAVAIL and not isinstance(error, socket.gaierror):
                return _bind_failed(port, error)
    try:
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        try:
            return socket.create_server(("0.0.0.0", port))
        except OSError as error:
            return _bind_failed(port, error)


def _bind_failed(port, error):
    if getattr(error, "errno", None) == 98:   # EADDRINUSE
        raise PayloadError("port %d is already in use in this container" % port, "port-taken")
    raise PayloadError("cannot listen on port %d: %s" % (port, error), "bind-failed")


def _answer(server, args):
    """Count the nodes that came (each nonce once); anything else is refused unanswered."""
    deadline = time.monotonic() + args["seconds"]
    wanted, seen, refused = set(args["nonces"]), set(), 0
    watched = [server, sys.stdin] if args["stop_on_stdin"] else [server]
    while seen != wanted:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(watched, [], [], left)
        if not ready or sys.stdin in ready:    # the time is up, or orch says stop
            break
        try:
            peer, _ = server.accept()
        except OSError:
            continue
        with peer:
            try:
                peer.settimeout(NONCE_WAIT_S)
                digest = hashlib.sha256(_read_line(peer, MAX_NONCE).encode()).hexdigest()
            except OSError:      # silent for a second, or gone
                digest = None
            if digest not in wanted or digest in seen:
                refused += 1
                continue
            try:
                peer.sendall(args["token"].encode() + b"\n")
                seen.add(digest)
                _wait_for_close(peer)
            except OSError:
                continue
    return {"accepted": len(seen), "refused": refused}


def _wait_for_close(peer):
    """Let the client close first: the TIME_WAIT is then on its side, not on the port the
    rendezvous binds next (bounded: a client that never closes costs 2 s)."""
    peer.settimeout(2.0)
    try:
        while peer.recv(64):
            pass
    except socket.timeout:
        pass


def check(args):
    endpoint = None   # not asked for: nothing of ours listens (its port was taken)
    if args["connect"]:
        endpoint = reach(args["host"], args["port"], args["token"], args["timeout"],
                         args["nonce"])
    return {"endpoint": endpoint,
            "shm": shm_size(),
            "interfaces": interfaces(),
            "gpus": query_gpus(only=tuple(args["gpus"]))}


def reach(host, port, token, timeout, nonce):
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.sendall(nonce.encode() + b"\n")
            answer = _read_line(connection, len(token) + 1)
    except socket.timeout:
        return _reached(False, "timed out after %gs" % timeout, started)
    except OSError as error:
        return _reached(False, error.strerror or str(error), started)
    if answer != token:
        return _reached(False, "something else answers on that port", started)
    return _reached(True, None, started)


def _read_line(connection, limit):
    data = b""
    while len(data) < limit and not data.endswith(b"\n"):
        chunk = connection.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("ascii", "replace").strip()


def _reached(ok, error, started):
    return {"ok": ok, "error": error, "seconds": round(time.monotonic() - started, 3)}


def shm_size():
    try:
        stats = os.statvfs(SHM)
    except OSError as error:
        return {"path": SHM, "error": error.strerror or str(error)}
    return {"path": SHM, "total_bytes": stats.f_blocks * stats.f_frsize,
            "free_bytes": stats.f_bavail * stats.f_frsize}


def interfaces():
    try:
        return sorted(os.listdir("/sys/class/net"))[:MAX_INTERFACES]
    except OSError:
        return sorted(name for _, name in socket.if_nameindex())[:MAX_INTERFACES]


def run(args):
    if args["action"] == "listen":
        return listen(args)
    if args["action"] == "check":
        if not args["host"]:
            raise PayloadError("check needs the endpoint's host", "bad-args")
        return check(args)
    raise PayloadError("unknown action %r (listen or check)" % args["action"], "bad-args")


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
