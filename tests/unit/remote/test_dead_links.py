"""Dead links and broken connections without a server (issue 25): the watchdog that counts
unanswered keepalives, and closes that must not let paramiko's EOFError escape. Proven
against the sandbox's sshd with dropped packets in tests/integration/test_dead_links.py."""

from __future__ import annotations

import threading
import time

import paramiko
import pytest

from orchestrator.ground.errors import ConnectionLost
from orchestrator.remote.ssh import SshHost, SshSettings, _ChannelProcess, _Connection, _Watchdog
from tests.support.ssh_fakes import FakeClient


class SilentTransport:
    """A connection whose host sends nothing: keepalive requests go out, no answer comes."""

    def __init__(self, answers: bool = False):
        self.last_heard = time.monotonic()
        self.lost_reason = ""
        self.sent: list[paramiko.Message] = []
        self.closed_at = None
        self.answers = answers

    def is_active(self):
        return self.closed_at is None

    def close(self):
        self.closed_at = time.monotonic()

    def _send_user_message(self, message):
        self.sent.append(paramiko.Message(message.asbytes()))
        if self.answers:
            self.last_heard = time.monotonic()   # sshd's REQUEST_FAILURE, at once


def test_a_silent_host_is_declared_dead_after_count_max_unanswered_keepalives():
    transport = SilentTransport()
    started = time.monotonic()
    watchdog = _Watchdog(transport, interval=0.2, count_max=2)
    watchdog.start()
    watchdog.join(5)
    assert transport.closed_at is not None, "the watchdog never closed the dead connection"
    # OpenSSH's rule: interval x (count_max + 1) of silence
    assert 0.55 <= transport.closed_at - started < 1.2
    assert "answered none of 2 keepalive(s)" in transport.lost_reason
    assert len(transport.sent) == 2
    for message in transport.sent:
        assert message.get_byte() == paramiko.common.cMSG_GLOBAL_REQUEST
        assert message.get_text() == "keepalive@openssh.com"
        assert message.get_boolean() is True   # want_reply: paramiko's own keepalive says False


def test_a_host_that_answers_is_never_declared_dead():
    transport = SilentTransport(answers=True)
    watchdog = _Watchdog(transport, interval=0.1, count_max=1)
    watchdog.start()
    time.sleep(1.0)
    assert transport.is_active() and transport.lost_reason == ""
    assert len(transport.sent) >= 3    # it kept asking through the quiet second
    transport.close()
    watchdog.join(2)


class BrokenChannel:
    """A channel of a connection that was reset: paramiko's close() raises EOFError."""

    closed = True
    eof_received = False

    def close(self):
        raise EOFError()

    def recv_ready(self):
        return False


def test_closing_a_process_on_a_reset_connection_raises_nothing():
    released = []
    process = _ChannelProcess(BrokenChannel(), lambda: released.append(1), lambda: "")
    process.close()
    assert released == [1]
    assert process.readline(1.0) == b""


class ResetChannel(BrokenChannel):
    closed = False

    def exec_command(self, command):
        raise EOFError()


class ResetTransport:
    def __init__(self):
        self.lost_reason = ""

    def is_active(self):
        return True

    def open_session(self, timeout=None):
        return ResetChannel()


class Client(FakeClient):
    """A client whose close raises EOFError, as paramiko's can on a link that died."""

    def close(self):
        raise EOFError()


def test_a_command_on_a_reset_connection_is_a_typed_connection_lost():
    host = SshHost(SshSettings(name="h", address="192.0.2.1"))
    host._connections.append(_Connection(Client(ResetTransport()), 10))
    with pytest.raises(ConnectionLost, match="connection to host h broke while true ran"):
        host.run(["true"], timeout=None)
    host.close()   # the client's close raises EOFError too: nothing escapes


def test_a_missing_exec_reply_ends_the_wait(monkeypatch):
    """paramiko waits for sshd's exec reply without a deadline; orch's bound closes it."""
    monkeypatch.setattr("orchestrator.remote.ssh.EXEC_REPLY_TIMEOUT", 0.3)

    class Unanswered(ResetChannel):
        def __init__(self):
            self.event = threading.Event()
            self.closed = False

        def exec_command(self, command):
            self.event.wait(10)
            raise paramiko.SSHException("Channel closed.")

        def close(self):
            self.closed = True
            self.event.set()

    class Transport(ResetTransport):
        def open_session(self, timeout=None):
            return Unanswered()

    host = SshHost(SshSettings(name="h", address="192.0.2.1"))
    host._connections.append(_Connection(Client(Transport()), 10))
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match="did not answer the exec request within 0.3 s"):
        host.run(["true"], timeout=None)
    assert time.monotonic() - started < 3
