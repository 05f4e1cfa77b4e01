"""The MCP server: orch's tools over stdio, built with the official `mcp` SDK (2.x).

Each tool's input schema comes from the typed signature below; its result is JSON
(structuredContent, with the same JSON as text beside it). An OrchError becomes a tool error
(isError) carrying orch's message and hint. Tools that change something are registered only
when the policy allows them; every call is checked against the policy (containers only,
unless hosts are allowed) and recorded in the audit trail before it acts and after.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import time
from typing import Annotated, Any, Callable, Optional

from typing_extensions import TypedDict

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.types import CallToolResult, ResourceLink, TextContent, ToolAnnotations
from pydantic import Field

from orchestrator import __version__

from orchestrator.ground import console
from orchestrator.ground.errors import ConfigError, OrchError
from orchestrator.mcp.audit import AuditLog, AuditUnavailable
from orchestrator.mcp.outputs import URI_TEMPLATE as OUTPUT_URI_TEMPLATE, OutputGone
from orchestrator.mcp.policy import Policy, PolicyRefused
from orchestrator.mcp.tools import DEFAULT_OUTPUT_BYTES, Tools

LOG_URI_TEMPLATE = "orch://runs/{run_id}/log/{target}{?offset,length}"

INSTRUCTIONS = """\
orch: debug and run GPU training in Proxmox LXC containers. Targets are inventory names
(list_targets). Commands are argv lists, never shell strings. Typical FX-race diagnosis:
grep_source(definition=true) for is_fx_symbolic_tracing, read_source, fx_tls_status,
run_start + run_status (verdict and findings with remediation), fx_tls_apply,
verify_fx_race, run_start again."""

READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, openWorldHint=False)
CHANGES = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)

# Set per tools/call by the audit middleware; call() marks it when it has recorded the call.
_CALL: contextvars.ContextVar[dict] = contextvars.ContextVar("orch_mcp_call")

Target = Annotated[str, Field(description="An inventory container name (list_targets), or HOST:VMID "
                                          "(a host itself only where the server allows it)")]
RunId = Annotated[str, Field(description="A run id, a unique prefix, or 'last'")]


class ExecResult(TypedDict):
    """exec's result: each stream's first max_output_bytes; *_bytes are the full sizes; a
    larger stream is a resource (*_resource, also a resource link) to page through."""
    target: str
    argv: list[str]
    exit_code: int
    stdout: str
    stdout_bytes: int
    stdout_truncated: bool
    stdout_resource: Optional[str]   # orch://outputs/ID/stdout: read it with ?offset=N&length=M
    stderr: str
    stderr_bytes: int
    stderr_truncated: bool
    stderr_resource: Optional[str]
    stderr_tail: str                 # stderr's last 8 KiB when truncated (where errors are)
    duration_s: float
    via: str            # session (the warm command server) or channel (a plain pct exec)


class SourceText(TypedDict):
    target: str
    package: str
    version: Optional[str]
    path: str
    start_line: int
    end_line: int
    total_lines: int
    text: str
    truncated: bool
    bytes: int


class FilePage(TypedDict):
    target: str
    path: str
    size: int            # the file's size now
    offset: int
    next_offset: int     # pass it back as offset to read on
    bytes: int
    eof: bool
    encoding: str        # utf-8 (data is the text) or base64 (data is the bytes, encoded)
    data: str
    sha256: str          # of this page's bytes, as read in the container


class LogPage(TypedDict, total=False):
    run_id: str
    target: Optional[str]
    launched: bool
    path: str
    offset: int
    next_offset: int     # pass it back as offset to read on
    size: int            # the log's size now
    text: str
    bytes: int
    eof: bool


class RunStarted(TypedDict):
    run_id: str
    playbook: str
    state: str
    targets: list[str]


def build_server(tools: Tools, policy: Policy, audit: AuditLog) -> MCPServer:
    # WARNING: the SDK configures logging; at INFO every SSH connect (paramiko) and every
    # failed call would be logged on stderr as well as answered.
    server = MCPServer("orch", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING",
                       middleware=[_refusals_audited(audit)])
    allowed = set(policy.tools())

    def call(tool: str, arguments: dict, work: Callable[[], Any],
             containers: Optional[Callable[[], list]] = None) -> Any:
        """Run one tool call: its intent audited, the policy (containers: what the call would
        act on; by default its target), errors as tool errors, its outcome audited."""
        target = _target_of(arguments)
        started = time.monotonic()
        marker = _CALL.get(None)
        if marker is not None:
            marker["audited"] = True
        try:
            row = audit.begin(tool, arguments, target)   # before anything acts: or nothing does
        except AuditUnavailable as error:
            raise ToolError(str(error)) from None

        def finish(outcome: str, error: str = "") -> None:
            audit.finish(row, outcome, error, time.monotonic() - started)

        try:
            acts_on = containers() if containers else (tools.specs([target]) if target else [])
            policy.check(tool, acts_on)
            result = work()
        except PolicyRefused as error:
            finish("refused", str(error))
            raise ToolError(str(error)) from None
        except OrchError as error:
            finish("error", str(error))
            raise ToolError(str(error)) from None
        except (ValueError, TypeError) as error:  # argv rules (validate_argv) and the like
            finish("error", str(error))
            raise ToolError(f"bad argument: {error}") from None
        except Exception as error:
            finish("crash", f"{type(error).__name__}: {error}")
            raise ToolError(f"internal error in {tool}: {type(error).__name__}: {error} "
                            "(please report it)") from None
        finish("ok")
        return result

    def tool(annotations: ToolAnnotations = READ_ONLY, *, name: str = "",
             acts_on: Optional[Callable[..., list]] = None,
             answer: Optional[Callable[[Any], Any]] = None):
        """The tool table's one decorator: FN is the tool NAME (default: FN's own name),
        registered only when the policy allows it. Each call's arguments are bound from FN's
        own signature (what the audit records), checked against the policy (acts_on(**arguments):
        the containers the call would act on; default: its target), and FN's body is the work;
        ANSWER shapes what it returns (exec's resource links)."""
        def register(fn):
            tool_name = name or fn.__name__
            signature = inspect.signature(fn)

            @functools.wraps(fn)   # the SDK reads the input schema from FN's signature
            def handler(*args, **kwargs):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                arguments = dict(bound.arguments)
                containers = (lambda: acts_on(**arguments)) if acts_on else None
                result = call(tool_name, arguments, lambda: fn(**arguments), containers)
                return answer(result) if answer else result
            if tool_name in allowed:
                server.add_tool(handler, name=tool_name, annotations=annotations)
            return handler
        return register

    # ------------------------------------------------------------ read-only tools
    @tool()
    def list_targets() -> dict[str, Any]:
        """The inventory: containers (host, vmid, venv, gpus), hosts and groups."""
        return tools.list_targets()

    def checked(targets: list[str]) -> list[str]:
        """inventory_check's containers: those named, else every one the policy permits."""
        return list(targets) or [name for name, spec in tools.fleet.inventory.containers.items()
                                 if policy.permits_place(spec)]

    @tool(acts_on=lambda targets: tools.specs(checked(targets)) if checked(targets) else [])
    def inventory_check(
            targets: Annotated[list[str], Field(description="Containers or groups; empty: all")] = [],
    ) -> dict[str, Any]:
        """The `orch inventory check` rows: reachable, running, python, venv, GPUs per container."""
        return tools.inventory_check(checked(targets))

    @tool()
    def grep_source(
            target: Target,
            pattern: Annotated[str, Field(description="A Python regex, or a plain string with fixed; "
                                                      "with definition: a name or Class.method")],
            package: Annotated[str, Field(description="An installed package")] = "torch",
            fixed: Annotated[bool, Field(description="pattern is a plain string, not a regex")] = False,
            word: Annotated[bool, Field(description="Match whole words only")] = False,
            ignore_case: Annotated[bool, Field(description="Ignore case")] = False,
            context: Annotated[int, Field(ge=0, le=50, description="Lines around each hit")] = 0,
            definition: Annotated[bool, Field(description="Find where pattern is defined")] = False,
            show: Annotated[bool, Field(description="With definition: include each body")] = False,
            max_hits: Annotated[int, Field(ge=1, le=5000, description="Stop after this many hits "
                                                                      "(truncated says so)")] = 200,
    ) -> dict[str, Any]:
        """Search an installed package's Python source in the container (never imported).
        Matches carry path (relative to site-packages), line and text; truncated says when
        max_hits cut the list."""
        if show and not definition:
            raise ConfigError("show goes with definition (it returns a definition's body)")
        return tools.grep_source(target, pattern, package=package, fixed=fixed, word=word,
                                 ignore_case=ignore_case, context=context,
                                 mode="def" if definition else "grep", show=show, max_hits=max_hits)

    @tool()
    def read_source(
            target: Target,
            path: Annotated[str, Field(description="Relative to the package directory, e.g. "
                                                   "fx/_symbolic_trace.py (no '..', not absolute)")],
            package: Annotated[str, Field(description="An installed package")] = "torch",
            start_line: Annotated[int, Field(ge=1, description="First line")] = 1,
            end_line: Annotated[Optional[int], Field(ge=1, description="Last line; null: to the end")] = None,
            max_bytes: Annotated[int, Field(ge=1, le=1 << 20, description="At most this many bytes "
                                                                          "of text")] = DEFAULT_OUTPUT_BYTES,
    ) -> SourceText:
        """Lines of one file of an installed package. Paths leaving the package (.., absolute,
        symlinks out) are refused."""
        return tools.read_source(target, package, path, start_line, end_line, max_bytes)

    @tool()
    def read_file(
            target: Target,
            path: Annotated[str, Field(description="An absolute path in the container, inside a "
                                                   "run folder (the state folder's runs/, e.g. "
                                                   "/var/lib/orch/runs/RUN/launch/output.log) or "
                                                   "a folder the server allows")],
            offset: Annotated[int, Field(ge=0, description="Byte offset to read from")] = 0,
            max_bytes: Annotated[int, Field(ge=1, le=1 << 20, description="At most this many "
                                                                          "bytes")] = DEFAULT_OUTPUT_BYTES,
    ) -> FilePage:
        """A byte range of one file in a container, read-only: run folders (logs, metrics,
        core dumps), or folders the server's owner allows. Text when it is UTF-8, else
        base64; the sha256 of the bytes is computed where they were read and checked here.
        A path whose real path (symlinks resolved) leads outside is refused."""
        return tools.read_file(target, path, offset, max_bytes, extra_roots=policy.paths)

    @tool()
    def fx_tls_status(target: Target) -> dict[str, Any]:
        """Is torch's FX tracing flag thread-local here? status: vulnerable | fixed-upstream |
        patched | drifted | unknown."""
        return tools.fx_tls(target, "status")

    @tool()
    def fx_tls_diff(target: Target) -> dict[str, Any]:
        """The unified diff fx_tls_apply would make; changes nothing."""
        return tools.fx_tls(target, "diff")

    @tool()
    def verify_fx_race(target: Target,
                       trials: Annotated[int, Field(ge=1, le=50, description="Runs of the reproducer "
                                                                          "and of its same-thread control")] = 3,
                       ) -> dict[str, Any]:
        """The deterministic FX race reproducer: verdict fixed | vulnerable | inconclusive."""
        return tools.verify_fx_race(target, trials)

    @tool()
    def run_status(
            run_id: RunId,
            wait_s: Annotated[float, Field(ge=0, le=600, description="Wait up to this long for "
                                                                     "the run to end")] = 0,
    ) -> dict[str, Any]:
        """A run: steps, live per-drafter progress, verdict, findings with remediation."""
        return tools.run_status(run_id, wait_s)

    @tool(acts_on=lambda run_id, target, **_: tools.run_containers(run_id, target))
    def run_log(
            run_id: RunId,
            target: Annotated[Optional[str], Field(description="Default: the first launched")] = None,
            offset: Annotated[int, Field(ge=0, description="Byte offset to read from")] = 0,
            max_bytes: Annotated[int, Field(ge=1, le=1 << 20, description="At most this many bytes "
                                                                          "of the log")] = DEFAULT_OUTPUT_BYTES,
    ) -> LogPage:
        """The training log by byte offsets: pass next_offset back to page on."""
        return tools.run_log(run_id, target, offset, max_bytes)

    # the policy sees what it reads in: the launched targets, as the inventory has them now
    @tool(acts_on=lambda run_id, target, **_: tools.specs(tools.explain_targets(run_id, target)))
    def explain_run(
            run_id: RunId,
            target: Annotated[Optional[str], Field(description="One of the run's targets; "
                                                               "default: every launched one")] = None,
            context: Annotated[int, Field(ge=0, le=20, description="Source lines around each "
                                                                   "frame's line")] = 3,
    ) -> dict[str, Any]:
        """Why a run failed, as `orch explain`: its cause first (`lead`: the first failure,
        torchrun's wrappers unwrapped, a rank's signal, a hang) and what followed from it,
        every worker's traceback (grouped), each frame's source as it ran, version and RECORD
        check; the process-wide mutable state the failing frames read, ranked with its
        evidence and confidence, only when threads shared the failing code, and the remedy
        (orch's patch, or generic options). Reads only; changes nothing."""
        return tools.explain_run(run_id, target, context)

    @tool()
    def runs_list(last: Annotated[int, Field(ge=1, le=500, description="The newest this many runs")] = 10,
                  playbook: Annotated[Optional[str], Field(description="Only runs of this playbook "
                                                                       "(its path or name); null: all")] = None,
                  ) -> dict[str, Any]:
        """Recorded runs, newest first: verdict, throughput, fx-tls state, problems."""
        return tools.runs_list(last, playbook)

    @tool()
    def runs_compare(base: Annotated[str, Field(description="The earlier run (an id, a prefix, "
                                                            "'last~1')")],
                     new: Annotated[str, Field(description="The later run (an id, a prefix, 'last')")],
                     threshold: Annotated[Optional[float], Field(ge=0, lt=1, description="Regression threshold, 0.10 = 10 %")] = None) -> dict[str, Any]:
        """Compare run new with run base: throughput, verdict, torch, patch, packages, regressions."""
        return tools.runs_compare(base, new, threshold)

    # ------------------------------------------------------------ changing tools
    @tool(CHANGES, name="exec", answer=_with_links)
    def exec_tool(
            target: Target,
            argv: Annotated[list[str], Field(min_length=1, description="The command as a list of "
                                                                       "arguments (no shell)")],
            timeout_s: Annotated[float, Field(gt=0, le=3600, description="Kill the command's process "
                                                                         "group after this long")] = 60,
            stdin: Annotated[Optional[str], Field(description="Text for standard input")] = None,
            max_output_bytes: Annotated[int, Field(ge=0, le=1 << 20, description="Bytes of stdout and of "
                                                                                 "stderr returned inline; "
                                                                                 "more is a resource link")] = DEFAULT_OUTPUT_BYTES,
    ) -> ExecResult:  # returned as a CallToolResult (resource links), validated against this
        """Run argv in the container: exit code, stdout/stderr (capped: *_truncated and *_bytes
        say so; a larger output is a resource link to page through, stderr's tail is
        included), duration."""
        return tools.exec(target, argv, timeout_s, stdin, max_output_bytes)

    @tool(CHANGES)
    def fx_tls_apply(target: Target) -> dict[str, Any]:
        """Make the FX tracing flag thread-local (backups, atomic writes, import check, record)."""
        return tools.fx_tls(target, "apply")

    @tool(CHANGES)
    def fx_tls_revert(target: Target) -> dict[str, Any]:
        """Restore torch's original files (checked against the wheel's RECORD hashes)."""
        return tools.fx_tls(target, "revert")

    @tool(CHANGES, acts_on=lambda playbook, vars, targets:
          tools.run_targets(policy.playbook(playbook), vars, targets))
    def run_start(
            playbook: Annotated[str, Field(description="A playbook of the folders the server runs "
                                                       "playbooks from (--allow-playbook): its "
                                                       "name there, e.g. dflash.yaml, or its "
                                                       "absolute path")],
            vars: Annotated[dict[str, Any], Field(description="Playbook variables (like -e), as data: "
                                                             "only those the playbook lists under "
                                                             "`mcp: vars:`; template syntax in them "
                                                             "is refused")] = {},
            targets: Annotated[list[str], Field(description="Instead of the playbook's targets")] = [],
    ) -> RunStarted:
        """Start a playbook run; returns its run_id at once (follow it with run_status/run_log)."""
        return tools.run_start(policy.playbook(playbook), vars, targets)

    @tool(CHANGES, acts_on=lambda run_id, **_: tools.run_containers(run_id))
    def run_stop(run_id: RunId,
                 grace_s: Annotated[float, Field(ge=0, le=3600, description="Seconds between SIGTERM "
                                                                           "and SIGKILL")] = 10,
                 ) -> dict[str, Any]:
        """SIGTERM the run's process group, SIGKILL after grace_s."""
        return tools.run_stop(run_id, grace_s)

    # ------------------------------------------------------ resources and a prompt
    @server.resource("orch://inventory", name="inventory", mime_type="application/json")
    def inventory_resource() -> str:
        """The inventory's containers, hosts and groups."""
        return json.dumps(tools.list_targets(), indent=2)

    if "exec" in allowed:
        @server.resource(OUTPUT_URI_TEMPLATE, name="exec_output", mime_type="text/plain")
        def exec_output(output: str, stream: str, offset: int = 0,
                        length: int = DEFAULT_OUTPUT_BYTES) -> str | bytes:
            """A spooled exec output (stdout or stderr), from byte offset, up to length bytes
            (1 MiB at most): text when it is UTF-8 (the next offset is this one plus the
            text's UTF-8 length), else the bytes."""
            try:
                return tools.output_page(output, stream, offset, length)
            except OutputGone as error:
                raise ResourceNotFoundError(str(error)) from None

    @server.resource(LOG_URI_TEMPLATE, name="run_log", mime_type="text/plain")
    def run_log_resource(run_id: str, target: str, offset: int = 0,
                         length: int = DEFAULT_OUTPUT_BYTES) -> str:
        """A run's training log from byte offset, up to length bytes (the run_log tool's
        pages, with its policy check and audit row)."""
        arguments = {"run_id": run_id, "target": target, "offset": offset, "max_bytes": length}
        try:
            page = call("run_log", arguments, lambda: tools.run_log(run_id, target, offset, length),
                        containers=lambda: tools.run_containers(run_id, target))
        except ToolError as error:
            raise ResourceError(str(error)) from None
        return page["text"]

    @server.prompt("diagnose_fx_race")
    def diagnose_fx_race(target: str) -> str:
        """Walk through the FX-race diagnosis on one container."""
        return (f"Diagnose the FX tracing race on {target} with orch's tools:\n"
                f"1. grep_source(target={target!r}, pattern='is_fx_symbolic_tracing', definition=true, "
                "show=true): where the flag is read.\n"
                "2. read_source on the file it names, around that line.\n"
                f"3. fx_tls_status(target={target!r}): vulnerable means a process-global flag.\n"
                "4. run_start the DFlash playbook, then run_status(wait_s=...) until the verdict; "
                "an fx-race finding carries the remediation.\n"
                "5. fx_tls_apply, verify_fx_race (expect verdict fixed), run_start again (expect ok).")

    return server


def _with_links(result: dict) -> CallToolResult:
    """The structured result, its JSON as text, and a resource link per spooled stream."""
    links = [ResourceLink(uri=result[f"{stream}_resource"], name=f"{stream} of {result['target']}",
                          mime_type="text/plain", size=result[f"{stream}_bytes"],
                          description=f"all {result[f'{stream}_bytes']} bytes of {stream}; read "
                                      "pages with ?offset=N&length=M")
             for stream in ("stdout", "stderr") if result.get(f"{stream}_resource")]
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(result, indent=2)), *links],
                          structured_content=result)


