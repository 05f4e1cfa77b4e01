"""Fakes for testing step kinds without SSH, containers or a console: a host that answers
commands from a script, a reporter and a recorder that remember their calls, and the
StepContext/Engine wiring around them. The playbooks and inventories are real YAML files
read by the real loader (errors keep their file:line:col)."""

from __future__ import annotations

import ast
import json
import textwrap
from dataclasses import dataclass
from typing import Callable, Optional

from orchestrator.config.inventory import load_inventory
from orchestrator.playbook.engine import Engine, TargetRun
from orchestrator.payloads import compact_source, payload_source
from orchestrator.payloads._tarstream import Receiver, TransferError, send_frames
from orchestrator.playbook.loader import load_playbook
from orchestrator.remote.base import Result, Transport, stdin_bytes
from orchestrator.remote.container import Target
from orchestrator.runs.model import RunRecord, TargetInfo
from orchestrator.runs.recorder import RunRecorder
from orchestrator.playbook.steps import STEP_KINDS
from orchestrator.playbook.steps.base import RunInfo, StepContext

RUN_ID = "20261130-120000-test00"


@dataclass
class Call:
    argv: list
    stdin: Optional[bytes]
    env: dict

    @property
    def payload_args(self) -> dict:
        """A payload's arguments: in argv, or set by the first line of its script on stdin."""
        if len(self.argv) > 2:
            return json.loads(self.argv[2])
        header = self.stdin.split(b"\n", 1)[0].decode()
        return json.loads(ast.literal_eval(header.split(" = ", 1)[1].split("  # orch", 1)[0])[0])


@dataclass
class Reply:
    exit_code: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    error: Optional[Exception] = None     # raised instead (a dropped link, a timeout)


class FakeHost(Transport):
    """Answers each command with the first scripted reply whose matcher accepts it; a
    command nobody scripted exits 127, as a missing program would."""

    def __init__(self, name: str = "fakehost"):
        self.name = name
        self.calls: list[Call] = []
        self._replies: list[tuple[Callable, Reply]] = []
        self._answers: list[tuple[Callable, Callable]] = []   # computed replies (on_cp)

    def on(self, match: Callable[[list, Optional[bytes]], bool], reply: Reply) -> "FakeHost":
        self._replies.append((match, reply))
        return self

    def on_argv(self, prefix: list, **reply) -> "FakeHost":
        return self.on(lambda argv, stdin: argv[:len(prefix)] == prefix, Reply(**reply))

    def on_payload(self, name: str, result: Optional[dict] = None, events=(),
                   error: Optional[str] = None) -> "FakeHost":
        """The payload `name` prints events, then its result (or its error) as JSON lines."""
        final = {"event": "error", "message": error} if error else {"event": "result", **(result or {})}
        lines = [json.dumps(e) for e in [*events, final]]
        source = payload_source(name)
        return self.on(lambda argv, stdin: bool(stdin) and stdin.endswith(source),
                       Reply(stdout=("\n".join(lines) + "\n").encode()))

    def on_cp(self, root, corrupt: Optional[Callable[[bytes], bytes]] = None) -> "FakeHost":
        """orch cp's container end (payloads/cp.py) as the real code does it, under the local
        folder root standing in for the container's /: a push's stream is unpacked and
        checked by the real Receiver, a pull's stream is the real send_frames. corrupt
        changes a stream on its way, either direction (a link that flips bytes)."""
        source = compact_source("cp")

        def answer(argv, stdin):
            args = json.loads(argv[-1])
            path = str(root) + args["path"]
            if args["action"] == "send":
                stream = b"".join(send_frames(path, last_bytes=args.get("last_bytes")))
                return Reply(stdout=corrupt(stream) if corrupt else stream)
            stream = corrupt(stdin) if corrupt else stdin
            offset = [0]

            def read_exact(size):
                piece = stream[offset[0]:offset[0] + size]
                offset[0] += len(piece)
                return piece
            try:
                done = Receiver(path).receive(read_exact)
            except TransferError as error:
                line = {"event": "error", "message": str(error), "kind": error.kind}
                return Reply(exit_code=1, stdout=(json.dumps(line) + "\n").encode())
            done["path"] = done["path"][len(str(root)):]
            return Reply(stdout=(json.dumps({"event": "result", **done}) + "\n").encode())
        self._answers.append((lambda argv, stdin: source in argv, answer))
        return self

    def cp_calls(self, action: str) -> list[Call]:
        source = compact_source("cp")
        return [c for c in self.calls if source in c.argv and json.loads(c.argv[-1])["action"] == action]

    def payload_calls(self, name: str) -> list[Call]:
        source = payload_source(name)
        return [c for c in self.calls if c.stdin and c.stdin.endswith(source)]

    def _run(self, argv, options) -> Result:
        stdin = stdin_bytes(options.stdin)
        self.calls.append(Call(list(argv), stdin, dict(options.env)))
        computed = [(match, make(list(argv), stdin)) for match, make in self._answers
                    if match(list(argv), stdin)]
        for match, reply in computed + self._replies:
            if match(list(argv), stdin):
                if reply.error is not None:
                    raise reply.error
                if options.on_stdout and reply.stdout:
                    options.on_stdout(reply.stdout)
                if options.on_stderr and reply.stderr:
                    options.on_stderr(reply.stderr)
                return Result(list(argv), reply.exit_code, reply.stdout, reply.stderr, 0.01, self.name)
        return Result(list(argv), 127, b"", f"fake: {argv[0]}: not found".encode(), 0.0, self.name)


