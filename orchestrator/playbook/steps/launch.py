"""launch: start the training command DETACHED in the target (its own session, pid file,
exit-code file, log file), so it survives an SSH drop and the controller's exit.

With `torchrun: {nproc_per_node: N, ...}` the command runs under torchrun with one log per
rank (orchestrator/watch/torchrun.py), which the monitor step follows. With an nnodes of
more than one node the launch spans the run's targets, one node each (ranked in the run's
order): pre-flight first, then torchrun on every node with its node rank, one c10d
rendezvous and SkyPilot's names for the nodes (docs/guide/multi-node.md).

The environment gets CUDA_VISIBLE_DEVICES from the inventory's gpus (or the step's gpus:),
the inventory's env, the venv's bin on PATH, then the step's env: (which wins).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional

from orchestrator.watch import torchrun
from orchestrator.config.yamlsrc import Loc
from orchestrator.ground.errors import OrchError
from orchestrator.playbook.model import Playbook, StepSpec
from orchestrator.remote.payload_api import REMOTE_ROOT, free_port, launcher, stop_run
from orchestrator.targets.addresses import container_address
from orchestrator.targets.fleet import each_concurrently
from orchestrator.targets.preflight import failures, preflight, render_preflight
from orchestrator.runs.recorder import SECRET_NAME
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome
from orchestrator.playbook.steps.shell import flatten

class LaunchStep(Step):
    kind = "launch"
    summary = "start the training command detached (setsid, pid/exit/log files)"
    shorthand = "command"
    params = {
        "command": Param((list,), required=True, items=(str, int, float, list),
                         doc="the command as an argv list"),
        "env": Param((dict,), default={}, doc="variables for the trainer; never in an argv (secrets "
                                                "travel with the launcher on stdin, masked in records)"),
        "cwd": Param((str,), doc="working directory (default: the run directory)"),
        "gpus": Param((list,), items=(int,), doc="GPU indices (default: the inventory's gpus)"),
        "venv": Param((str, bool), doc="venv to activate (default: the target's; false: none)"),
        "run_dir": Param((str,), doc=f"where pid/exit/log files live (default: {REMOTE_ROOT}/RUN_ID/NAME)"),
        "torchrun": Param((dict,), doc="run the command under torchrun, one log per rank: "
                                       "{nproc_per_node: N, master_port: P, nnodes, node_rank, "
                                       "master_addr, rdzv_backend, rdzv_endpoint, rdzv_id, max_restarts}; "
                                       "nnodes N or MIN:MAX over the run's targets: one node each "
                                       "(docs/guide/multi-node.md)"),
    }

    def check(self, params: dict, loc: Loc) -> None:
        spec = params.get("torchrun")
        if spec is not None and not (isinstance(spec, str) and "{{" in spec):
            try:
                torchrun.check_spec(spec)
                if torchrun.node_range(spec) is not None:
                    torchrun.check_group_spec(spec)
            except torchrun.TorchrunError as error:
                where = loc.child("torchrun")
                if not error.key:
                    raise where.error(str(error)) from None
                unknown = error.key not in torchrun.OPTIONS
                raise where.child(error.key).error(str(error), key=unknown) from None

    def spans_nodes(self, playbook: Playbook, spec: StepSpec) -> bool:
        return spans_nodes(spec)

    def check_nodes(self, spec: StepSpec, nodes: list[str]) -> None:
        try:
            torchrun.check_fits(spec.params["torchrun"], nodes)
        except torchrun.TorchrunError as error:
            raise spec.params_loc.child("torchrun").child("nnodes").error(str(error)) from None

    def _prepare(self, ctx: StepContext, params: dict, target=None,
                 node: Optional["NodePlace"] = None) -> dict:
        argv = [str(part) for part in flatten(params["command"])]
        if not argv:
            raise StepFailed("launch: the command is empty")
        target = target or ctx.target
        gpus = params["gpus"] if params["gpus"] is not None else target.gpus
        env = dict(target.env)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        spec = params["torchrun"]
        if node is not None:
            # SkyPilot's names first: the inventory's and the step's env may still set them
            gpus_per_node = len(gpus) if gpus else torchrun.ranks(spec)
            env = {**torchrun.skypilot_env(node.addresses, node.rank, gpus_per_node), **env}
            hosts_store = (node.rank == 0) if node.orch_endpoint else None
            spec = torchrun.node_spec(spec, node.endpoint, ctx.run_id, hosts_store,
                                      node.addresses[node.rank])
        env.update({str(k): str(v) for k, v in (params["env"] or {}).items()})
        venv = params["venv"]
        if venv is None or venv is True:
            venv = target.venv
        elif venv is False:
            venv = None
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", ctx.spec.name or f"launch{ctx.spec.index + 1}").strip("-.")
        run_dir = params["run_dir"] or f"{target.state_dir()}/runs/{ctx.run_id}/{slug or 'launch'}"
        prepared = {"argv": argv, "env": env, "venv": venv, "cwd": params["cwd"], "run_dir": run_dir}
        if spec is not None:
            try:
                prepared["argv"] = torchrun.build_argv(spec, argv, run_dir)
            except torchrun.TorchrunError as error:
                raise StepFailed(f"launch: {error}") from None
            prepared["ranks"] = torchrun.ranks(spec)
        return prepared

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        if ctx.nodes:
            return self._plan_nodes(ctx, params)
        return self._plan_one(ctx, params)

    def _plan_nodes(self, ctx: StepContext, params: dict) -> list[str]:
        """Nothing is asked of the nodes in a dry run: their addresses and the port are named."""
        addresses = [f"<{node.name}'s address>" for node in ctx.nodes]
        endpoint = params["torchrun"].get("rdzv_endpoint") or f"{addresses[0]}:<a free port>"
        lines = [f"pre-flight on {len(ctx.nodes)} nodes ({', '.join(n.name for n in ctx.nodes)}); "
                 f"then torchrun on each, c10d rendezvous at {endpoint}, id {ctx.run_id}"]
        for rank, node in enumerate(ctx.nodes):
            place = NodePlace(rank, addresses, endpoint, not params["torchrun"].get("rdzv_endpoint"))
            lines += [f"node {rank}: {node.name}"] + self._plan_one(ctx, params, node, place)
        return lines

    def _plan_one(self, ctx: StepContext, params: dict, target=None,
                  node: Optional["NodePlace"] = None) -> list[str]:
        p = self._prepare(ctx, params, target, node)
        env = " ".join(f"{k}={'***' if SECRET_NAME.search(k) else shlex.quote(v)}"
                       for k, v in p["env"].items())
        return [f"detached in {p['run_dir']} (setsid; log output.log, pid.json, exit.json)"
                + (f", venv {p['venv']}" if p["venv"] else "")
                + (f"; {p['ranks']} ranks under torchrun, their logs in {p['run_dir']}/"
                   f"{torchrun.RANK_LOG_DIR}/" if "ranks" in p else ""),
                (env + " " if env else "") + shlex.join(p["argv"])]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        if ctx.nodes:
            return self._run_nodes(ctx, params)
        launch = self._start(ctx, params)
        gpus = launch.get("cuda_visible_devices")
        return StepOutcome(status="changed",
                           message=f"pid {launch['pid']} in {launch['run_dir']}"
                                   + (f" (CUDA_VISIBLE_DEVICES={gpus})" if gpus else ""),
                           data=launch)

    def _run_nodes(self, ctx: StepContext, params: dict) -> StepOutcome:
        """torchrun on every node, detached, after a pre-flight of all of them: nothing is
        launched unless every node passed, and a node that fails to start stops the others."""
        nodes = ctx.nodes
        env = {**nodes[0].env, **{str(k): str(v) for k, v in (params["env"] or {}).items()}}
        interface = _interface(env)
        try:
            addresses = [node_address(ctx.run, node, interface) for node in nodes]
            endpoint = params["torchrun"].get("rdzv_endpoint") or \
                f"{_host_part(addresses[0])}:{free_port(nodes[0])}"
            self._preflight(ctx, nodes, endpoint, env)
        except OrchError as error:
            raise StepFailed(f"launch: nothing was launched: {error}"
                             + (f" ({error.hint})" if getattr(error, "hint", "") else "")) from None
        chosen = not params["torchrun"].get("rdzv_endpoint")
        places = [NodePlace(rank, addresses, endpoint, chosen) for rank in range(len(nodes))]
        started = each_concurrently(list(zip(nodes, places)),
                                    lambda pair: self._start(ctx, params, *pair))
        failed = {node.name: error for node, error in zip(nodes, started) if isinstance(error, OrchError)}
        if failed:
            for node, launch in zip(nodes, started):
                if isinstance(launch, dict):       # no rank may wait for nodes that never came
                    _stop_quietly(node, launch["run_dir"])
            raise StepFailed("launch: " + "; ".join(f"{name}: {error}" for name, error in failed.items())
                             + f"; the other nodes were stopped")
        launches = {node.name: launch for node, launch in zip(nodes, started)}
        head = launches[nodes[0].name]
        return StepOutcome(status="changed", data={**head, "nodes": launches},
                           message=f"torchrun on {len(nodes)} nodes, rendezvous {endpoint} "
                                   f"(id {head['rdzv_id']}): "
                                   + ", ".join(f"{name} pid {launch['pid']}"
                                               for name, launch in launches.items()))

    @staticmethod
    def _preflight(ctx: StepContext, nodes: list, endpoint: str, env: dict) -> None:
        """Every node checked before anything starts (targets/preflight.py): the rendezvous
        reachable from each, one torch and patch state, free GPUs, /dev/shm, the interface."""
        host, _, port = endpoint.rpartition(":")
        try:
            where = (host.strip("[]"), int(port))
        except ValueError:
            raise StepFailed(f"launch: the rendezvous endpoint {endpoint!r} is not HOST:PORT") from None
        rows = preflight(nodes, where, gpus_per_node=max(len(node.gpus) for node in nodes),
                         socket_ifnames={k: env[k] for k in SOCKET_IFNAMES if k in env})
        for line in render_preflight(rows).splitlines():
            ctx.output(line)
        failed = failures(rows)
        if failed:
            raise StepFailed("launch: pre-flight failed, nothing was launched: "
                             + "; ".join(f"{row.node}: {row.check}: {row.detail}"
                                         + (f" (fix: {row.fix})" if row.fix else "") for row in failed),
                             data={"preflight": [row.__dict__ for row in rows]})

    def _start(self, ctx: StepContext, params: dict, target=None,
               node: Optional["NodePlace"] = None) -> dict:
        """One launch, on ctx.target or on one node of a launch over many: its record entry."""
        p = self._prepare(ctx, params, target, node)
        target = target or ctx.target
        venv = target.expand(p["venv"]) if p["venv"] else None
        # A leading ~ as a shell would expand it (there is no shell in between).
        p["argv"] = [target.expand(arg) if arg == "~" or arg.startswith("~/") else arg
                     for arg in p["argv"]]
        ctx.recorder.note_launch_starting(target, p["run_dir"])   # a Ctrl-C from here on asks
        result = launcher(target, "start", p["run_dir"], timeout=ctx.remaining(120),
                          argv=p["argv"], env=p["env"], venv=venv, cwd=p["cwd"])
        launch = {"run_dir": result.get("run_dir", p["run_dir"]), "pid": result.get("pid"),
                  "log": result.get("log"), "step": ctx.spec.index, "step_name": ctx.spec.label(),
                  "argv": p["argv"], "env_keys": sorted(p["env"]), "started_at": result.get("started_at"),
                  # the device layout, part of the run's shape (runs/baseline.py)
                  "cuda_visible_devices": p["env"].get("CUDA_VISIBLE_DEVICES"),
                  "host": target.host.name, "vmid": target.vmid}
        if "ranks" in p:
            # the monitor step follows every rank's log, and calls its workers ranks
            launch.update(ranks=p["ranks"], logs=list(torchrun.RANK_LOGS), workers="rank")
        if node is not None:
            # what follows, stops and reports the job as one needs: its nodes, in rank order
            # node_rank: the rank c10d gives the node (the global ranks follow it), not its place
            launch.update(node_rank=torchrun.c10d_node_rank(node.addresses, node.rank),
                          nodes=[n.name for n in ctx.nodes],
                          address=node.addresses[node.rank], rdzv_endpoint=node.endpoint,
                          rdzv_id=str(params["torchrun"].get("rdzv_id") or ctx.run_id))
        ctx.recorder.note_launch(target.name, launch)
        return launch


@dataclass
class NodePlace:
    """One node's place in a launch over many: its rank, every node's address, the rendezvous."""
    rank: int
    addresses: list
    endpoint: str
    orch_endpoint: bool = True      # orch chose it (the first node's): the first node hosts the store


def spans_nodes(spec: StepSpec) -> bool:
    """A launch whose literal torchrun nnodes is more than one node."""
    params = spec.params if isinstance(spec.params, dict) else {}
    try:
        return torchrun.node_range(params.get("torchrun")) is not None
    except torchrun.TorchrunError:
        return False          # the loader reported it already


def _host_part(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _stop_quietly(target, run_dir: str) -> None:
    try:
        stop_run(target, run_dir, grace=5.0, reason="another node failed to start")
    except OrchError:
        pass     # the launch failure is what the user reads; this node's stop is best effort


SOCKET_IFNAMES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _interface(env: dict) -> Optional[str]:
    """The interface the nodes meet on, where the environment names exactly one (eth1;
    not NCCL's prefixes and exclusions like ^docker or eth0,eth1)."""
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = env.get(key, "")
        if value and re.fullmatch(r"[A-Za-z0-9_.@-]+", value):
            return value
    return None


def node_address(run, target, interface: Optional[str] = None) -> str:
    """Where the other nodes reach a node: the inventory's address:, else the Proxmox API's
    interfaces of the container (targets/addresses.py)."""
    if run.fleet is None:              # a step run on its own (tests): the inventory only
        spec = run.inventory.containers.get(target.name) if run.inventory is not None else None
        if spec is None or not spec.address:
            raise OrchError(f"{target.name}: no address known for it",
                            hint="give the container an address: in the inventory")
        return spec.address
    return container_address(run.fleet, target, interface)