def _target_of(arguments: dict) -> str:
    targets = arguments.get("targets")
    return str(arguments.get("target") or (",".join(map(str, targets)) if isinstance(targets, list) else ""))


def _refusals_audited(audit: AuditLog):
    """Calls that never reach a tool (a tool not listed, arguments the schema refuses) are
    recorded too, as "refused"."""
    async def middleware(ctx, call_next):
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, dict) else {}
        name, arguments = str(params.get("name", "")), params.get("arguments") or {}
        arguments = arguments if isinstance(arguments, dict) else {"arguments": arguments}
        marker = {"audited": False}
        token = _CALL.set(marker)
        started = time.monotonic()
        try:
            result = await call_next(ctx)
        except Exception as error:
            if not marker["audited"]:
                _record_refusal(audit, name, arguments, str(error), time.monotonic() - started)
            raise
        finally:
            _CALL.reset(token)
        if not marker["audited"]:
            _record_refusal(audit, name, arguments, _error_text(result), time.monotonic() - started)
        return result
    return middleware


def _record_refusal(audit: AuditLog, name: str, arguments: dict, error: str, duration_s: float) -> None:
    """Nothing ran: a failed write is warned about and the client still gets the refusal."""
    try:
        audit.record(name, arguments, _target_of(arguments), "refused", error, duration_s)
    except Exception as failure:  # noqa: BLE001 - sqlite, disk: the refusal stands either way
        console.warn(f"audit: a refused call of {name} could not be recorded: {failure}")


def _error_text(result) -> str:
    if isinstance(result, dict):
        content = result.get("content") or []
        return str(content[0].get("text", "")) if content and isinstance(content[0], dict) else ""
    content = getattr(result, "content", None) or []
    return str(getattr(content[0], "text", "")) if content else ""
