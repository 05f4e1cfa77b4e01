"""An SSH server (paramiko's) on a free port of this machine: what the SSH transport's tests
connect to when they need to see what a client offers and sends."""

from __future__ import annotations

import socket
import threading

from orchestrator.remote.paramiko_lib import paramiko
from tests.support.listeners import accept_in_a_thread


class SshServer:
    """Accepts connections, authenticates one client key, records who logged in."""

    def __init__(self, client_key: paramiko.PKey, ciphers: tuple[str, ...] = ()):
        self.host_key = paramiko.ECDSAKey.generate()
        self.ciphers = ciphers        # what the server offers, when not paramiko's default
        self.client_key = client_key
        self.accepted = 0
        self.logins: list[str] = []
        self.transports: list[paramiko.Transport] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        accept_in_a_thread(self.listener, self._start_session)

    def _start_session(self, conn):
        self.accepted += 1
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        if self.ciphers:
            transport.get_security_options().ciphers = self.ciphers
        self.transports.append(transport)
        threading.Thread(target=self._negotiate, args=(transport,), daemon=True).start()

    def _negotiate(self, transport):
        try:
            transport.start_server(server=_Interface(self))
        except (paramiko.SSHException, OSError, EOFError):
            pass   # a client that went away (the tests close some on purpose)

    def close(self):
        self.listener.close()
        for transport in self.transports:
            transport.close()


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: SshServer):
        self.server = server

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        if key == self.server.client_key:
            self.server.logins.append(username)
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED
