"""orch forward, both ways, against `ssh -L`, side by side in one run: the throughput of one
download of -s MB and the latency of a new connection (a small HTTP/1.0 request, connect to
last byte, -n times, median and p90), through a local port, all to one server:
python3 -m http.server on 0.0.0.0 in CT 200 of sb1 (10.88.1.200).

    python benchmarks/forward.py [-s 100] [-d 5] [-n 30] [--json]

  orch forward direct  `orch forward --via direct sb1-200 0:PORT`: a direct-tcpip channel of
                       the host's SSH connection to 10.88.1.200:PORT
  orch forward relay   `orch forward --via relay sb1-200 0:PORT`: a python3 relay in the
                       container over `pct exec` per connection
  ssh -L via the host  `ssh -N -L 0:10.88.1.200:PORT sb1`: OpenSSH's forwarding through the
                       host to the container's address, like for like with direct

Against the sandbox (`orch sandbox up` first); the client, sshd and the servers share this
machine's CPUs, so the figures compare the ways, not a link.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orch_sandbox as sandboxes  # noqa: E402
from timing import bytecode_as_installed  # noqa: E402

HOST, VMID, TARGET, ADDRESS = "sb1", 200, "sb1-200", "10.88.1.200"
FOLDER = "/tmp/orch-bench-forward"
ORCH = [sys.executable, "-m", "orchestrator"]
SERVE = ('mkdir -p {f} && cd {f} && head -c {size} /dev/urandom > big.bin && printf small > '
         'small.txt && sha256sum big.bin | cut -d" " -f1 && {{ setsid python3 -m http.server '
         '{port} --bind 0.0.0.0 >/dev/null 2>&1 </dev/null & echo $! > pid; }}')


def serve(run_shell, size: int, port: int) -> str:
    """Start the server through run_shell(script) -> stdout; the sha256 of big.bin."""
    return run_shell(SERVE.format(f=FOLDER, size=size, port=port)).strip()


def stop(run_shell) -> None:
    run_shell(f'kill "$(cat {FOLDER}/pid)"; rm -rf {FOLDER}')


def wait_listening(port: int, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if b"200" in request(port, "/small.txt")[:20]:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing answers on 127.0.0.1:{port}")
        time.sleep(0.2)


def request(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        return b"".join(iter(lambda: sock.recv(1 << 16), b""))


def download(port: int) -> tuple[float, str]:
    started = time.monotonic()
    digest = hashlib.sha256()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"GET /big.bin HTTP/1.0\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1 << 16)
        digest.update(head.split(b"\r\n\r\n", 1)[1])
        for piece in iter(lambda: sock.recv(1 << 16), b""):
            digest.update(piece)
    return time.monotonic() - started, digest.hexdigest()


def latency(port: int, runs: int) -> dict:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        assert request(port, "/small.txt").endswith(b"small")
        times.append((time.monotonic() - started) * 1000)
    times.sort()
    return {"connect_ms_median": round(statistics.median(times), 1),
            "connect_ms_p90": round(times[int(0.9 * (len(times) - 1))], 1)}


def local_port(process: subprocess.Popen) -> int:
    line = process.stderr.readline().decode()
    if not line.startswith("http://"):
        raise SystemExit(f"orch forward said: {line.strip()}")
    return int(line.split()[0].rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--size-mb", type=int, default=100)
    parser.add_argument("-n", "--runs", type=int, default=30)
    parser.add_argument("-d", "--downloads", type=int, default=5,
                        help="downloads per way, taken in turns (their median is the row's MB/s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bed = sandboxes.up()
    bytecode_as_installed()
    ssh = bed.ssh_argv(HOST)
    port = 20000 + secrets.randbelow(20000)
    size = args.size_mb << 20

    def in_container(script):
        return bed.pct(HOST, "exec", str(VMID), "--", "sh", "-c", script)

    digest = serve(lambda s: _text(in_container(s)), size, port)
    tunnels: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        for via in ("direct", "relay"):
            forwarder = subprocess.Popen([*ORCH, "-i", str(bed.inventory_path), "forward",
                                          "--via", via, TARGET, f"0:{port}"],
                                         stderr=subprocess.PIPE,
                                         env={**os.environ, "ORCH_AGENT": "off"})
            tunnels[f"orch forward {via}"] = (forwarder, local_port(forwarder))
        local = free_port()
        tunnels["ssh -L via the host"] = (subprocess.Popen(
            [*ssh, "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:{ADDRESS}:{port}"]), local)
        for _process, local in tunnels.values():
            wait_listening(local)
        # the ways take turns, download by download: a minute of other load on the machine
        # falls on all of them, and the median of each way's downloads is compared
        speeds: dict[str, list[float]] = {label: [] for label in tunnels}
        for _ in range(args.downloads):
            for label, (_process, local) in tunnels.items():
                seconds, shown = download(local)
                assert shown == digest, f"{label}: the download differs"
                speeds[label].append(args.size_mb / seconds)
        rows = {label: {"MB_per_s": round(statistics.median(speeds[label]), 1),
                        "MB_per_s_all": [round(v, 1) for v in speeds[label]],
                        **latency(local, args.runs)}
                for label, (_process, local) in tunnels.items()}
    finally:
        for process, _local in tunnels.values():
            process.terminate()
            process.wait(30)
        stop(lambda s: in_container(s))
    if args.json:
        print(json.dumps({"size_mb": args.size_mb, "runs": args.runs, "rows": rows}, indent=2))
        return
    print(f"{args.size_mb} MB download, median of {args.downloads} per way taken in turns; "
          f"new connection: median/p90 of {args.runs}")
    baseline = rows["ssh -L via the host"]["MB_per_s"]
    print("| way | MB/s | of ssh -L | new connection, median ms | p90 ms |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for label, row in rows.items():
        print(f"| {label} | {row['MB_per_s']:.1f} | {row['MB_per_s'] / baseline:.0%} | "
              f"{row['connect_ms_median']:.1f} | {row['connect_ms_p90']:.1f} |")


def _text(result) -> str:
    out = result if isinstance(result, (str, bytes)) else getattr(result, "stdout", "") or ""
    return out.decode() if isinstance(out, bytes) else out


if __name__ == "__main__":
    main()
