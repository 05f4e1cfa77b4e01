"""Which failure of a run is its cause, and which follow from it. Pure functions, no I/O:
the tracebacks of the run's logs (tracebacks.py) and torchrun's failure tables
(distributed.py) in, the lead and its consequences out. `orch explain` (explain.py) and the
run's verdict (classify.py) both lead with what this says, so they quote the same exception.

What follows from another's failure (torch 2.13's words, checked on real gloo runs: the
corpus of tests/fixtures/explain_corpus) is never the cause while the failure it follows is
in the logs:
- torchrun's own traceback (`ChildFailedError`, raised in torch/distributed/launcher/api.py
  once a worker failed) and its failure table: a summary, unwrapped to the worker's exception;
- a rank that lost its peer: gloo's `Connection closed by peer ... typically caused by a remote
  worker crashing`, `Connection reset by peer`, NCCL's `remote process exited`, a communicator
  aborted (docs/design/trainer-logs.md);
- a collective that timed out waiting for a rank that stopped (gloo's `Timed out waiting
  10000ms for recv operation`, NCCL's watchdog): the lead only when nothing else failed;
- a process stopped from outside: torchrun's `SignalException` (it got SIGTERM), SIGTERM of
  the ranks torchrun stops after the first failure, KeyboardInterrupt;
- a DataLoader's re-raise in the main process (`Caught KeyError in DataLoader worker process
  0.`) of the worker's own traceback, which follows it in the log.

"First in time": the order a log prints in; across a node's ranks, torchrun's root cause
(its "first observed failure") and the error files' timestamps; across nodes (explain.py),
the strongest lead, then orch's record of the node that failed first.
"""

from __future__ import annotations

import signal as signals
from dataclasses import asdict, dataclass, field
from typing import Optional

from orchestrator.ground import verdicts
from orchestrator.watch.distributed import PEER_LOST, RankFailure
from orchestrator.watch.tracebacks import PROCESS, RANK, THREAD, Group

# The roles of a traceback
OWN = "own"                  # a failure of its own: a cause
LAUNCHER = "launcher"        # torchrun's summary of its workers' failures
PEER_LOST_ROLE = "peer-lost"  # lost a peer that failed first
WAITED = "waited"            # a collective timed out waiting for a peer
STOPPED = "stopped"          # stopped from outside (a signal)
RERAISED = "reraised"        # re-raised here from another process's own traceback

_LAUNCHER_FILES = ("torch/distributed/run.py", "torch/distributed/launcher/",
                   "torch/distributed/elastic/agent/")
_STOP_EXCEPTIONS = ("KeyboardInterrupt", "SignalException", "SystemExit")
_COLLECTIVE_TIMEOUT = next(s.pattern for s in verdicts.SIGNATURES if s.name == verdicts.COLLECTIVE_TIMEOUT)
# The known races of shared state (the verdict table's FX-race signatures): matched on a
# failure's "Type: message"
RACE_SIGNATURES = tuple(s for s in verdicts.SIGNATURES if s.verdict == verdicts.FX_RACE)
# How strongly each kind of lead explains a run's failure (a node's lead against another's)
STRENGTH = {"exception": 6, "signal": 5, "hang": 4, "waited": 3, "exit": 2, "peer-lost": 1, "stopped": 0}
MAX_SUMMARY = 300
MAX_MESSAGE = 2000
STOPS = {"user": "stopped with `orch stop`",
         "node-failed": "orch stopped this node: another node of the job failed first",
         "timeout": "the monitor's time limit ran out; orch stopped the run"}


