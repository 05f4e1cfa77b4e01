"""stdio for the MCP server without a thread hop per message.

The SDK's default stdio transport reads and writes the std streams through anyio's
`wrap_file`, one worker-thread round trip per line read, per write and per flush: three
per tool call, on top of the one that runs the (blocking) tool. Here the protocol's file
descriptors are non-blocking and awaited with anyio.wait_readable/wait_writable on the
event loop. As the SDK does, fd 0 and fd 1 are taken for the protocol while serving: fd 0
then reads the null device and fd 1 goes to stderr, so a child process or a stray print
cannot write into the protocol stream.
"""

from __future__ import annotations

import contextlib
import os

import anyio


class FdLines:
    """Async iteration over the lines of a non-blocking file descriptor (str, utf-8)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = b""
        self._eof = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while b"\n" not in self._buffer:
            if self._eof:
                if self._buffer:
                    line, self._buffer = self._buffer, b""
                    return line.decode("utf-8", "replace")
                raise StopAsyncIteration
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            if not chunk:
                self._eof = True
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace") + "\n"


class FdWriter:
    """`await write(text)` / `await flush()` on a non-blocking file descriptor."""

    def __init__(self, fd: int):
        self.fd = fd

    async def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:
            try:
                written = os.write(self.fd, data)
            except BlockingIOError:
                await anyio.wait_writable(self.fd)
                continue
            data = data[written:]

    async def flush(self) -> None:
        return None


@contextlib.contextmanager
def claimed_stdio():
    """(FdLines over the protocol's stdin, FdWriter to its stdout); restores fds 0 and 1."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        os.set_blocking(wire_in, False)
        os.set_blocking(wire_out, False)
        yield FdLines(wire_in), FdWriter(wire_out)
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        for fd in (null, wire_in, wire_out, saved_in, saved_out):
            os.close(fd)


def serve_stdio(server) -> None:
    """Run an MCPServer on this process's stdin/stdout (as server.run() does, minus the threads)."""
    # The MCP SDK is an optional extra (orch[mcp]): imported when the server starts.
    from mcp.server.stdio import stdio_server

    lowlevel = getattr(server, "_lowlevel_server", None)
    if lowlevel is None:  # a later SDK moved it: its own (threaded) stdio still works
        server.run()
        return

    async def main() -> None:
        with claimed_stdio() as (lines, writer):
            async with stdio_server(lines, writer) as (read_stream, write_stream):
                await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())

    anyio.run(main)
