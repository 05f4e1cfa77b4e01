"""A pull's hand-off from the channel to the receiver (orchestrator/remote/transfer.py,
_ChunkQueue) and the channel reads that feed it (orchestrator/remote/ssh.py, _drain)."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.remote.base import RunOptions
from orchestrator.remote.paramiko_lib import READ_AT_ONCE
from orchestrator.remote.ssh import _drain
from orchestrator.remote.transfer import _ChunkQueue, _ReceiverGone


def test_reads_cross_chunk_boundaries_and_stop_short_only_at_the_end():
    pipe = _ChunkQueue()
    for chunk in (b"abc", b"defgh", b"", b"ij"):
        pipe.put(chunk)
    pipe.end()
    assert pipe.read_exact(4) == b"abcd"
    assert pipe.read_exact(5) == b"efghi"
    assert pipe.read_exact(5) == b"j"
    assert pipe.read_exact(5) == b""


def test_the_writer_waits_while_the_queued_bytes_are_over_the_limit():
    pipe = _ChunkQueue(limit=10)
    pipe.put(b"x" * 8)
    second_queued = threading.Event()

    def writer():
        pipe.put(b"y" * 8)   # 16 > 10: waits for the reader
        second_queued.set()
    threading.Thread(target=writer, daemon=True).start()
    assert not second_queued.wait(0.5)
    assert pipe.read_exact(8) == b"x" * 8
    assert second_queued.wait(5)
    assert pipe.read_exact(8) == b"y" * 8


def test_one_chunk_larger_than_the_limit_still_goes_through():
    pipe = _ChunkQueue(limit=4)
    pipe.put(b"z" * 100)
    pipe.end()
    assert pipe.read_exact(100) == b"z" * 100


def test_a_writer_waiting_on_a_gone_reader_is_told():
    pipe = _ChunkQueue(limit=4)
    pipe.put(b"1234")
    failed = []

    def writer():
        try:
            pipe.put(b"5678")
        except _ReceiverGone:
            failed.append(True)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    time.sleep(0.3)
    pipe.close_reader()
    thread.join(5)
    assert failed == [True]
    with pytest.raises(_ReceiverGone):
        pipe.put(b"later")


class _BufferedChannel:
    """A channel whose whole window has arrived: recv(n) gives up to n of it."""

    def __init__(self, buffered: bytes):
        self._out = buffered
        self.sizes: list[int] = []
        self.closed = False
        self.eof_received = True

    def recv_ready(self):
        return bool(self._out)

    def recv(self, size):
        self.sizes.append(size)
        piece, self._out = self._out[:size], self._out[size:]
        return piece

    def recv_stderr_ready(self):
        return False

    def exit_status_ready(self):
        return True


def test_the_channel_is_read_a_whole_window_at_a_time():
    # paramiko deletes a smaller read from the front of its buffer, moving the rest: a
    # full 2 MiB window read 64 KiB at a time moved about 1 MiB per read
    window = bytes(range(256)) * 8192   # paramiko's default window, 2 MiB
    channel = _BufferedChannel(window)
    chunks: list[bytes] = []
    _drain(channel, RunOptions(on_stdout=chunks.append, capture=False))
    assert b"".join(chunks) == window
    assert len(chunks) == 1 and READ_AT_ONCE >= len(window)