@dataclass
class Lead:
    """The cause a run's failure leads with."""

    kind: str                     # exception | signal | exit | hang | waited | peer-lost | stopped
    summary: str                  # one line: the exception and its message, and whose
    exception: str = ""
    message: str = ""
    workers: list[str] = field(default_factory=list)
    signal: str = ""              # SIGKILL, for a rank a signal ended
    node: str = ""                # the target it happened on
    why: list[str] = field(default_factory=list)   # why it leads
    failure: Optional[int] = None   # its index in the explanation's failures (an exception's)
    last_lines: list[str] = field(default_factory=list)   # a hang: what the logs said last
    consequence_of: str = ""      # a node's lead that follows from another node's failure

    @property
    def quote(self) -> str:
        """The exception and the first line of its message."""
        message = self.message.split("\n", 1)[0]
        return (f"{self.exception}: {message}" if message else self.exception)[:MAX_SUMMARY]

    @property
    def strength(self) -> int:
        return STRENGTH.get(self.kind, 0) if not self.consequence_of else -1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Consequence:
    what: str                     # what happened: "rank 0: RuntimeError: ... Connection closed by peer"
    because: str                  # why it follows from the lead
    failure: Optional[int] = None
    node: str = ""


@dataclass
class RunHints:
    """What a run's record says about its end (explain of a log alone has none)."""

    stopped_for: Optional[str] = None   # hang | user | timeout | node-failed (orch stopped it)
    hang_seconds: Optional[float] = None
    signal: Optional[int] = None        # the launched process's end by a signal
    exit_code: Optional[int] = None


# ------------------------------------------------------------------ what a traceback is
def role(g: Group) -> str:
    tb = g.traceback
    text = f"{tb.exception}: {tb.message}"
    if tb.reraised:
        return RERAISED
    if tb.exception.rsplit(".", 1)[-1] in _STOP_EXCEPTIONS:
        return STOPPED
    if tb.exception.endswith("ChildFailedError") or (
            tb.frames and all(any(f in fr.file for f in _LAUNCHER_FILES) or fr.file.startswith("<frozen")
                              for fr in tb.frames[-3:])):
        return LAUNCHER
    if PEER_LOST.search(text):
        return PEER_LOST_ROLE
    if _COLLECTIVE_TIMEOUT.search(text):
        return WAITED
    return OWN


def known_race(g: Group) -> Optional[str]:
    """The known race of shared state the failure's words match, if any."""
    text = f"{g.traceback.exception}: {g.traceback.message}"
    return next((s.name for s in RACE_SIGNATURES if s.pattern.search(text)), None)


def who(workers: list[str]) -> str:
    return ", ".join(workers) if workers else "the process"


def natural(name: str) -> tuple:
    """drafter-2 before drafter-10, rank 2 before rank 10."""
    head = name.rstrip("0123456789")
    return (head, int(name[len(head):]) if name[len(head):] else -1)


def describe(g: Group) -> str:
    tb = g.traceback
    message = tb.message.split("\n", 1)[0]
    text = f"{tb.exception}: {message}" if message else tb.exception
    return text[:MAX_SUMMARY]


# ------------------------------------------------------------------ the lead
def find_lead(groups: list[Group], torchrun: list[RankFailure], hints: Optional[RunHints] = None,
              hang_in_log: bool = False) -> tuple[Optional[Lead], list[Consequence]]:
    """The lead of one node's (or one process's) failure and what follows from it. GROUPS in
    the order of the logs; TORCHRUN: the failure tables' entries; HANG_IN_LOG: the log holds
    a watchdog's dump of the threads' stacks (faulthandler) and no exception of its own."""
    hints = hints or RunHints()
    roles = [role(g) for g in groups]
    root = _root(torchrun)
    lead = (_own_lead(groups, roles, root) or _signal_lead(root, hints) or _hang_lead(hints, hang_in_log)
            or _first_of(groups, roles, WAITED, "waited") or _exit_lead(root, groups)
            or _first_of(groups, roles, PEER_LOST_ROLE, "peer-lost") or _stop_lead(hints)
            or _first_of(groups, roles, STOPPED, "stopped") or _first_of(groups, roles, LAUNCHER, "exit"))
    if lead is None:
        return None, []
    return lead, _consequences(lead, groups, roles, torchrun, root, hints)


def _root(torchrun: list[RankFailure]) -> Optional[RankFailure]:
    rooted = [f for f in torchrun if f.root_cause]
    return rooted[0] if rooted else (torchrun[0] if torchrun else None)


