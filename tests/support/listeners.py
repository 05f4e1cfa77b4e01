"""The accept loop of the test servers on this machine (the SSH server, the forward tests' TCP
servers): each connection handed on as it comes, in a thread beside the test."""

from __future__ import annotations

import socket
import threading
from typing import Callable


def accept_in_a_thread(listener: socket.socket, on_connection: Callable[[socket.socket], None]):
    """Accepts connections on listener in a daemon thread, calling on_connection(conn) for each,
    until the listener is closed (its accept() then raises OSError, which ends the thread)."""
    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            on_connection(conn)
    threading.Thread(target=accept, daemon=True).start()
