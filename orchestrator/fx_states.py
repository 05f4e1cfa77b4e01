"""The states of torch's FX tracing flag, as the fx_patch payload reports them (`status`).

One vocabulary for every room that shows or judges them: `orch patch fx-tls`, the patch
step's findings, the run records, the reports and comparisons, and the MCP tools.
"""

from __future__ import annotations

# Each state the payload can report, with what it means in one line (the CLI prints it
# after "TARGET torch VERSION: "; the patch step's findings say it too).
MEANINGS = {
    "vulnerable": "VULNERABLE: the FX tracing flag is a process-global (threads race)",
    "fixed-upstream": "fixed upstream: this torch already keeps the flag thread-local",
    "patched": "patched by orch: the flag is thread-local",
    "drifted": "DRIFTED: orch's record says patched, but the files changed (torch reinstalled?)",
    "unknown": "UNKNOWN shape: orch does not recognise this source and will not touch it",
}
STATES = tuple(MEANINGS)

# Good: every thread has its own flag.
THREAD_LOCAL = ("patched", "fixed-upstream")
# Bad and fixable: `orch patch fx-tls apply` makes them thread-local; reports show them as problems.
NEEDS_PATCH = ("vulnerable", "drifted")
# Not known to be safe: `status` exits 1 on these ("unknown" is a shape orch will not touch).
UNSAFE = tuple(state for state in STATES if state not in THREAD_LOCAL)


def meaning(state) -> str:
    """The one-line meaning of a state; an unexpected one is shown as it came."""
    return MEANINGS.get(state, "" if state is None else str(state))


def patch_state(result: dict) -> str:
    """The state after an fx_patch action: the payload reports it under `status` (older
    payloads: `state`)."""
    return str(result.get("state") or result.get("status") or "unknown")
