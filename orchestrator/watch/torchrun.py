"""A launch step's `torchrun:` block: the argv that starts a command under torchrun with one
log file per rank, and where those logs land (what the monitor follows).

    launch:
      torchrun: {nproc_per_node: 2, master_port: 29500}
      command: [python, scripts/train_dflash.py, --batch-size, 1]

becomes `python -m torch.distributed.run --nproc-per-node 2 --master-port 29500
--log-dir RUN_DIR/ranks --redirects 3 scripts/train_dflash.py --batch-size 1`. With
`--redirects 3` each rank's stdout and stderr go to RUN_DIR/ranks/<run id>/attempt_<n>/
<local rank>/{stdout,stderr}.log (torch 2.x), and torchrun's own words (its agent's
warnings, the ChildFailedError summary) to the run's output.log.
"""

from __future__ import annotations

import os
from typing import Any

RANK_LOG_DIR = "ranks"
RANK_LOGS = [f"{RANK_LOG_DIR}/*/attempt_*/*/stderr.log", f"{RANK_LOG_DIR}/*/attempt_*/*/stdout.log"]

# torchrun options a playbook may set: name -> (type, torchrun flag)
OPTIONS: dict[str, tuple[type, str]] = {
    "nproc_per_node": (int, "--nproc-per-node"),
    "nnodes": (str, "--nnodes"),              # "2" or an elastic range "1:4"
    "node_rank": (int, "--node-rank"),
    "master_addr": (str, "--master-addr"),
    "master_port": (int, "--master-port"),
    "rdzv_backend": (str, "--rdzv-backend"),
    "rdzv_endpoint": (str, "--rdzv-endpoint"),
    "rdzv_id": (str, "--rdzv-id"),
    "max_restarts": (int, "--max-restarts"),
    "monitor_interval": (float, "--monitor-interval"),
}
PYTHONS = ("python", "python3")


class TorchrunError(ValueError):
    """A torchrun block that cannot be turned into an argv; the message names the key."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def check_spec(spec: Any, literal_only: bool = True) -> None:
    """Raises TorchrunError for an unknown key or a value of the wrong kind. Templated
    values ({{ ... }}) are checked after rendering (literal_only)."""
    if not isinstance(spec, dict):
        raise TorchrunError("", "torchrun must be a mapping of torchrun options "
                                "(nproc_per_node: N, master_port: P, ...)")
    if "nproc_per_node" not in spec:
        raise TorchrunError("", "torchrun needs nproc_per_node (the number of ranks on this node)")
    for key, value in spec.items():
        if key not in OPTIONS:
            raise TorchrunError(key, f"unknown torchrun option {key!r}; known: {', '.join(OPTIONS)}")
        if literal_only and isinstance(value, str) and "{{" in value:
            continue
        _convert(key, value)


def _convert(key: str, value: Any):
    kind = OPTIONS[key][0]
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise TorchrunError(key, f"torchrun {key} must be {kind.__name__}, not {value!r}")
    try:
        converted = kind(value)
    except (TypeError, ValueError):
        raise TorchrunError(key, f"torchrun {key} must be {kind.__name__}, not {value!r}") from None
    if kind is int and (converted < 0 or (key == "nproc_per_node" and converted < 1)):
        raise TorchrunError(key, f"torchrun {key} must be a positive number, not {value!r}")
    return converted


def build_argv(spec: dict, command: list[str], run_dir: str) -> list[str]:
    """torchrun's argv for command (an argv list). A leading python runs torchrun itself
    (`python -m torch.distributed.run`); `python -m module` becomes `--module module`; any
    other program runs with `--no-python`."""
    check_spec(spec, literal_only=False)
    if not command:
        raise TorchrunError("command", "the command under torchrun is empty")
    first = command[0]
    python, rest, mode = "python", list(command), []
    if os.path.basename(first).startswith(PYTHONS):
        python, rest = first, list(command[1:])
        if rest[:1] == ["-m"] and len(rest) >= 2:
            mode, rest = ["--module"], rest[1:]
        elif not rest:
            raise TorchrunError("command", f"{first} needs a script to run under torchrun")
    else:
        mode = ["--no-python"]
    options: list[str] = []
    for key, value in spec.items():
        options += [OPTIONS[key][1], _text(_convert(key, value))]
    logs = ["--log-dir", f"{run_dir.rstrip('/')}/{RANK_LOG_DIR}", "--redirects", "3"]
    return [python, "-m", "torch.distributed.run", *options, *logs, *mode, *rest]


def _text(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def ranks(spec: dict) -> int:
    """How many ranks this node starts."""
    return int(_convert("nproc_per_node", spec["nproc_per_node"]))
