"""A TCP port free on this machine now, for a rendezvous orch is about to start here.

Shipped alone into a container and run with the container's python; standard library
only, Python 3.8+.

Args: ``{}``. Output: one JSON line, ``{"event": "result", "port": 43127}`` (exit code 0),
or an error line (exit code 1). The kernel picks the port (bind to port 0), so it is free
when asked; torchrun's c10d store binds it a few seconds later (on every interface, as the
store does).
"""

import socket
import sys

from _protocol import *  # orch: inlined when shipped


def run(args):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return {"port": probe.getsockname()[1]}


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, {}, run))
