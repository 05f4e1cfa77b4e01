"""Every verdict orch gives a run, in one table: its name, how it shows in a log, when it
applies, its place in the order, its exit code, what to do about it, the workload it belongs
to and what it means in one line.

The table drives everything that speaks of verdicts: the classifier (`watch/classify.py`)
gathers the `Evidence` of an ended run and `decide()` walks the rules in order, the first
whose detector holds is the verdict; the ladder (`worst()`: of several targets' verdicts the
one first in the table); the exit codes (`exit_code_for`); the remediation a report shows for
a finding that came without one; which findings count as failures in comparisons; the
console's and the report's colour. Code elsewhere names a verdict by its constant here
(`CUDA_OOM`, not the string), so a verdict is spelled once; records keep the strings.

`verdict_rules()` lists the rules for the generated reference (docs/reference/).

Adding a verdict: a name constant, a `Rule` in `RULES` at its place in the order (a detector
over `Evidence`, or None when the engine, attach or the run store gives it), its signatures in
`SIGNATURES` if a log line shows it, and a test in tests/unit/ground/test_verdicts.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from orchestrator.ground.errors import ExitCode

# ------------------------------------------------------------------ the names
OK = "ok"
DEGRADED = "degraded"
RECOMPILE_LIMIT = "recompile-limit"
FX_RACE = "fx-race"
HANG = "hang"
CUDA_OOM = "cuda-oom"
NCCL_ERROR = "nccl-error"
COLLECTIVE_TIMEOUT = "collective-timeout"
RENDEZVOUS_TIMEOUT = "rendezvous-timeout"
TRACEBACK = "traceback"
NONZERO_EXIT = "nonzero-exit"
KILLED = "killed"
TIMEOUT = "timeout"
FAILED = "failed"
UNREACHABLE = "unreachable"
INTERRUPTED = "interrupted"
ABANDONED = "abandoned"
RUNNING = "running"

# Finding signatures that are not verdicts themselves: evidence, or a verdict's kind
# ("hang:first-compile" is a hang). A finding's signature before ":" is its verdict.
FX_NODE_META = "fx-race:node-meta"
FX_NODE_META_FRAME = "fx-node-meta-frame"        # evidence only: where the KeyError came from
FX_TRACE_PATCHER = "fx-race:trace-patcher"
FIRST_COMPILE_HANG = "hang:first-compile"       # a hang in the first compile (DFlash threads)
STUCK_RANK = "hang:stuck-rank"                  # the rank a hang or a timeout is about
RANK_FAILED = "rank-failed"                     # torchrun's failed rank (its closing summary)
RENDEZVOUS_RETRY = "rendezvous-retry"           # retries to reach the store: explains a hang
NCCL_WARN = "nccl-warn"                         # a warning, common in healthy runs
WORKER_ERROR = "drafter-error"                  # the DFlash trainer's `drafter=N ERROR` line

# The workloads a rule belongs to: any trainer, torchrun's ranks, the DFlash threads (the
# reference says whose runs show a verdict).
GENERIC, TORCHRUN, DFLASH = "generic", "torchrun", "dflash"


# ------------------------------------------------------------------ evidence
@dataclass(frozen=True)
class Evidence:
    """What the classifier knows of an ended run, in the words the detectors need."""

    signs: frozenset = frozenset()   # the verdicts whose signatures the log showed (not warnings)
    hang: bool = False               # no progress for hang_after while it lived (orch or its watchdog ended it)
    never_met: bool = False          # ... and no step ever: the ranks never met
    rank_killed: bool = False        # torchrun: a rank died by a signal orch did not send
    signalled: bool = False          # it handled a signal and exited 128+N (no rank failed)
    stopped_for: Optional[str] = None  # why orch stopped it: hang | timeout | user
    ended_killed: bool = False       # it vanished, or a signal orch did not send ended it
    failed_exit: bool = False        # a non-zero exit code, or the trainer said it failed
    traceback: bool = False          # a Python traceback or a worker's ERROR line was logged
    workers_short: bool = False      # fewer workers finished than the playbook expects
    degraded: bool = False           # throughput under the playbook's threshold


def _rendezvous(e: Evidence) -> bool:
    # A hang before any step with the ranks never connected is the rendezvous. Its log
    # signature alone ranks under a hang, an OOM and a killed rank, which explain it.
    return (e.hang and e.never_met) or (
        RENDEZVOUS_TIMEOUT in e.signs and not e.hang and CUDA_OOM not in e.signs and not e.rank_killed)


def _killed(e: Evidence) -> bool:
    # A rank killed from outside is the cause. The process ending by a signal (caught, sent
    # by `orch stop`, or vanished) explains less than a timeout or an NCCL error seen before,
    # and a logged traceback says more than the signal did.
    if e.rank_killed:
        return True
    if e.signs & {RENDEZVOUS_TIMEOUT, COLLECTIVE_TIMEOUT, NCCL_ERROR}:
        return False
    return e.signalled or e.stopped_for == "user" or (
        e.ended_killed and e.stopped_for != "timeout" and not e.traceback)


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Rule:
    name: str
    exit_code: int
    workload: str
    description: str
    remediation: str            # {cli} and {target} are filled in (remedy())
    detector: Optional[Callable[[Evidence], bool]]   # None: given by the engine, attach or the store
    tone: str = "bad"           # ok | warn | bad | running: the console's and the report's colour

    @property
    def precedence(self) -> int:
        """Its place in the order: 0 first. Decides the verdict and the ladder."""
        return RULES.index(self)

    @property
    def failure(self) -> bool:
        return self.tone in ("bad", "warn")


RULES: tuple[Rule, ...] = (
    Rule(RUNNING, ExitCode.RUN_FAILED, GENERIC,
         "the run is still going (its record has no verdict yet).", "", None, tone="running"),
    Rule(ABANDONED, ExitCode.RUN_FAILED, GENERIC,
         "its orch (the controller) died without a verdict: settled by `orch attach`, `orch stop` "
         "or `orch runs abandon`.",
         "the run itself may have gone on: `{cli} attach RUN` follows it again if it is still there",
         None),
    Rule(INTERRUPTED, ExitCode.INTERRUPTED, GENERIC, "Ctrl-C before anything was launched.",
         "nothing was launched; run the playbook again when ready", None),
    Rule(UNREACHABLE, ExitCode.RUN_UNREACHABLE, GENERIC,
         "a target could not be reached during the run.",
         "check the host and the container (`{cli} inventory check`); a launched run goes on "
         "there: `{cli} attach RUN` follows it again", None),
    # The DFlash layout (drafter threads compiling side by side in one process) is where
    # threads share FX's state; a torchrun rank is a process of its own.
    Rule(FX_RACE, ExitCode.RUN_FAILED, DFLASH,
         "the FX race: threads compiling side by side shared torch's FX state (the tracing flag's "
         "RuntimeError, `KeyError: 'custom'` from fx/traceback.py, CURRENT_PATCHER errors). "
         "FX-race advice only for DFlash runs.",
         "make FX's shared state thread-local: `{cli} patch fx-threads apply -t {target}` (check "
         "with `{cli} verify fx-threads -t {target}`), then rerun",
         lambda e: FX_RACE in e.signs),
    Rule(RENDEZVOUS_TIMEOUT, ExitCode.RUN_FAILED, TORCHRUN,
         "the ranks never met: the rendezvous never completed, or its store could not be reached.",
         "the ranks never all met: check that every node started with the same --nnodes, "
         "--rdzv-endpoint / --master-addr and --master-port, that the port is reachable from every "
         "node, and that no stale run holds the port", _rendezvous),
    Rule(HANG, ExitCode.RUN_HANG, GENERIC,
         "no progress for `hang_after` seconds while the process lived; it was stopped "
         "(`stop_on_hang`). Once steps flow, steps that stop while output goes on are a hang that "
         "names the silent worker.",
         "see what the process is doing before it is gone next time: `py-spy dump --pid PID` "
         "(`{cli} exec {target} -- py-spy dump --pid PID`), or run with a timeout in the trainer's "
         "own collectives; the last lines it printed are the evidence",
         lambda e: e.hang),
    Rule(CUDA_OOM, ExitCode.RUN_FAILED, GENERIC, "CUDA ran out of memory.",
         "lower the batch size or sequence length, check for other processes on the GPUs "
         "(`{cli} exec {target} -- nvidia-smi`), or put fewer workers on each GPU",
         lambda e: CUDA_OOM in e.signs),
    Rule(KILLED, ExitCode.RUN_FAILED, GENERIC,
         "the process (or a rank) was killed by a signal, or stopped with `orch stop` (a worker's "
         "exit 143 is a stop by SIGTERM, named).",
         "unless you stopped it, find who did: the host's OOM killer (`dmesg` on the host), a "
         "scheduler's preemption, a supervisor, or an `orch stop` from elsewhere", _killed),
    Rule(COLLECTIVE_TIMEOUT, ExitCode.RUN_FAILED, TORCHRUN,
         "a collective timed out (torchrun's SIGABRT after NCCL's watchdog line included).",
         "a collective waited past its timeout: one rank did not join it (stuck, slower, or dead). "
         "Look at the rank that fell behind; set TORCH_DISTRIBUTED_DEBUG=DETAIL (and NCCL_DEBUG=INFO "
         "on GPUs) in the launch env to see which collective each rank was in",
         lambda e: COLLECTIVE_TIMEOUT in e.signs),
    Rule(NCCL_ERROR, ExitCode.RUN_FAILED, TORCHRUN,
         "NCCL reported an error (an `NCCL WARN` in a run that exits 0 is a warning).",
         "rerun with NCCL_DEBUG=INFO in the launch env; check that every rank sees its GPU "
         "(CUDA_VISIBLE_DEVICES from the inventory's gpus) and that P2P/IB work in the container",
         lambda e: NCCL_ERROR in e.signs),
    Rule(TIMEOUT, ExitCode.RUN_FAILED, GENERIC,
         "the monitor's time limit ran out; orch stopped the run.",
         "raise the monitor step's timeout if the run needs longer, or find out why it was slow "
         "(its throughput in the record)", lambda e: e.stopped_for == "timeout"),
    Rule(TRACEBACK, ExitCode.RUN_FAILED, GENERIC, "the run failed with a Python traceback.",
         "`{cli} explain RUN` leads with its cause (the first failure, torchrun's wrappers unwrapped) "
         "and shows its frames; the collected log in the run folder has it whole",
         lambda e: e.traceback and (e.failed_exit or e.ended_killed)),
    Rule(NONZERO_EXIT, ExitCode.RUN_FAILED, GENERIC,
         "the process exited with a non-zero code and no known signature.",
         "read the last lines of its log (`{cli} runs show RUN`, the collected output.log): the "
         "trainer's own words say why it stopped", lambda e: e.failed_exit),
    Rule(FAILED, ExitCode.RUN_FAILED, GENERIC,
         "a step failed, or fewer workers finished than `expect_drafters`.",
         "read the failed step's message and the log in the record (`{cli} runs show RUN`)",
         lambda e: e.workers_short),
    Rule(RECOMPILE_LIMIT, ExitCode.RUN_DEGRADED, GENERIC,
         "degraded because torch._dynamo hit its recompile limit: the function runs uncompiled "
         "from then on.",
         "Dynamo config is per thread since torch 2.12: set torch._dynamo.config.recompile_limit "
         "inside each worker thread (worker threads get the default of 8), or mark the varying "
         "dimension dynamic", lambda e: e.degraded and RECOMPILE_LIMIT in e.signs, tone="warn"),
    Rule(DEGRADED, ExitCode.RUN_DEGRADED, GENERIC,
         "it ran, below the playbook's throughput threshold (`degraded_below`).",
         "check that the kernels compiled (no --uncompiled, no recompile-limit warnings), the GPUs' "
         "use (nvidia-smi) and that each worker has its own GPU", lambda e: e.degraded, tone="warn"),
    Rule(OK, ExitCode.OK, GENERIC,
         "the run trained: every worker finished (or is healthy when `watch_for` left it going).",
         "", lambda e: True, tone="ok"),
)

BY_NAME = {rule.name: rule for rule in RULES}
VERDICTS = tuple(rule.name for rule in RULES)      # the order: first decides, first is worst
FAILURES = frozenset(rule.name for rule in RULES if rule.failure)


# ------------------------------------------------------------------ log signatures
@dataclass(frozen=True)
class Signature:
    """A log line that shows something: `verdict` is what it leads to (None: evidence only)."""

    name: str
    pattern: re.Pattern
    verdict: Optional[str]
    warning: Optional[str] = None    # what it is called, seen in a run that ended well
    workload: str = GENERIC


# Bounded gaps (.{0,400}? not .*): these run on every line of untrusted output, and `.*`
# backtracks quadratically on a long line that repeats the first word.
SIGNATURES: tuple[Signature, ...] = (
    Signature(FX_RACE, re.compile(r"Detected that you are using FX to symbolically trace a "
                                  r"dynamo-optimized function"), FX_RACE, "the FX tracing race error"),
    # The other FX state threads share (verdict fx-race too; docs/design/torch-releases.md): the
    # node-meta race raises KeyError 'custom' from annotate() in torch/fx/traceback.py; FX's
    # process-wide trace-time patching shows as CURRENT_PATCHER errors or another thread's
    # "module is not installed as a submodule".
    Signature(FX_NODE_META, re.compile(r"KeyError: '?custom'?(?:\W|$)"), FX_RACE),
    Signature(FX_NODE_META_FRAME, re.compile(r"torch/fx/traceback\.py\S*, line \d+, in \w+"), None),
    Signature(FX_TRACE_PATCHER, re.compile(r"CURRENT_PATCHER|module is not installed as a submodule"),
              FX_RACE),
    Signature(CUDA_OOM, re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                                   r"CUDA error: out of memory"), CUDA_OOM, "CUDA out of memory"),
    # torch 2.13's own formats, checked on real runs (docs/design/trainer-logs.md): gloo's `Timed out
    # waiting 5000ms for recv operation`, NCCL's watchdog; a rendezvous that never completes.
    Signature(COLLECTIVE_TIMEOUT, re.compile(
        r"Timed out waiting \d+ ?ms for (?:recv|send) operation|gloo.{0,400}?[Tt]imed? ?out|"
        r"Watchdog caught collective operation timeout|ProcessGroupNCCL.{0,400}?[Tt]imeout|"
        r"collective operation timeout|DistBackendError.{0,400}?[Tt]imed? ?out"),
        COLLECTIVE_TIMEOUT, "a collective timeout", TORCHRUN),
    Signature(RENDEZVOUS_TIMEOUT, re.compile(
        r"RendezvousTimeoutError|RendezvousClosedError|waiting for clients\. \d+/\d+ clients joined|"
        r"client socket has timed out after .{0,200}? while trying to connect|"
        r"The server socket has failed to listen"), RENDEZVOUS_TIMEOUT, "a rendezvous timeout", TORCHRUN),
    # Retries while the store cannot be reached; a run that meets after a retry is fine, so
    # this only explains a hang in which no step was ever logged.
    Signature(RENDEZVOUS_RETRY, re.compile(
        r"TCP client failed to connect/validate to host|has failed to connect to any network address of"),
        None, workload=TORCHRUN),
    Signature(NCCL_ERROR, re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
                                     r"ncclRemoteError|Watchdog caught collective operation timeout|"
                                     r"ProcessGroupNCCL.{0,400}?(?:[Tt]imeout|[Ee]rror)"),
              NCCL_ERROR, "an NCCL error", TORCHRUN),
    Signature(NCCL_WARN, re.compile(r"NCCL WARN"), None, "NCCL warnings (common in healthy runs)", TORCHRUN),
    Signature(RECOMPILE_LIMIT, re.compile(r"hit config\.(?:recompile_limit|cache_size_limit|"
                                          r"accumulated_recompile_limit)"),
              RECOMPILE_LIMIT, "torch._dynamo's recompile limit"),
    Signature(TRACEBACK, re.compile(r"^Traceback \(most recent call last\):"), TRACEBACK,
              "a Python traceback"),
)
SIGNATURE_VERDICT = {s.name: s.verdict for s in SIGNATURES}


# ------------------------------------------------------------------ using the table
def rule(name: str) -> Rule:
    """The rule of a verdict; one orch does not know (a newer record's) reads as failed."""
    return BY_NAME.get(name, BY_NAME[FAILED])


def decide(evidence: Evidence) -> str:
    """The verdict: the first rule in the order whose detector holds."""
    for candidate in RULES:
        if candidate.detector is not None and candidate.detector(evidence):
            return candidate.name
    return OK


def worst(verdicts) -> str:
    """Of several targets' verdicts, the one first in the order (the run's verdict)."""
    given = [v for v in verdicts if v] or [OK]
    return min(given, key=lambda v: rule(v).precedence)


def exit_code_for(verdict: str) -> int:
    """ok 0, hang 11, degraded 12, unreachable 13, interrupted 130, every other failure 10
    (errors.ExitCode)."""
    return rule(verdict).exit_code


def verdict_of(signature: str) -> Optional[str]:
    """The verdict a finding's signature is about ("hang:first-compile" -> hang), or None."""
    head = signature.split(":", 1)[0]
    return head if head in BY_NAME else None


def remedy(verdict: str, cli: str = "orch", target: str = "TARGET") -> str:
    """The verdict's remediation with the CLI's name and the target filled in."""
    return rule(verdict).remediation.format(cli=cli, target=target)


def verdict_rules() -> list[dict]:
    """The rules in order, as plain data for the generated reference (docs/reference/verdicts.md,
    orchestrator/cli/reference.py): name, precedence, exit code, workload, description,
    remediation (for the placeholder target TARGET), whether the classifier or the engine
    decides it, and the log signatures that lead to it (names and patterns)."""
    return [{"name": r.name, "precedence": r.precedence, "exit_code": int(r.exit_code),
             "workload": r.workload, "description": r.description,
             "remediation": r.remediation.format(cli="orch", target="TARGET"),
             "decided_by": "classifier" if r.detector is not None else "engine",
             "signatures": [s.name for s in SIGNATURES if s.verdict == r.name],
             "patterns": [s.pattern.pattern for s in SIGNATURES if s.verdict == r.name]}
            for r in RULES]