def _exception_lead(g: Group, index: int, kind: str, why: list[str]) -> Lead:
    tb = g.traceback
    workers = sorted(g.workers, key=natural)
    return Lead(kind, describe(g) + (f" ({who(workers)})" if workers else ""), tb.exception,
                tb.message[:MAX_MESSAGE], workers, why=why, failure=index)


def _own_lead(groups, roles, root: Optional[RankFailure]) -> Optional[Lead]:
    own = [i for i, r in enumerate(roles) if r in (OWN,)]
    if not own:
        return None
    root_worker = f"rank {root.rank}" if root is not None and root.rank is not None else None

    def order(i: int) -> tuple:
        g = groups[i]
        first = root_worker is not None and root_worker in g.workers
        return (not first, g.traceback.time if g.traceback.time is not None else float("inf"),
                not g.traceback.original, i)

    index = min(own, key=order)
    g = groups[index]
    why = []
    if root_worker and root_worker in g.workers:
        why.append(f"torchrun's root cause (its first observed failure) is {root_worker}")
    elif g.traceback.original:
        why.append(f"raised first, in {who(g.workers)}; re-raised in the main process")
    elif len(own) > 1:
        why.append("the first failure in the logs")
    others = [r for i, r in enumerate(roles) if i != index and r != OWN]
    if others:
        why.append("the other tracebacks follow from it: " + ", ".join(sorted(set(others))))
    return _exception_lead(g, index, "exception", why)


def _signal_lead(root: Optional[RankFailure], hints: RunHints) -> Optional[Lead]:
    """A rank a signal ended first, with no exception of its own (SIGKILL: the OOM killer)."""
    if root is not None and root.signal is not None and hints.stopped_for is None:
        name = root.signal_name or f"signal {root.signal}"
        worker = f"rank {root.rank}" if root.rank is not None else "a rank"
        why = ["torchrun's root cause (its first observed failure): no Python exception, a signal"]
        if root.signal == signals.SIGKILL:
            why.append("SIGKILL that no one asked for is most often the host's OOM killer")
        return Lead("signal", f"{worker} was killed by {name}" + (f" (pid {root.pid})" if root.pid else ""),
                    workers=[worker], signal=name, why=why)
    if hints.signal is not None and hints.stopped_for is None:
        name = _signal_name(hints.signal)
        return Lead("signal", f"the process was killed by {name}", workers=[], signal=name,
                    why=["it ended by a signal orch did not send, with no Python exception"])
    return None


def _stop_lead(hints: RunHints) -> Optional[Lead]:
    """orch stopped the run for another reason than a hang, and nothing failed before."""
    if hints.stopped_for in STOPS:
        return Lead("stopped", STOPS[hints.stopped_for], why=["orch's record says why it stopped the run"])
    return None


def _hang_lead(hints: RunHints, hang_in_log: bool) -> Optional[Lead]:
    """A hang: orch stopped the run as hung, or a watchdog dumped its stacks."""
    if hints.stopped_for == "hang":
        after = f" for {hints.hang_seconds:.0f} s" if hints.hang_seconds else ""
        return Lead("hang", f"the run hung: no progress{after} while it lived; orch stopped it",
                    why=["orch's monitor stopped it as hung (its record says so): no exception of its own"])
    if hang_in_log:
        return Lead("hang", "the run hung: a watchdog (faulthandler) dumped its threads' stacks and ended it",
                    why=["the log holds faulthandler's `Timeout` dump of every thread, and no exception"])
    return None


def _first_of(groups, roles, wanted: str, kind: str) -> Optional[Lead]:
    index = next((i for i, r in enumerate(roles) if r == wanted), None)
    if index is None:
        return None
    why = {"waited": ["a collective timed out waiting for its peers: the rank it waited for stopped "
                      "answering (hung, or gone without an error of its own in these logs)"],
           "peer-lost": ["it lost its peer: the failure of that peer, which came first, is not in "
                         "these logs (another node's?)"],
           "stopped": ["it was stopped from outside, and nothing failed before"],
           "exit": ["only torchrun's own summary is in these logs: the worker's traceback is not"]}[kind]
    return _exception_lead(groups[index], index, kind, why)


