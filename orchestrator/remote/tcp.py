"""How orch opens a TCP connection to an sshd (standard library only: the entry point opens
one before paramiko is imported, orchestrator/remote/early.py)."""

from __future__ import annotations

import socket


def tcp_connect(address: str, port: int, timeout: float) -> socket.socket:
    """A connected socket (OSError when it cannot be had within timeout)."""
    sock = socket.create_connection((address, port), timeout=timeout)
    # Without this each channel pays a delayed-ACK stall of about 55 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
