"""A controller process killed the way a user's `kill -9` kills it, for the tests of what a
killed controller leaves behind (a run that is still "running" and can be attached to)."""

from __future__ import annotations

import contextlib
import signal
import subprocess


@contextlib.contextmanager
def sigkilled_after(controller: subprocess.Popen):
    """Runs the with-block beside the running controller, then SIGKILLs it (no cleanup of its
    own) and waits for it to end; a block that fails kills it too, so none is left running."""
    try:
        yield controller
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