def _exit_lead(root: Optional[RankFailure], groups: list[Group]) -> Optional[Lead]:
    """torchrun's first failed rank, when its own traceback is not in the logs read."""
    if root is None or root.exit_code in (None, 0):
        return None
    worker = f"rank {root.rank}" if root.rank is not None else "a rank"
    if any(worker in g.workers for g in groups):
        return None
    return Lead("exit", f"{worker} exited with code {root.exit_code}; its traceback is not in these logs",
                workers=[worker], why=["torchrun's root cause; its own log (or an @record error file) "
                                       "would hold the exception"])


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(abs(number)).name
    except ValueError:
        return f"signal {number}"


# ------------------------------------------------------------------ what follows from it
def _consequences(lead: Lead, groups, roles, torchrun, root, hints: RunHints) -> list[Consequence]:
    by = lead.summary if lead.kind != "exception" else (
        f"{who(lead.workers)}'s {lead.exception}" if lead.workers else f"the {lead.exception}")
    out = []
    for index, (g, r) in enumerate(zip(groups, roles)):
        if index == lead.failure:
            continue
        # torchrun's own lines carry no rank prefix, whatever rank's lines came before them
        what = f"{'torchrun' if r == LAUNCHER else who(g.workers)}: {describe(g)}"
        because = {LAUNCHER: "torchrun's own traceback: its summary of the failed ranks, raised after "
                             f"{by}",
                   PEER_LOST_ROLE: f"lost its peer after {by}",
                   WAITED: f"a collective timed out waiting after {by}",
                   STOPPED: f"stopped from outside after {by}",
                   RERAISED: "re-raised in the main process from its worker's own traceback",
                   OWN: "another failure, later in the logs"}[r]
        out.append(Consequence(what, because, index))
    for failure in torchrun:
        if root is not None and failure is root:
            continue
        if failure.signal == signals.SIGTERM or failure.handled_signal == signals.SIGTERM:
            out.append(Consequence(f"torchrun: {failure.describe()}",
                                   "torchrun stops every other rank with SIGTERM once one fails"))
    if lead.kind == "exception" and hints.stopped_for == "hang":
        after = f" {hints.hang_seconds:.0f} s" if hints.hang_seconds else ""
        out.append(Consequence(f"the run then hung: no progress for{after} while it lived",
                               f"orch stopped it (SIGTERM, then SIGKILL) after {by}"))
    return out


# ------------------------------------------------------------------ concurrency
def concurrency(groups: list[Group]) -> tuple[list[str], bool]:
    """The evidence that the failing process ran several threads in the failing code (several
    threads failed, a named thread raised, a known race's words), and whether the failure's
    words match a known race on shared state. Ranks and DataLoader workers are processes."""
    threads = sorted({w for g in groups if g.traceback.kind == THREAD for w in g.workers}, key=natural)
    evidence = []
    if len(threads) > 1:
        evidence.append(f"{len(threads)} threads of one process failed: {', '.join(threads[:8])}")
    elif threads:
        evidence.append(f"raised in thread {threads[0]}, not the main thread: the process ran "
                        "several threads")
    race = next(((g, known_race(g)) for g in groups if known_race(g)), None)
    if race is not None:
        words = describe(race[0])
        words = words if len(words) <= 100 else words[:100].rsplit(" ", 1)[0] + " ..."
        evidence.append(f"`{words}` matches a known race on shared state ({race[1]})")
    return evidence, race is not None


def not_concurrent(groups: list[Group]) -> str:
    """Why nothing points to shared state: each process's failure is its own thread's."""
    kinds = {g.traceback.kind for g in groups}
    if RANK in kinds:
        return ("torchrun's ranks are processes of their own, each failing in its main thread: "
                "no threads shared the failing code")
    if PROCESS in kinds:
        return "the failure came from another process (a DataLoader worker), not from a thread"
    return "one thread (the main thread) failed, and no known race's words match"

