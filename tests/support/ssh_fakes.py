"""A stand-in for paramiko's SSHClient under an SshHost's pooled connection, for unit tests of
the transport that hand it a fake transport (one that refuses, resets or answers)."""

from __future__ import annotations


class FakeClient:
    """Holds the fake transport the test gives it, as SSHClient holds its Transport; its close
    does nothing (a subclass makes it fail, as a dead link's close can)."""

    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport

    def close(self):
        pass
