"""The states of the FX state threads share, as the fx_patch payload reports them: one
overall `status` per patch set, and one row per shared state (`states`).

One vocabulary for every room that shows or judges them: `orch patch fx-tls|fx-threads`, the
patch step's findings, the run records, the reports and comparisons, and the MCP tools.
"""

from __future__ import annotations

# Each state the payload can report, with what it means in one line (the CLI prints it
# after "TARGET torch VERSION: "; the patch step's findings say it too).
MEANINGS = {
    "vulnerable": "VULNERABLE: FX state that threads share is a process-global (threads race)",
    "fixed-upstream": "fixed upstream: this torch already keeps that FX state thread-local",
    "patched": "patched by orch: that FX state is thread-local",
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


# The patch sets: fx-tls is the flag alone (orch's first patch, kept for users' scripts and
# records); fx-threads is every shared state orch knows.
PATCH_SETS = ("fx-threads", "fx-tls")

# One shared state's row (the payload's `states`), in the words `status` prints.
ROW_MEANINGS = {
    "vulnerable": "VULNERABLE",
    "upstream": "thread-local upstream",
    "patched": "patched by orch",
    "drifted": "DRIFTED (orch's files changed since)",
    "absent": "not in this release",
    "unknown": "UNKNOWN shape (orch will not touch it)",
}


def row_meaning(status) -> str:
    return ROW_MEANINGS.get(status, "" if status is None else str(status))


# The shared states, as `orch verify fx-threads` (the fx_race payload's `states`) and the
# status rows name them, with the title each is shown under.
STATE_TITLES = {
    "fx-tracing-flag": "FX tracing flag",
    "node-meta": "FX node-meta state",
    "trace-patching": "FX trace-time patching",
}
SHARED_STATES = tuple(STATE_TITLES)
