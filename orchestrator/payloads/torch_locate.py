"""Find an installed Python package (torch by default) without importing it.

Shipped alone into a container and run with the container's python; standard library
only, Python 3.8+.

Protocol
--------
Invocation: ``PYTHON - ARGS_JSON`` with this file on stdin, or ``PYTHON torch_locate.py
ARGS_JSON``. ARGS_JSON is one argv element holding a JSON object; unknown keys are an
error.

Args::

    {"package": "torch"}      # an import name ("torch", "yaml") or a distribution
                              # name ("torch", "PyYAML"); default "torch"

Output: JSON lines on stdout. The last line is the result (exit code 0)::

    {"event": "result", "package": "torch", "import_name": "torch",
     "distribution": "torch", "version": "2.13.0+cpu",
     "site_packages": "/root/venv/lib/python3.11/site-packages",
     "package_dir": ".../site-packages/torch",
     "dist_info": ".../site-packages/torch-2.13.0+cpu.dist-info",
     "python": "/root/venv/bin/python", "python_version": "3.11.2"}

``version``, ``distribution`` and ``dist_info`` are null when no dist-info directory
belongs to the package. On failure the last line is (exit code 1)::

    {"event": "error", "message": "<a sentence a user can act on>", "kind": "..."}

with kind "bad-args", "not-installed" or "internal".

The package is looked up on sys.path minus the entry Python puts first for the script
(the current directory with ``-``): a ``torch`` folder in the working directory is not
the installed torch.
"""

import sys

from _protocol import *  # orch: inlined when shipped
from _locate import *  # orch: inlined when shipped


ARG_SPEC = {"package": (str, "torch")}


def run(args):
    return locate(args["package"])


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
