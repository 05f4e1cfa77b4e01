"""Pre-flight of a multi-node run: what must hold on every node before anything is launched.

    rows = preflight(nodes, ("10.88.1.200", 29500),
                     socket_ifnames={"GLOO_SOCKET_IFNAME": "eth0"}, gpus_per_node=0)
    print(render_preflight(rows)); failed = failures(rows)

In seconds, concurrently per node (docs/design/multinode-preflight.md):
- the rendezvous endpoint: a payload listens on its port and address in the first node
  (the node whose address the endpoint is, by default) for the duration of the check, and
  every node's payload connects to it, sends its own one-time nonce and reads a one-time
  token back, so the answer is proven to be ours and only the nodes count as arrived; a
  port already taken there is its own error;
- the same torch version and FX thread-safety patch state everywhere (the fx_patch
  payload's `status`, the machinery `orch patch` uses); a mismatch names the nodes;
- enough free GPUs (nvidia-smi; without it a CPU run gets a "no GPU check" note);
- /dev/shm at least `shm_min_bytes`;
- the interface NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names exists in the container.
Every failure row says which node, what, and the fix. The payloads only measure; the
judging is here, in pure functions the unit tests call with the payloads' shapes.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from orchestrator.ground.errors import BadArgument, OrchError, PayloadError
from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.targets.fleet import each_concurrently

DEFAULT_SHM_MIN_BYTES = 1 << 30   # NCCL's shared-memory transport and DataLoader workers
DEFAULT_PATCH_SET = "fx-threads"  # what the monitor step checks too
FREE_GPU_MEMORY_MIB = 1024        # a GPU using more than this is taken by something else
LISTEN_READY_S = 20.0             # SSH + pct exec + python start on a busy host
STOP_WAIT_S = 5.0
UNPATCHED = ("vulnerable", "drifted")
OK, FAIL, NOTE = "ok", "fail", "note"


@dataclass(frozen=True)
class PreflightRow:
    node: str            # the target's name
    check: str           # endpoint, torch, fx-patch, gpus, shm, interface
    status: str          # ok, fail, note (ok, but worth saying)
    detail: str          # what was found
    fix: str = ""        # for a failure: what to do

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass
class _Measured:
    """One node's payload results, or the OrchError each raised."""
    check: object
    patch: object


# ------------------------------------------------------------------ the check
def preflight(nodes: Sequence[Target], endpoint: tuple[str, int], *,
              socket_ifnames: Optional[Mapping[str, str]] = None, gpus_per_node: int = 0,
              shm_min_bytes: int = DEFAULT_SHM_MIN_BYTES, patch_set: str = DEFAULT_PATCH_SET,
              require_patch: bool = False, connect_timeout: float = 3.0) -> list[PreflightRow]:
    """Check every node (the first one hosts the endpoint); rows in node order, then the
    cross-node comparisons. Nothing is left listening when it returns."""
    if not nodes:
        raise BadArgument("a multi-node pre-flight needs at least one node")
    host, port = endpoint
    token = secrets.token_hex(8)
    # one nonce a node: the listener counts a node once it sent its own, so connections of
    # anything else on the way (a scanner, another account) take no node's place
    nonces = {node.name: secrets.token_hex(16) for node in nodes}
    listener = _Listener(nodes[0], host, port, token, nonces.values(),
                         seconds=LISTEN_READY_S + payload_api.PREFLIGHT_TIMEOUT + connect_timeout)
    try:
        listening = listener.start()
        measured = each_concurrently(list(nodes), lambda node: _measure(
            node, host, port, token, nonces[node.name], connect_timeout, patch_set,
            connect=listening is None))
    finally:
        listener.stop()
    rows: list[PreflightRow] = []
    if listening is not None:
        rows.append(listening)
    for node, outcome in zip(nodes, measured):
        if isinstance(outcome, OrchError):      # _measure keeps its errors: not expected
            rows.append(PreflightRow(node.name, "payload", FAIL, str(outcome)))
            continue
        rows += node_rows(node, outcome.check, endpoint, nodes[0].name,
                          endpoint_checked=listening is None, socket_ifnames=socket_ifnames or {},
                          gpus_per_node=gpus_per_node, shm_min_bytes=shm_min_bytes)
    patches = {node.name: outcome.patch for node, outcome in zip(nodes, measured)
               if not isinstance(outcome, OrchError)}
    rows += torch_rows(patches, patch_set, require_patch)
    return rows


