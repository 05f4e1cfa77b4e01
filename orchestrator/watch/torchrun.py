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
from typing import Any, Optional

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
    "rdzv_conf": (str, "--rdzv-conf"),        # key=value,...: is_host=1, join_timeout=600
    "local_addr": (str, "--local-addr"),      # the address the other nodes reach this one at
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


# ------------------------------------------------------------------ one run over many nodes
# A torchrun block whose nnodes is more than one node makes its launch span the run's
# targets: each target is a node (in the run's order), orch gives each its node rank, the
# same c10d rendezvous (endpoint and id) and SkyPilot's names for the nodes
# (docs/guide/multi-node.md). What orch sets, the user may not set by hand.
GROUP_SET_BY_ORCH = ("node_rank", "master_addr", "master_port", "local_addr")
RDZV_BACKEND = "c10d"


def node_range(spec: Any) -> Optional[tuple[int, int]]:
    """(min, max) nodes of a literal nnodes ("2", 2 or "1:4"); None when the block runs on
    one node (no nnodes, nnodes 1) or nnodes is templated (decided after rendering)."""
    if not isinstance(spec, dict) or spec.get("nnodes") is None:
        return None
    value = spec["nnodes"]
    if isinstance(value, str) and "{{" in value:
        return None
    low, high = parse_nnodes(value)
    return None if high == 1 else (low, high)


def parse_nnodes(value: Any) -> tuple[int, int]:
    """nnodes as torchrun reads it: N, or an elastic MIN:MAX."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TorchrunError("nnodes", f"torchrun nnodes must be a number or MIN:MAX, not {value!r}")
    text = str(value).strip()
    low_text, _, high_text = text.partition(":")
    try:
        low, high = int(low_text), int(high_text or low_text)
    except ValueError:
        raise TorchrunError("nnodes", f"torchrun nnodes must be a number or MIN:MAX, not {value!r}") from None
    if low < 1 or high < low:
        raise TorchrunError("nnodes", f"torchrun nnodes {text!r}: need 1 <= MIN <= MAX")
    return low, high


def check_group_spec(spec: dict) -> None:
    """The keys a launch over many nodes leaves to orch (one node rank per node, the c10d
    rendezvous in place of a master address)."""
    for key in GROUP_SET_BY_ORCH:
        if key in spec:
            raise TorchrunError(key, f"torchrun {key} is set by orch when nnodes spans the run's "
                                     f"targets (each target is a node, ranked in the run's order); "
                                     f"leave it out")
    backend = spec.get("rdzv_backend", RDZV_BACKEND)
    if backend != RDZV_BACKEND and not (isinstance(backend, str) and "{{" in backend):
        raise TorchrunError("rdzv_backend", f"a launch over many nodes uses the c10d rendezvous; "
                                            f"rdzv_backend {backend!r} is not supported here")


def check_fits(spec: dict, nodes: list[str]) -> None:
    """nnodes against the run's targets: a fixed N needs N targets; MIN:MAX at least MIN and
    at most MAX (orch starts one node per target)."""
    low, high = parse_nnodes(spec["nnodes"])
    count = len(nodes)
    if not low <= count <= high:
        wanted = str(low) if low == high else f"{low} to {high}"
        raise TorchrunError("nnodes", f"torchrun nnodes {spec['nnodes']} does not fit the run's "
                                      f"{count} target{'s' if count != 1 else ''} "
                                      f"({', '.join(nodes)}): each target is one node, so give "
                                      f"{wanted} targets")


def node_spec(spec: dict, endpoint: str, run_id: str, hosts_store=None,
              address: Optional[str] = None) -> dict:
    """One node's torchrun options: the user's, plus the shared rendezvous and its address
    (no --node-rank: the c10d rendezvous ranks the nodes itself, and torchrun warns that
    it ignores one; c10d_node_rank says which rank). Both stand in for host names: torchrun tells the workers
    the first node's host name as MASTER_ADDR unless --local-addr says otherwise, and guesses
    which node hosts the c10d store from its host name (hosts_store, True/False where orch
    chose the endpoint on the first node, decides it). A container's name need not resolve on
    the other nodes, and often resolves to 127.0.1.1 on its own (Debian's /etc/hosts)."""
    out = {k: v for k, v in spec.items() if k not in GROUP_SET_BY_ORCH}
    out.update(rdzv_backend=RDZV_BACKEND, rdzv_endpoint=endpoint)
    if address:
        out["local_addr"] = address
    out.setdefault("rdzv_id", run_id)
    out.setdefault("max_restarts", 0)
    if hosts_store is not None and "is_host" not in str(out.get("rdzv_conf", "")):
        conf = [part for part in str(out.get("rdzv_conf") or "").split(",") if part]
        out["rdzv_conf"] = ",".join([*conf, f"is_host={'1' if hosts_store else '0'}"])
    return out


def c10d_node_rank(addresses: list[str], index: int) -> int:
    """The node rank torchrun's c10d rendezvous gives the node at addresses[index] (its
    --local-addr): the rendezvous sorts its participants by (address, pid, id) and numbers
    them in that order (torch 2.13, elastic/rendezvous/dynamic_rendezvous.py
    _mark_rendezvous_complete). Its workers' global ranks start at node rank x nproc."""
    return sorted(addresses).index(addresses[index])


def skypilot_env(addresses: list[str], node_rank: int, gpus_per_node: int) -> dict[str, str]:
    """The names SkyPilot gives a multi-node task, so scripts written for it run unchanged
    (https://docs.skypilot.co/en/stable/running-jobs/environment-variables.html): the nodes'
    addresses one a line, the head node (rank 0) first."""
    return {"SKYPILOT_NODE_IPS": "\n".join(addresses), "SKYPILOT_NODE_RANK": str(node_rank),
            "SKYPILOT_NUM_NODES": str(len(addresses)),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus_per_node)}
