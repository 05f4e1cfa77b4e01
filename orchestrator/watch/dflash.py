"""The DFlash workload's own words: the stand-in trainer's lines, and the advice that only
fits its drafter threads (each compiling on its own in one process, where FX's process-wide
state is shared). The generic classifier (classify.py) reads a run through these when the run
is DFlash's; a torchrun rank or any other trainer never gets this advice.

The stand-in trainer says (docs/design/dflash-workload.md):

    start drafters=3 devices=cuda:0,cuda:1,cuda:2 torch=2.13.0+cpu pid=123 ...
    drafter=1 step=20 loss=3.21 tok_s=1234
    drafter=1 ERROR RuntimeError: ...
    drafter=1 done steps=50 loss=2.10 tok_s=5321
    summary status=ok|failed|timeout drafters=3 ok=3 failed=0 total_tok_s=16000 stalled=0
"""

from __future__ import annotations

import re
from typing import Optional

from orchestrator.ground.fx_states import THREAD_LOCAL
from orchestrator.ground.verdicts import FX_NODE_META, FX_NODE_META_FRAME, FX_RACE, remedy

WORD = "drafter"     # its word for a worker
DONE_LINE = re.compile(r"drafter=(?P<drafter>\d+)\s+done\s+steps=(?P<steps>\d+)"
                       r"(?:\s+loss=(?P<loss>\S+))?(?:\s+tok_s=(?P<tok_s>[0-9.eE+-]+))?")
ERROR_LINE = re.compile(r"drafter=(?P<drafter>\d+)\s+ERROR\s+(?P<error>.*)")
START_FIELD = "drafters"    # the start line's count of drafters


def first_compile_message(stuck: list[int], expected: int, silent: float, facts: dict) -> str:
    version = facts.get("torch_version") or "?"
    return (f"{len(stuck)} of the {expected} drafters (drafter "
            f"{', '.join(str(d) for d in stuck)}) hung in their first compile: no new step line "
            f"for {silent:.0f} s while the process lived, on torch {version} whose FX tracing "
            f"flag is already thread-local ({facts.get('fx_tls_state')}), so not the FX race; ")


def fx_message(count: int, target: str, facts: dict) -> str:
    """The FX race seen in `count` drafters' errors."""
    version = facts.get("torch_version") or "?"
    state = facts.get("fx_tls_state")
    state_text = {"vulnerable": "vulnerable (process-wide, shared by all threads)",
                  "drifted": "drifted (orch's patch was undone, e.g. by a reinstall)",
                  "patched": "patched by orch, yet the error appeared",
                  "fixed-upstream": "fixed upstream, yet the error appeared"}.get(
        state, state or "not checked")
    return (f"FX tracing race: {count} drafter(s) raised \"Detected that you are using FX to "
            f"symbolically trace a dynamo-optimized function\"; torch {version} on "
            f"{target}: its FX state {state_text}")


def hang_remediation(cli: str, target: str, thread_local: bool) -> str:
    """A hang of drafter threads: one that died in a compile leaves the others on its lock."""
    fix_race = "" if thread_local else f"If it is the FX race, apply `{cli} patch fx-threads apply -t {target}`; "
    return ("look at the first drafter error above; a drafter that died inside a compile can "
            "leave the others waiting on its lock. " + fix_race +
            "serialising each drafter's first step (--serialize-compile) also avoids it.")


def first_compile_remediation(cli: str = "orch", playbook: Optional[str] = None) -> str:
    """A hang in the first compile on a torch whose FX flag is thread-local: compile threads
    deadlocking on a shared GPU (seen 1 run in 3 with two drafters on one H200)."""
    rerun = (f" (`{cli} run {playbook} -e 'extra_args=[--serialize-compile]'`)" if playbook else "")
    return ("the drafters' compile threads deadlocked on a shared GPU (seen 1 run in 3 with two "
            "drafters on one H200; orch's FX patch is in place and does not help here). Serialise "
            "the first compile: the stand-in trainer's --serialize-compile, set through the "
            f"playbook's extra_args var{rerun}, or run one drafter per GPU.")


def fx_remediation(target: str, facts: dict, cli: str = "orch", playbook: Optional[str] = None) -> str:
    version = facts.get("torch_version") or "this torch"
    state = facts.get("fx_tls_state")
    if state in THREAD_LOCAL:
        return (f"the flag is already thread-local in torch {version} on {target}; the race left "
                "another trace: FX also patches nn.Module.__call__ process-wide while tracing "
                "(upstream PR 187589). Serialise each drafter's first step (--serialize-compile).")
    state_word = "vulnerable" if state in (None, "vulnerable") else state
    # fx-threads, not the flag-only fx-tls: the same threads also share FX's node-meta state
    # and its trace-time patches, and the next compile would trip over those.
    again = f": `{cli} run {playbook}`" if playbook else " the playbook"
    return (f"torch {version} on {target} is {state_word}: its FX tracing flag (and the other FX "
            f"state threads share) is process-wide. " + remedy(FX_RACE, cli, target) + again)


def fx_state_finding(signature: str, target: str, facts: dict, cli: str, playbook: Optional[str],
                     seen: dict) -> tuple[str, str]:
    """(message, remediation) for an FX state other than the flag that threads shared."""
    version = facts.get("torch_version") or "this torch"
    rerun = f"; then rerun: `{cli} run {playbook}`" if playbook else "; then rerun the playbook"
    if signature == FX_NODE_META:
        where = seen.get(FX_NODE_META_FRAME, [])
        raised = f" ({where[-1]})" if where else " (torch/fx/traceback.py's annotate())"
        return (f"FX node-meta race: KeyError 'custom'{raised}: another thread left "
                f"preserve_node_meta() while this one's annotate() was open; torch {version} on "
                f"{target} keeps current_meta as a process-global",
                f"make FX's node-meta state thread-local: `{cli} patch fx-threads apply -t "
                f"{target}`" + rerun + f" (check with `{cli} verify fx-threads -t {target}`)")
    return (f"FX trace-time patching leaked into another thread: {seen[signature][0][:200]!r}: "
            f"while one thread traces, torch {version} on {target} patches nn.Module.__call__/"
            "__getattr__ and math.* process-wide (CURRENT_PATCHER in torch/fx/_symbolic_trace.py)",
            f"make the trace-time patches act only in the tracing thread: `{cli} patch fx-threads "
            f"apply -t {target}`" + rerun + f" (check with `{cli} verify fx-threads -t {target}`);"
            " serialising each drafter's first, compiling step (--serialize-compile) also avoids it")