def failures(rows: Sequence[PreflightRow]) -> list[PreflightRow]:
    return [row for row in rows if row.failed]


def _measure(node: Target, host: str, port: int, token: str, nonce: str,
             connect_timeout: float, patch_set: str, connect: bool) -> _Measured:
    """The node's measurements first (the listener waits for its connection; no connect
    when nothing of ours listens), then its torch's patch status."""
    return _Measured(
        check=_caught(lambda: payload_api.preflight_check(
            node, host, port, token, nonce=nonce, connect_timeout=connect_timeout,
            gpus=node.gpus, connect=connect)),
        patch=_caught(lambda: payload_api.fx_patch(node, "status", patch_set=patch_set)))


def _caught(work):
    try:
        return work()
    except OrchError as error:
        return error


class _Listener:
    """The listener payload on the endpoint's node, on a channel of its own."""

    def __init__(self, node: Target, host: str, port: int, token: str, nonces, seconds: float):
        self.node, self.host, self.port, self.token = node, host, port, token
        self.nonce_hashes = [hashlib.sha256(n.encode()).hexdigest() for n in nonces]
        self.seconds = seconds
        self.process = None

    def start(self) -> Optional[PreflightRow]:
        """None once it listens; else the failure row (the port taken, no python)."""
        try:
            self.process = payload_api.preflight_listener(
                self.node, self.host, self.port, self.token, self.nonce_hashes, self.seconds)
            event = self._next_event(LISTEN_READY_S)
        except OrchError as error:
            return self._failed(str(error))
        if event and event.get("event") == "listening":
            return None
        if event and event.get("kind") == "port-taken":
            return PreflightRow(
                self.node.name, "endpoint", FAIL,
                f"the rendezvous port {self.port} is already in use in {self.node.name}",
                fix=f"stop what listens there (`orch exec {self.node.name} -- ss -ltnp`) or "
                    "give the run another rendezvous port")
        return self._failed((event or {}).get("message")
                            or f"no answer within {LISTEN_READY_S:g} s")

    def _failed(self, why: str) -> PreflightRow:
        return PreflightRow(self.node.name, "endpoint", FAIL,
                            f"could not listen on the rendezvous port {self.port}: {why}",
                            fix="check that the container runs and has python3")

    def _next_event(self, timeout: float) -> Optional[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.process.readline(max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                return None
            if not line:
                return None
            event = payload_api.parse_event(line)
            if event is not None:
                return event
        return None

    def stop(self) -> None:
        """Let go of the port (a line on its stdin), wait for its result, close."""
        if self.process is None:
            return
        try:
            self.process.write(b"stop\n")
            deadline = time.monotonic() + STOP_WAIT_S
            while time.monotonic() < deadline:
                event = self._next_event(deadline - time.monotonic())
                if event is None or event.get("event") in ("result", "error"):
                    break
        except (OrchError, OSError):
            pass     # it ended by itself already (every node connected): its channel closed
        finally:
            self.process.close()
            self.process = None


# ------------------------------------------------------------------ judging one node
def node_rows(node: Target, check, endpoint: tuple[str, int], listener: str, *,
              endpoint_checked: bool = True, socket_ifnames: Mapping[str, str],
              gpus_per_node: int, shm_min_bytes: int) -> list[PreflightRow]:
    """The rows of one node from its check payload's result (or the error it raised)."""
    if isinstance(check, OrchError):
        return [PreflightRow(node.name, "payload", FAIL, f"the pre-flight payload failed: "
                             f"{check}", fix=check.hint or "")]
    rows = []
    if endpoint_checked:
        rows.append(endpoint_row(node.name, check.get("endpoint"), endpoint, listener))
    rows.append(shm_row(node.name, check.get("shm"), shm_min_bytes))
    rows += interface_rows(node.name, check.get("interfaces"), socket_ifnames)
    rows.append(gpu_row(node.name, check.get("gpus"), gpus_per_node))
    return rows


def endpoint_row(node: str, reached, endpoint: tuple[str, int], listener: str) -> PreflightRow:
    host, port = endpoint
    where = _host_port(host, port)
    if isinstance(reached, dict) and reached.get("ok") is True:
        return PreflightRow(node, "endpoint", OK, f"reaches {where} ({reached.get('seconds')} s)")
    why = reached.get("error") if isinstance(reached, dict) else "no answer"
    return PreflightRow(node, "endpoint", FAIL, f"cannot reach the rendezvous endpoint {where} "
                        f"(listened on in {listener}): {_short(why)}",
                        fix=f"let TCP port {port} through to {listener} (the Proxmox firewall, "
                            f"the container's own, the hosts' network between them), or give "
                            f"the run an endpoint every node reaches")


def shm_row(node: str, shm, minimum: int) -> PreflightRow:
    if not isinstance(shm, dict) or not isinstance(shm.get("total_bytes"), int):
        why = shm.get("error") if isinstance(shm, dict) else "no answer"
        return PreflightRow(node, "shm", FAIL, f"/dev/shm cannot be read: {_short(why)}",
                            fix="give the container a /dev/shm (a tmpfs)")
    total = shm["total_bytes"]
    if total >= minimum:
        return PreflightRow(node, "shm", OK, f"/dev/shm {_size(total)}")
    return PreflightRow(node, "shm", FAIL, f"/dev/shm is {_size(total)}, below the "
                        f"{_size(minimum)} the run wants",
                        fix="give the container a larger /dev/shm (on Proxmox: "
                            "`lxc.mount.entry: tmpfs dev/shm tmpfs size=16G,nosuid,nodev,"
                            "create=dir 0 0` in /etc/pve/lxc/VMID.conf), or NCCL_SHM_DISABLE=1")


def interface_rows(node: str, names, wanted: Mapping[str, str]) -> list[PreflightRow]:
    names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    rows = []
    for variable, value in wanted.items():
        matched = interfaces_matching(variable, value, names)
        if matched:
            rows.append(PreflightRow(node, "interface", OK,
                                     f"{variable}={value}: {', '.join(matched)}"))
            continue
        rows.append(PreflightRow(node, "interface", FAIL,
                                 f"{variable}={value} names no interface of the container "
                                 f"(it has {', '.join(names) or 'none'})",
                                 fix=f"set {variable} to one of them in the run's env "
                                     f"(the one other nodes reach it on, e.g. eth0)"))
    return rows


def interfaces_matching(variable: str, value: str, names: Sequence[str]) -> list[str]:
    """The interfaces `value` selects, as the library reading `variable` does: NCCL takes
    prefixes (`eth` is eth0, eth1), `=NAME` for exact names and `^...` to exclude; gloo
    (and any other variable) exact names. Both separate several with commas."""
    if variable.startswith("NCCL_"):
        exclude = value.startswith("^")
        body = value[1:] if exclude else value
        exact = body.startswith("=")
        wanted = [part for part in (body[1:] if exact else body).split(",") if part]

        def selected(name: str) -> bool:
            return name in wanted if exact else any(name.startswith(p) for p in wanted)
        return [name for name in names if selected(name) != exclude and
                not (exclude and name == "lo")]
    wanted = [part for part in value.split(",") if part]
    return [name for name in names if name in wanted]


def gpu_row(node: str, gpus, wanted: int) -> PreflightRow:
    if gpus is None:
        if wanted:
            return PreflightRow(node, "gpus", FAIL, f"no nvidia-smi in the container; the run "
                                f"wants {wanted} GPU(s) per node",
                                fix="give the container its GPUs (and nvidia-smi), or run on CPU")
        return PreflightRow(node, "gpus", NOTE, "no GPU check (no nvidia-smi; the run asks "
                                                "for no GPUs)")
    if not isinstance(gpus, list):
        why = gpus.get("error") if isinstance(gpus, dict) else "no answer"
        status = FAIL if wanted else NOTE
        return PreflightRow(node, "gpus", status, f"nvidia-smi failed: {_short(why)}",
                            fix="check the driver in the container (`nvidia-smi`)" if wanted else "")
    rows = [g for g in gpus if isinstance(g, dict) and isinstance(g.get("index"), int)]
    busy = [g for g in rows if (g.get("memory_used_mib") or 0) > FREE_GPU_MEMORY_MIB]
    free = len(rows) - len(busy)
    taken = ", ".join(f"GPU {g['index']}: {g.get('memory_used_mib'):g} MiB used" for g in busy)
    detail = f"{free} of {len(rows)} GPU(s) free" + (f" ({taken})" if taken else "")
    if free >= wanted:
        return PreflightRow(node, "gpus", OK, detail + (f", {wanted} wanted" if wanted else ""))
    return PreflightRow(node, "gpus", FAIL, f"{detail}; the run wants {wanted} per node",
                        fix="free them (`nvidia-smi` in the container shows what holds them) "
                            "or lower --nproc-per-node")


# ------------------------------------------------------------------ judging across nodes
def torch_rows(patches: Mapping[str, object], patch_set: str,
               require_patch: bool = False) -> list[PreflightRow]:
    """torch version and patch state, node by node and compared across the nodes; `patches`
    maps each node to its fx_patch status result (or the error it raised)."""
    rows, versions, states = [], {}, {}
    for node, result in patches.items():
        if isinstance(result, OrchError):
            rows.append(_torch_missing(node, result))
            continue
        versions[node] = str(result.get("torch_version"))
        states[node] = str(result.get("status"))
    rows += _compare(versions, "torch", "torch",
                     lambda value, others: f"install torch {others} on every node (or this "
                                           f"one's {value} on the others): ranks of different "
                                           "releases cannot train together")
    rows += _compare(states, "fx-patch", f"{patch_set} patch",
                     lambda value, others: f"`orch patch {patch_set} apply` (or revert) so "
                                           "every node is the same")
    if require_patch:
        rows += [PreflightRow(node, "fx-patch", FAIL, f"{patch_set} patch state is {state}",
                              fix=f"orch patch {patch_set} apply -t {node}")
                 for node, state in states.items() if state in UNPATCHED]
    return rows


def _torch_missing(node: str, error: OrchError) -> PreflightRow:
    if isinstance(error, PayloadError) and error.kind == "not-installed":
        return PreflightRow(node, "torch", FAIL, "no torch in the node's venv",
                            fix="install torch there (a bootstrap step, or the inventory's venv:)")
    return PreflightRow(node, "torch", FAIL, f"torch's patch status could not be read: {error}",
                        fix=error.hint or "")


def _compare(values: Mapping[str, str], check: str, what: str, fix) -> list[PreflightRow]:
    """One row per node: ok where it has the reference value (the most common one; on a tie
    the first node's), a failure naming the other nodes' values where it differs."""
    if not values:
        return []
    counts = Counter(values.values())
    reference = max(counts, key=lambda v: (counts[v], v == next(iter(values.values()))))
    rows = []
    for node, value in values.items():
        if value == reference:
            rows.append(PreflightRow(node, check, OK, f"{what} {value}"))
            continue
        holders = ", ".join(n for n, v in values.items() if v == reference)
        rows.append(PreflightRow(node, check, FAIL, f"{what} {value} here, {reference} on "
                                 f"{holders}", fix=fix(value, reference)))
    return rows


# ------------------------------------------------------------------ rendering
def render_preflight(rows: Sequence[PreflightRow]) -> str:
    """The rows as a table, node by node, each failure's fix under it, and a verdict line."""
    failed = failures(rows)
    width = max((len(row.node) for row in rows), default=4)
    lines = []
    for row in sorted(rows, key=lambda r: (r.node, _CHECK_ORDER.get(r.check, 99))):
        mark = {OK: "ok", FAIL: "FAIL", NOTE: "note"}.get(row.status, row.status)
        lines.append(f"  {row.node:<{width}}  {mark:<4}  {row.check:<9}  {row.detail}")
        if row.failed and row.fix:
            lines.append(f"  {'':<{width}}  {'':<4}  {'fix:':<9}  {row.fix}")
    nodes = len({row.node for row in rows})
    verdict = (f"pre-flight: {len(failed)} failure(s) on {len({r.node for r in failed})} of "
               f"{nodes} node(s); nothing was launched" if failed else
               f"pre-flight: {nodes} node(s) ready")
    return "\n".join([verdict, *lines])


_CHECK_ORDER = {name: i for i, name in enumerate(
    ("payload", "endpoint", "torch", "fx-patch", "gpus", "shm", "interface"))}


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _short(text, limit: int = 300) -> str:
    """Text from a container, one line and bounded."""
    return " ".join(str(text).split())[:limit]
