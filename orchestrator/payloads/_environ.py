"""Shared payload code (inlined when shipped): the environment a process was started with."""

import os


def start_environment():
    """The environment this process was started with, as bytes: Python may have changed its
    own (under the C locale PEP 538 sets LC_CTYPE=C.UTF-8), and a command orch runs must get
    what it would get without orch's helper process in between."""
    try:
        with open("/proc/self/environ", "rb") as handle:
            items = handle.read().split(b"\0")
    except OSError:
        return dict(os.environb)
    return dict(item.split(b"=", 1) for item in items if b"=" in item[1:])