class FakeReporter:
    """Remembers what the engine and the steps told the console, in order."""

    def __init__(self):
        self.events: list[tuple] = []

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]

    def run_started(self, run, targets) -> None:
        self.events.append(("run_started", run.run_id, [t.name for t in targets]))

    def step_started(self, target, spec) -> None:
        self.events.append(("step_started", target, spec.label()))

    def step_plan(self, target, spec, lines) -> None:
        self.events.append(("step_plan", target, spec.label(), list(lines)))

    def step_progress(self, target, spec, text) -> None:
        self.events.append(("step_progress", target, spec.label(), text))

    def step_output(self, target, spec, line, stream) -> None:
        self.events.append(("step_output", target, spec.label(), line, stream))

    def step_skipped(self, target, spec, why) -> None:
        self.events.append(("step_skipped", target, spec.label(), why))

    def step_finished(self, target, spec, result, outcome) -> None:
        self.events.append(("step_finished", target, spec.label(), result.status, result.message))

    def interrupted(self, run, launched=None) -> None:
        self.events.append(("interrupted", run.run_id, launched))

    def run_finished(self, run, record, runs) -> None:
        self.events.append(("run_finished", record.verdict, record.exit_code))

    def monitor_started(self, target, run_dir, settings) -> None:
        self.events.append(("monitor_started", target, run_dir))

    def monitor_ended(self, target) -> None:
        self.events.append(("monitor_ended", target))

    def monitor_progress(self, target, classifier, status) -> None:
        self.events.append(("monitor_progress", target))

    def log_line(self, target, line) -> None:
        self.events.append(("log_line", target, line))

    def note(self, target, text, level="info") -> None:
        self.events.append(("note", target, text, level))


class SpyRecorder(RunRecorder):
    """The real recorder (in memory, no store) that also lists the calls steps make."""

    SPIED = ("save_targets", "note_launch_starting", "note_launch", "note_monitor",
             "note_monitor_result", "note_artifacts", "save_step", "add_findings", "add_metrics")

    def __init__(self, run_id: str = RUN_ID):
        super().__init__(run_id, store=None)
        self.calls: list[tuple] = []

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if name in SpyRecorder.SPIED:
            calls = super().__getattribute__("calls")

            def spy(*args, **kwargs):
                calls.append((name, *args))
                return value(*args, **kwargs)
            return spy
        return value

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeFleet:
    """The inventory of a real YAML file; every target lives on one FakeHost."""

    def __init__(self, inventory_path: str, host: FakeHost):
        self.inventory = load_inventory(inventory_path)
        self.host = host

    def target(self, spec) -> Target:
        return Target(spec.name, self.host, None, spec.venv, spec.gpus, spec.env)


