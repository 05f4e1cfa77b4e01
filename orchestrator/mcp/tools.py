"""The MCP tools as plain functions over orch's core (no MCP SDK here: server.py adds that).

Each tool resolves its target through the server's one Fleet (one SSH connection per host
for the server's life) and runs in the container through a warm command session
(orchestrator.remote.session): after the first call to a container, a tool call costs a
frame each way on an open channel, not a handshake, a `pct exec` and a new interpreter. Everything else is the function the CLI calls: payload_api.*, engine.run_playbook,
attach.stop_recorded_run, RunStore, runs.compare, inventory_check.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from typing import Any, Optional

from orchestrator.remote import payload_api
from orchestrator.playbook.attach import stop_recorded_run
from orchestrator.config.inventory import ContainerSpec
from orchestrator.playbook.engine import run_playbook
from orchestrator.ground.errors import ConfigError, OrchError, PayloadError
from orchestrator.targets.fleet import Fleet, fan_out
from orchestrator.targets.inventory_check import check_targets
from orchestrator.mcp.outputs import STREAMS, OutputGone, OutputSpool, StreamCapture, whole_utf8
from orchestrator.mcp.policy import (PolicyRefused, refuse_outside, refuse_templates,
                                     refuse_unlisted_vars)
from orchestrator.playbook.loader import check_playbook, load_playbook, normalize_extra_vars
from orchestrator.remote.container import Target
from orchestrator.remote.session import SessionPool, SessionTarget
from orchestrator.runs.compare import DEFAULT_THRESHOLD, compare, is_problem, throughput
from orchestrator.runs.controller import controller_state
from orchestrator.runs.store import RunStore
from orchestrator.forensics.explain import explain_record, launched_targets

MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_OUTPUT_BYTES = 64 << 10
RUN_START_WAIT_S = 120.0


class LiveReporter:
    """What the runner reports, kept for run_status: the current steps and the monitor's
    per-drafter progress. Anything else the runner reports is ignored (a server prints
    nothing: stdout is the protocol)."""

    def __init__(self):
        self.started = threading.Event()
        self.run_id: Optional[str] = None
        self._lock = threading.Lock()
        self._current: dict[str, str] = {}
        self._monitors: dict[str, Any] = {}
        self._status: dict[str, dict] = {}
        self.log_lines = 0

    def run_started(self, runner, targets) -> None:
        self.run_id = runner.run_id
        self.started.set()

    def step_started(self, target: str, spec) -> None:
        with self._lock:
            self._current[target] = spec.label()

    def step_finished(self, target: str, spec, result, outcome) -> None:
        with self._lock:
            self._current.pop(target, None)

    def monitor_progress(self, target: str, snapshot, status: dict) -> None:
        """snapshot: a frozen ProgressSnapshot (watch/classify.py), never the live classifier."""
        with self._lock:
            self._monitors[target] = snapshot
            if status:
                self._status[target] = dict(status)

    def log_line(self, target: str, line: str) -> None:
        self.log_lines += 1

    def __getattr__(self, name):  # step_plan, note, monitor_started, run_finished, ...
        return lambda *args, **kwargs: None

    def progress(self) -> dict:
        with self._lock:
            monitors = dict(self._monitors)
            current = dict(self._current)
            status = dict(self._status)
        targets = {}
        for name in set(monitors) | set(current):
            progress = monitors.get(name)
            # "drafter": the key MCP clients read for a worker since the first release
            drafters = [] if progress is None else [
                {"drafter": w.worker, "step": w.step, "loss": w.loss, "tok_s": w.tok_s,
                 "state": w.status, "error": w.error} for w in progress.workers]
            targets[name] = {"current_step": current.get(name), "drafters": drafters,
                             "state": status.get(name, {}).get("state")}
        return {"targets": targets, "log_lines": self.log_lines}


class LiveRun:
    def __init__(self, reporter: LiveReporter, thread: threading.Thread):
        self.reporter = reporter
        self.thread = thread
        self.record = None
        self.error: Optional[BaseException] = None


class _AppView:
    """What the runner reads of the CLI's App: how the user names the inventory (for the
    remediation commands it prints)."""

    def __init__(self, inventory_option: Optional[str], fleet: Fleet):
        self.inventory_option = inventory_option
        self.trust_on_first_use = fleet.trust_on_first_use
        self.fleet = fleet


class Tools:
    def __init__(self, fleet: Fleet, store: RunStore, inventory_option: Optional[str] = None):
        self.fleet = fleet
        self.store = store
        self.app = _AppView(inventory_option, fleet)
        self.sessions = SessionPool()
        self.runs: dict[str, LiveRun] = {}
        self.outputs = OutputSpool(os.path.dirname(store.path))

    def close(self) -> None:
        self.sessions.close()
        self.fleet.close()
        self.outputs.close()

    # ------------------------------------------------------------------ targets
    def container(self, name: str) -> Target:
        """Exactly one target (a group of several is refused: these tools act on one)."""
        specs = self.fleet.inventory.resolve([name])
        if len(specs) != 1:
            raise ConfigError(f"target {name!r} names {len(specs)} containers; name one",
                              hint="list_targets shows the containers and groups")
        return self.fleet.target(specs[0])

    def warm(self, name: str) -> SessionTarget:
        """The container, its commands run through a warm session of the server's pool."""
        target = self.container(name)
        return SessionTarget(target.name, target.host, target.vmid, target.venv, target.gpus,
                             target.env, sessions=self.sessions)

    def specs(self, names) -> list[ContainerSpec]:
        """What the names resolve to (for the policy: containers, or hosts themselves)."""
        return self.fleet.inventory.resolve(list(names))

    # -------------------------------------------------------------------- tools
    def list_targets(self) -> dict:
        inventory = self.fleet.inventory
        return {
            "inventory": inventory.path,
            "default_target": inventory.default_target,
            "containers": [{"name": c.name, "host": c.host, "vmid": c.vmid, "venv": c.venv,
                            "gpus": list(c.gpus), "description": c.description}
                           for c in inventory.containers.values()],
            "hosts": [{"name": h.name, "transport": h.transport, "address": h.address,
                       "description": h.description} for h in inventory.hosts.values()],
            "groups": {name: list(members) for name, members in inventory.groups.items()},
        }

    def inventory_check(self, targets: list[str]) -> dict:
        """The given targets only (server.py passes the inventory's containers the policy
        allows when the client names none)."""
        rows = check_targets(self.fleet.targets(list(targets))) if targets else []  # the CLI's own check
        return {"ok": all(r["ok"] for r in rows), "rows": rows}

    def exec(self, target: str, argv: list[str], timeout_s: float, stdin: Optional[str],
             max_output_bytes: int) -> dict:
        """The output streams through bounded captures (never held whole): the answer has
        each stream's head, size and stderr's tail; a larger output is spooled for the
        client to page through (outputs.py)."""
        warm = self.warm(target)
        cap = max(0, min(max_output_bytes, MAX_OUTPUT_BYTES))
        output = self.outputs.new_id()
        out, err = (StreamCapture(name, cap, self.outputs, output) for name in STREAMS)
        try:
            result = warm.run(argv, stdin=None if stdin is None else stdin.encode(), timeout=timeout_s,
                              on_stdout=out, on_stderr=err, capture=False)
        except BaseException:
            self.outputs.discard(output)
            raise
        finally:
            out.close()
            err.close()
        self.outputs.finished(output)
        return {"target": warm.name, "argv": list(argv), "exit_code": result.exit_code,
                **out.answer(), **err.answer(with_tail=True),
                "duration_s": round(result.duration, 6), "via": warm.via}

    def output_page(self, output: str, stream: str, offset: int, length: int) -> bytes | str:
        """A page of a spooled exec output: text when it is UTF-8 (cut at a character's
        start, so the next page's offset is this one's plus the text's UTF-8 length), else
        the raw bytes (a blob)."""
        if stream not in STREAMS:
            raise OutputGone(f"no stream {stream!r} (stdout or stderr)")
        data, size = self.outputs.read(output, stream, offset, length)
        data = whole_utf8(data, at_end=offset + len(data) >= size)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data

    def grep_source(self, target: str, pattern: str, **options) -> dict:
        warm = self.warm(target)
        found = payload_api.search(warm, pattern, **options)
        return {"target": warm.name, **{k: v for k, v in found.items() if k != "event"}}

    def read_source(self, target: str, package: str, path: str, start_line: int,
                    end_line: Optional[int], max_bytes: int) -> dict:
        warm = self.warm(target)
        found = payload_api.source_read(warm, package, path, start_line, end_line,
                                        max_bytes=max(1, min(max_bytes, MAX_OUTPUT_BYTES)))
        return {"target": warm.name, **{k: v for k, v in found.items() if k != "event"}}

    def read_file(self, target: str, path: str, offset: int, max_bytes: int,
                  extra_roots=()) -> dict:
        """Bytes of one file under the container's run folders (or a folder the allowance
        adds): text when they are UTF-8 (cut at a character's start; next_offset is where
        the next page starts), else base64; their sha256 checked end to end."""
        warm = self.warm(target)
        roots = [f"{warm.state_dir()}/runs", *extra_roots]
        refuse_outside(path, roots)
        try:
            found = payload_api.file_read(warm, path, roots, max(0, offset),
                                          max(1, min(max_bytes, MAX_OUTPUT_BYTES)))
        except PayloadError as error:
            if error.kind == "outside-allowance":   # the real path leads out: a link
                raise PolicyRefused(str(error)) from None
            raise
        data = found["data"]
        page = whole_utf8(data, at_end=found["eof"])
        try:
            text, encoding = page.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            page, text, encoding = data, base64.b64encode(data).decode("ascii"), "base64"
        return {"target": warm.name, "path": path, "size": found["size"],
                "offset": found["offset"], "next_offset": found["offset"] + len(page),
                "bytes": len(page), "eof": found["offset"] + len(page) >= found["size"],
                "encoding": encoding, "data": text,
                "sha256": hashlib.sha256(page).hexdigest()}

    def fx_tls(self, target: str, action: str) -> dict:
        warm = self.warm(target)
        found = payload_api.fx_patch(warm, action)
        return {"target": warm.name, "action": action, **{k: v for k, v in found.items() if k != "event"}}

    def verify_fx_race(self, target: str, trials: int) -> dict:
        warm = self.warm(target)
        found = payload_api.fx_race(warm, trials)
        return {"target": warm.name, **{k: v for k, v in found.items() if k != "event"}}

    # --------------------------------------------------------------------- runs
    def run_targets(self, playbook: str, variables: dict, targets: list[str]) -> list[ContainerSpec]:
        """What a run_start would touch (the policy checks it first), once the client's vars
        passed: data (one holding template syntax is refused before the playbook is even
        read), only the vars the playbook lists under `mcp: vars:`, and named as -e names
        must be. playbook: the real path the policy allowed (policy.playbook)."""
        refuse_templates(variables)
        book = load_playbook(playbook)
        refuse_unlisted_vars(book, variables)
        check_playbook(book, normalize_extra_vars(dict(variables)))
        if targets:
            return self.specs(targets)
        if not book.targets:
            raise ConfigError(f"{playbook}: the playbook names no targets; give targets")
        return self.specs(book.targets)

    def run_start(self, playbook: str, variables: dict, targets: list[str]) -> dict:
        """Start the playbook in a server thread; return once the run has its id."""
        self.run_targets(playbook, variables, targets)   # server.py checked already: kept here too
        reporter = LiveReporter()
        live = LiveRun(reporter, threading.Thread())

        def work():
            try:
                live.record = run_playbook(playbook, targets=list(targets), extra_vars=dict(variables),
                                           inventory=self.app.inventory_option, reporter=reporter,
                                           store=self.store, fleet=self.fleet)
            except BaseException as error:  # noqa: BLE001 - reported to the caller or by run_status
                live.error = error
            finally:
                reporter.started.set()

        live.thread = threading.Thread(target=work, name="orch-mcp-run", daemon=True)
        live.thread.start()
        if not reporter.started.wait(RUN_START_WAIT_S):
            raise OrchError(f"the run of {playbook} did not start within {RUN_START_WAIT_S:g} s")
        if reporter.run_id is None:
            error = live.error
            if isinstance(error, OrchError):
                raise error
            raise OrchError(f"the run of {playbook} failed to start: {error}")
        self.runs[reporter.run_id] = live
        return {"run_id": reporter.run_id, "playbook": playbook, "state": "running",
                "targets": list(targets)}

    def run_status(self, run_id: str, wait_s: float = 0.0) -> dict:
        run_id = self.store.resolve(run_id)
        live = self.runs.get(run_id)
        if live is not None and wait_s > 0:
            live.thread.join(min(wait_s, 600.0))
        record = self.store.get(run_id, metrics=False)
        running = live is not None and live.thread.is_alive()
        return {
            "run_id": record.run_id, "playbook": record.playbook, "name": record.name,
            "verdict": record.verdict, "exit_code": record.exit_code,
            "started_at": record.started_at, "ended_at": record.ended_at,
            "watched_by_this_server": running,
            # a "running" record whose orch is gone says so: alive | gone | unknown
            "controller_state": controller_state(record),
            "targets": [{"name": t.name, "host": t.host, "vmid": t.vmid,
                         "torch_version": t.torch_version, "fx_tls_state": t.fx_tls_state}
                        for t in record.targets],
            "steps": [{"name": s.name, "kind": s.kind, "target": s.target, "status": s.status,
                       "duration_s": s.duration_s, "message": s.message} for s in record.steps],
            "progress": live.reporter.progress() if live is not None else None,
            "findings": [{"target": f.target, "signature": f.signature, "message": f.message,
                          "remediation": f.remediation, "evidence": list(f.evidence)}
                         for f in record.findings],
            "summary": record.summary,
            "error": str(live.error) if live is not None and live.error is not None else None,
        }

    def run_log(self, run_id: str, target: Optional[str], offset: int, max_bytes: int) -> dict:
        record = self.store.get(run_id, metrics=False)
        launches = {n: e for n, e in record.launches().items() if e.get("run_dir")}
        if not launches:
            return {"run_id": record.run_id, "target": target, "launched": False, "offset": offset,
                    "next_offset": offset, "size": 0, "text": "", "bytes": 0, "eof": True}
        name = target or next(iter(launches))
        if name not in launches:
            raise OrchError(f"run {record.run_id} launched nothing on {name!r}",
                            hint="launched on: " + ", ".join(launches))
        cap = max(1, min(max_bytes, MAX_OUTPUT_BYTES))
        offset = max(0, offset)
        warm = self.warm(name)
        run_dir = launches[name]["run_dir"]
        path = run_dir + "/output.log"
        # the file-read payload: the log's real path must be inside its run folder (a log
        # swapped for a link to /etc/shadow is refused, not followed as `tail` followed it)
        try:
            found = payload_api.file_read(warm, path, [run_dir], offset, cap, timeout=60)
        except PayloadError as error:
            if error.kind == "outside-allowance":
                raise PolicyRefused(f"run_log: {path} leads out of its run folder (a link): "
                                    "not read") from None
            raise
        size, data = found["size"], found["data"]
        data = whole_utf8(data, at_end=offset + len(data) >= size)
        return {"run_id": record.run_id, "target": name, "launched": True, "path": path,
                "offset": offset, "next_offset": offset + len(data), "size": size,
                "text": data.decode("utf-8", "replace"), "bytes": len(data),
                "eof": offset + len(data) >= size}

    def run_stop(self, run_id: str, grace_s: float) -> dict:
        run_id = self.store.resolve(run_id)
        live = self.runs.get(run_id)
        if live is None or not live.thread.is_alive():
            record, results = stop_recorded_run(run_id, grace=grace_s, store=self.store,
                                                fleet=self.fleet)
            return {"run_id": record.run_id, "targets": results,
                    "ok": not any("error" in r for r in results)}
        # This server's own thread watches the run: stop the processes and let the watching
        # runner record the verdict (killed), as `orch stop` does for a live `orch run`.
        record = self.store.get(run_id, metrics=False)
        launches = {n: e for n, e in record.launches().items() if e.get("run_dir")}
        if not launches:
            raise OrchError(f"run {run_id} has not launched its process yet",
                            hint="run_status shows its steps; stop it once the launch step is done")
        targets = self.fleet.targets(list(launches))
        results = fan_out(targets, lambda t: payload_api.stop_run(t, launches[t.name]["run_dir"], grace_s)).rows()
        return {"run_id": run_id, "targets": results, "ok": not any("error" in r for r in results)}

    def run_containers(self, run_id: str, name: Optional[str] = None) -> list[ContainerSpec]:
        """Where a recorded run ran (all its targets, or the one named), as recorded: what
        run_stop and run_log would act on."""
        record = self.store.get(run_id, metrics=False)
        return [ContainerSpec(name=t.name, host=t.host, vmid=t.vmid) for t in record.targets
                if name is None or t.name == name]

    def explain_targets(self, run_id: str, target: Optional[str]) -> list[str]:
        """The targets explain_run reads in: those the run launched on (or the one named)."""
        record = self.store.get(run_id, metrics=False)
        names = [n for n in launched_targets(record) if target is None or n == target]
        if not names:
            raise OrchError(f"run {record.run_id} launched nothing"
                            + (f" on {target}" if target else "") + ": there is no log to explain")
        return names

    def explain_run(self, run_id: str, target: Optional[str], context: int) -> dict:
        """`orch explain RUN` as data: each launched target's failures, frames, shared state
        and remedies."""
        record = self.store.get(run_id)
        names = self.explain_targets(record.run_id, target)
        explained = explain_record(record, [self.warm(name) for name in names], context=context)
        return {"run_id": record.run_id, "explanations": [e.to_dict() for e in explained]}

    def runs_list(self, last: int, playbook: Optional[str]) -> dict:
        records = self.store.list(playbook=playbook, last=last)
        items = []
        for r in records:
            tp = throughput(r if r.summary.get("total_tok_s") else self.store.get(r.run_id))
            items.append({"run_id": r.run_id, "playbook": r.playbook, "name": r.name,
                          "started_at": r.started_at, "ended_at": r.ended_at,
                          "verdict": r.verdict, "exit_code": r.exit_code,
                          "controller_state": controller_state(r),
                          "total_tok_s": tp["total"],
                          "fx_tls": {t.name: t.fx_tls_state for t in r.targets},
                          "problems": sorted({f.signature for f in r.findings if is_problem(f.signature)})})
        return {"runs": items}

    def runs_compare(self, base: str, new: str, threshold: Optional[float]) -> dict:
        result = compare(self.store.get(base), self.store.get(new),
                         DEFAULT_THRESHOLD if threshold is None else threshold)
        return result.to_dict()
