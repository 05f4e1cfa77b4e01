"""Forwarders (orch forward's engine) opened and served in threads, for the forward tests on
this machine and in the sandbox: the test connects to their local ports and reads what they said."""

from __future__ import annotations

import contextlib
import threading

from orchestrator.remote import forward


@contextlib.contextmanager
def forwarders_in_threads():
    """Yields start(target, *remote_ports, **options) -> (Forwarder, [local port]): a Forwarder
    to the target's ports, opened and accepting in a thread of its own; what it says is in its
    .said, a fatal error in its .raised. All are closed and their threads joined at the end."""
    made = []

    def start(target, *remote_ports, **options):
        said = []
        forwarder = forward.Forwarder(target, [forward.PortSpec(0, p) for p in remote_ports],
                                      say=said.append, **options)
        ports = [local for _, local, _ in forwarder.open()]
        forwarder.said = said
        thread = threading.Thread(target=_serve_keeping_the_error, args=(forwarder,), daemon=True)
        thread.start()
        made.append((forwarder, thread))
        return forwarder, ports
    try:
        yield start
    finally:
        for forwarder, thread in made:
            forwarder.close()
            thread.join(10)


def _serve_keeping_the_error(forwarder):
    try:
        forwarder.serve()
    except Exception as error:   # a fatal error: the test reads it
        forwarder.raised = error