INVENTORY = """\
hosts:
  here: {transport: local}
containers:
  dev: {host: here, venv: /opt/venv, gpus: [0, 1], env: {HF_HOME: /data/hf}}
  other: {host: here}
groups:
  both: [dev, other]
"""


def write_project(tmp_path, playbook: str, inventory: str = INVENTORY, files: Optional[dict] = None):
    """playbook.yaml and inv.yaml in tmp_path (and any other files); their paths."""
    (tmp_path / "playbook.yaml").write_text(textwrap.dedent(playbook))
    (tmp_path / "inv.yaml").write_text(inventory)
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    return str(tmp_path / "playbook.yaml"), str(tmp_path / "inv.yaml")


@dataclass
class Harness:
    """A loaded playbook, its fake fleet and the engine's collaborators."""

    engine: Engine
    host: FakeHost
    reporter: FakeReporter
    recorder: SpyRecorder
    run: RunInfo

    def record(self) -> RunRecord:
        return self.engine.run()

    def context(self, index: int = 0, target: str = "dev", variables: Optional[dict] = None,
                timeout: Optional[float] = None) -> StepContext:
        """A StepContext for step `index` on `target`, as the engine builds it."""
        spec = self.run.playbook.steps[index]
        t = self.engine.fleet.target(self.engine.fleet.inventory.containers[target])
        return StepContext(self.run, self.reporter, t, spec,
                           variables if variables is not None else {}, timeout=timeout)

    def step(self, index: int = 0):
        return STEP_KINDS[self.run.playbook.steps[index].kind]()

    def begin(self, *targets: str) -> None:
        """A record for the run (what Engine.run begins with), for steps run on their own."""
        self.recorder.begin(RunRecord(run_id=RUN_ID, playbook=self.run.playbook.path,
                                      playbook_sha256="", name="t",
                                      targets=[TargetInfo(name=t, host="here", vmid=None)
                                               for t in targets or ("dev",)],
                                      launch={"targets": {}}))

    def target_run(self, target: str = "dev") -> TargetRun:
        t = self.engine.fleet.target(self.engine.fleet.inventory.containers[target])
        return TargetRun(t, self.engine.render_vars(t))


def harness(tmp_path, playbook: str, *, dry_run: bool = False, extra_vars: Optional[dict] = None,
            targets=(), files: Optional[dict] = None, host: Optional[FakeHost] = None) -> Harness:
    book_path, inventory_path = write_project(tmp_path, playbook, files=files)
    book = load_playbook(book_path, extra_vars or {})
    host = host or FakeHost()
    fleet = FakeFleet(inventory_path, host)
    recorder = SpyRecorder()
    reporter = FakeReporter()
    run = RunInfo(run_id=RUN_ID, playbook=book, recorder=recorder, playbook_arg="playbook.yaml",
                  dry_run=dry_run, cli="orch -i inv.yaml", inventory=fleet.inventory)
    engine = Engine(run, fleet, reporter, extra_vars=extra_vars, target_names=list(targets))
    return Harness(engine, host, reporter, recorder, run)


def planned(tmp_path, playbook: str, index: int = 0, **options) -> list[str]:
    """The --dry-run lines of step `index` (on the first target); asserts nothing ran."""
    h = harness(tmp_path, playbook, dry_run=True, **options)
    h.record()
    assert h.host.calls == [], "a dry run touched the target"
    return h.reporter.of("step_plan")[index][3]


def payload_failure(tmp_path, playbook: str, payload: str, error: str):
    """Run a playbook whose payload `payload` answers with an error; the harness and the
    first step's recorded result (which must have failed)."""
    h = harness(tmp_path, playbook)
    h.host.on_payload(payload, error=error)
    step = h.record().steps[0]
    assert step.status == "failed"
    return h, step
