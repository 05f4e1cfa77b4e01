"""Payload: the container's end of one `orch forward` connection — stdlib only.

Run as `python3 -I -S -c SOURCE PORT [probe]` (the source in argv: stdin and stdout are the
connection's bytes). Connects to 127.0.0.1:PORT inside the container and copies stdin to
that socket and the socket to stdout:
- stdin's end (the local client closed its side) shuts the socket's write side down, so a
  server still answers a request whose sender has finished (half-close, as `ssh -L`);
- the socket's end (the server closed) ends the relay: what the server sent is written out
  whole first. The local client then sees the connection close.
Exit status: 0 relayed; 3 nothing accepted the connection (the one line on stderr says
why). With `probe` it connects to nothing: it looks for a listening socket on PORT in the
kernel's tables (/proc/net/tcp, tcp6): 0 one listens (each listener's local address
printed, one a line: orch forward goes direct only to a non-loopback one), 3 none. A test connection would be
taken by a one-client server as its client: debugpy's adapter serves the first connection
it gets and then no other.
"""

import os
import socket
import sys
import threading

CHUNK = 1 << 16
CONNECT_TIMEOUT_S = 10
NOT_CONNECTED = 3
LISTEN = "0A"          # TCP_LISTEN in /proc/net/tcp's st column
MAX_TABLE_LINES = 1 << 20   # a table is the kernel's, but read bounded all the same


def connect(port):
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
    except OSError as error:
        sys.stderr.write("orch-forward: nothing accepted a connection to 127.0.0.1:%d: %s\n"
                         % (port, error.strerror or error))
        sys.exit(NOT_CONNECTED)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def listening(port):
    """The local addresses the sockets of this network namespace that listen on TCP
    `port` are bound to (0.0.0.0 and :: for any), as text."""
    wanted = ":%04X" % port
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table) as lines:
                next(lines, None)   # the header
                for count, line in enumerate(lines):
                    fields = line.split(None, 4)
                    if len(fields) > 3 and fields[1].endswith(wanted) and fields[3] == LISTEN:
                        found.append(address_text(fields[1].partition(":")[0], family))
                    if count > MAX_TABLE_LINES or len(found) > 16:
                        break
        except OSError:
            continue
    return found


def address_text(hexed, family):
    """/proc/net/tcp's address: 32-bit words in the kernel's (little-endian) order."""
    raw = bytes.fromhex(hexed)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, swapped)


def to_server(sock):
    """stdin into the socket until stdin ends, then the socket's write side shut down."""
    try:
        while True:
            data = os.read(0, CHUNK)
            if not data:
                break
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass   # the server went away: the other direction ends the relay


def to_client(sock):
    """The socket's bytes onto stdout until the server closes."""
    while True:
        try:
            data = sock.recv(CHUNK)
        except OSError:
            return
        if not data:
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(1, view):]
            except OSError:
                return   # orch's channel closed


def main(argv):
    port = int(argv[1])
    if argv[2:] == ["probe"]:
        found = listening(port)
        sys.stdout.write("".join(address + "\n" for address in found))
        return 0 if found else NOT_CONNECTED
    sock = connect(port)
    threading.Thread(target=to_server, args=(sock,), daemon=True).start()
    to_client(sock)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
