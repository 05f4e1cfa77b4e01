"""The log formats against real libraries' own output, on CPU, nothing downloaded at run time
(the libraries come from the registry once, into a cached venv: tests/trainer/realenv.py).

- tqdm: a stock bar; every point agrees with the loop's own numbers.
- Hugging Face Trainer: a 2-layer GPT-2 from GPT2Config on synthetic tokens; the points
  equal the Trainer's own state.log_history.
- torchrun --nproc-per-node 2 (gloo) running a loop that logs like SpecForge's trainer: each
  rank's points equal what it logged, read from one `--tee 3` stream and from the per-rank
  files of `--log-dir/--redirects 3`; a rank killed with SIGKILL and a collective timeout get
  their verdicts from the real ChildFailedError summary.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.watch.logformats import LogPoint, make_format, parse_text
from orchestrator.watch.classify import ClassifierSettings, EndState, LogClassifier
from tests.support.hf_history import assert_recorded_as_history
from tests.trainer.realenv import trainers_venv

pytestmark = pytest.mark.torch
REAL = Path(__file__).resolve().parent / "real"


@pytest.fixture(scope="module")
def python(torch_python) -> str:
    return str(trainers_venv(torch_python) / "bin" / "python")


def run(argv: list[str], log: Path, timeout: float, cwd: Path) -> int:
    """Like orch's launcher: stdout and stderr into one log, python unbuffered."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                              timeout=timeout).returncode


def raw(path: Path) -> str:
    """The log as written: read_text() would turn tqdm's carriage returns into newlines."""
    return path.read_bytes().decode("utf-8", "replace")


def stored(points: list[LogPoint]) -> list[LogPoint]:
    return [p for p in points if not p.progress]


def test_tqdm_bar_points_agree_with_the_loop(python, tmp_path):
    log, truth_file = tmp_path / "out.log", tmp_path / "truth.json"
    assert run([python, str(REAL / "tqdm_loop.py"), str(truth_file), "60"], log, 60, tmp_path) == 0
    text = raw(log)
    assert "\r" in text                                    # redrawn in place, as on a terminal
    truth = json.loads(truth_file.read_text())
    points = parse_text(text, make_format("tqdm"))
    assert len(points) >= 5 and points[-1].step == 60 and points[-1].total == 60
    for point in points:
        if point.step:   # n completed iterations: the postfix is the n-th iteration's loss
            assert point.loss == truth[point.step - 1]["loss"], point
            assert point.metrics["lr"] == 1e-4 and point.metrics["it_s"] > 0
    assert [p.step for p in points] == sorted({p.step for p in points})   # one point per step


def test_hf_trainer_points_equal_its_log_history(python, tmp_path):
    log, history_file = tmp_path / "out.log", tmp_path / "history.json"
    argv = [python, str(REAL / "hf_tiny_trainer.py"), "--output-dir", str(tmp_path / "out"),
            "--history", str(history_file), "--steps", "30", "--logging-steps", "5"]
    assert run(argv, log, 300, tmp_path) == 0, raw(log)[-3000:]
    history = json.loads(history_file.read_text())
    points = stored(parse_text(raw(log), make_format("hf-trainer")))
    assert len(points) == len(history) == 7                 # 6 logs and the closing summary
    for point, entry in zip(points, history):
        assert point.step == entry["step"]
        # The Trainer prints 4 significant digits (as strings); the history keeps floats.
        assert point.loss == (pytest.approx(entry["loss"], rel=1e-3) if "loss" in entry else None)
        expected = {k: v for k, v in entry.items() if k not in ("loss", "step", "total_flos")}
        assert point.metrics == pytest.approx(expected, rel=1e-3)


def torchrun(python: str, *options: str) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nproc-per-node", "2", *options]


def rank_truth(folder: Path) -> dict[int, list[tuple]]:
    return {rank: [tuple(row) for row in json.loads((folder / f"rank{rank}.json").read_text())]
            for rank in (0, 1)}


def by_rank(points: list[LogPoint]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for p in stored(points):
        out.setdefault(p.worker, []).append((p.step, p.loss, p.metrics["acc"]))
    return out


def test_torchrun_tee_and_per_rank_logs_give_each_ranks_points(python, tmp_path):
    truth_dir = tmp_path / "truth"
    truth_dir.mkdir()
    loop = [str(REAL / "ddp_specforge_loop.py"), "--steps", "20", "--log-interval", "4",
            "--truth", str(truth_dir)]
    tee_log = tmp_path / "tee.log"
    assert run(torchrun(python, "--master-port", "29611", "--tee", "3", *loop), tee_log, 180, tmp_path) == 0
    truth = rank_truth(truth_dir)
    assert [row[0] for row in truth[0]] == [4, 8, 12, 16, 20]
    points = parse_text(raw(tee_log), make_format("specforge"))
    assert by_rank(points) == truth
    assert max(p.step for p in points if p.progress and p.worker == 0) == 20   # rank 0's bar

    # --log-dir D --redirects 3: D/<run id>/attempt_0/<rank>/{stdout,stderr}.log
    assert run(torchrun(python, "--master-port", "29612", "--log-dir", str(tmp_path / "logs"),
                        "--redirects", "3", *loop), tmp_path / "agent.log", 180, tmp_path) == 0
    rank_logs = sorted((tmp_path / "logs").glob("*/attempt_0/*/stderr.log"))
    assert [p.parent.name for p in rank_logs] == ["0", "1"]
    truth = rank_truth(truth_dir)
    per_file = {}
    for path in rank_logs:
        rank = int(path.parent.name)
        per_file.update(by_rank(parse_text(raw(path), make_format("specforge"), worker=rank)))
    assert per_file == truth


def classify(text: str, end: EndState):
    classifier = LogClassifier(ClassifierSettings("dev"))
    for i, line in enumerate(text.splitlines()):
        classifier.feed(line, float(i))
    return classifier.classify(end, {}, cli="orch")


def test_torchrun_rank_killed_by_sigkill(python, tmp_path):
    log = tmp_path / "out.log"
    code = run(torchrun(python, "--master-port", "29613", str(REAL / "ddp_specforge_loop.py"),
                        "--steps", "40", "--kill-rank", "1", "--kill-at-step", "6"), log, 180, tmp_path)
    assert code == 1
    verdict = classify(raw(log), EndState(state="exited", exit_code=code))
    assert verdict.verdict == "killed"
    assert "rank 1" in verdict.message and "SIGKILL (signal 9)" in verdict.message


def test_torchrun_collective_timeout(python, tmp_path):
    log = tmp_path / "out.log"
    code = run(torchrun(python, "--master-port", "29614", str(REAL / "ddp_specforge_loop.py"),
                        "--steps", "20", "--sleep-rank", "1", "--sleep-at-step", "7",
                        "--sleep-seconds", "20", "--collective-timeout", "4"), log, 180, tmp_path)
    assert code == 1
    verdict = classify(raw(log), EndState(state="exited", exit_code=code))
    assert verdict.verdict == "collective-timeout"
    assert any("Timed out waiting 4000ms" in line for f in verdict.findings for line in f.evidence)


def test_orch_run_records_a_hugging_face_trainer_run(python, tmp_path, monkeypatch):
    """`orch run` unchanged on a real Trainer (local transport): the record's points are its
    log_history, the verdict ok, the live lines without tqdm's redraws."""
    from click.testing import CliRunner

    from orchestrator.cli.app import main
    from orchestrator.runs.store import RunStore

    history = tmp_path / "history.json"
    (tmp_path / "inv.yaml").write_text("hosts: {here: {transport: local}}\n"
                                       "containers: {dev: {host: here}}\ndefault_target: dev\n")
    (tmp_path / "hf.yaml").write_text(f"""\
name: hf-tiny
targets: [dev]
steps:
  - launch:
      command: [{json.dumps(python)}, {json.dumps(str(REAL / "hf_tiny_trainer.py"))}, --output-dir,
                {json.dumps(str(tmp_path / "out"))}, --history, {json.dumps(str(history))},
                --steps, "20", --logging-steps, "5", --state, {json.dumps(str(tmp_path / "state.json"))}]
      env: {{OMP_NUM_THREADS: "1"}}
  - monitor: {{format: hf-trainer, tokens_per_step: 128, hang_after: 240, gpu_every: 0,
               trainer_state: {json.dumps(str(tmp_path / "state.json"))}}}
""")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["-i", "inv.yaml", "run", "hf.yaml"], catch_exceptions=False)
    assert result.exit_code == 0, result.output[-4000:]
    assert "ok: 1 worker trained to step 20" in result.output
    assert "%|" not in result.output                       # redraws never shown as lines
    with RunStore() as store:
        record = store.get("last")
    closing = assert_recorded_as_history(record, json.loads(history.read_text()), "grad_norm")
    # the closing summary (same step as the last log) joins that step's point, losing nothing
    assert record.metrics[-1].extra["train_loss"] == pytest.approx(closing["train_loss"], rel=1e-3)
    assert any(p.derived and p.tok_s for p in record.metrics)
    state = record.summary["monitor"]["dev"]["trainer_state"]
    assert state["steps"] == [5, 10, 15, 20] and state["agrees_with_log"] is True


def test_a_trainer_without_a_bar_through_the_monitor_gives_its_log_history(python, tmp_path):
    """disable_tqdm=True: the dicts come with no bar at all. The monitor numbers them in log
    order x logging_steps: the points' steps and numbers are the Trainer's log_history, and
    the train_tokens_per_second it prints (include_num_input_tokens_seen) is their tok/s."""
    from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink, stream_copy_path
    from orchestrator.remote.payload_api import launcher
    from orchestrator.remote.container import Target
    from orchestrator.remote.local import LocalTransport

    class Sink(MonitorSink):
        points: list = []

        def metrics(self, target, points):
            self.points.extend(points)

    history = tmp_path / "history.json"
    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    state = tmp_path / "trainer_state.json"
    launcher(target, "start", str(run_dir), env={"OMP_NUM_THREADS": "1"},
             argv=[python, str(REAL / "hf_tiny_trainer.py"), "--output-dir", str(tmp_path / "out"),
                   "--history", str(history), "--steps", "20", "--logging-steps", "5", "--no-bar",
                   "--state", str(state)])
    sink = Sink()
    monitor = Monitor(target, str(run_dir), MonitorSettings(logging_steps=5, gpu_every=0, hang_after=240,
                                                            trainer_state=str(state)),
                      sink, stream_copy=stream_copy_path(str(tmp_path / "local")))
    end, _ = monitor.run()
    # the Trainer's own trainer_state.json, read at the end, agrees with the log's steps
    assert monitor.read_trainer_state() == {"path": str(state), "entries": 5, "steps": [5, 10, 15, 20],
                                            "agrees_with_log": True}
    verdict = monitor.verdict(end, {}, cli="orch", playbook=None)
    assert verdict.verdict == "ok", verdict.message
    assert "%|" not in raw(run_dir / "output.log")               # no bar at all
    entries = json.loads(history.read_text())
    logged, closing = entries[:-1], entries[-1]
    assert [p.step for p in sink.points] == [e["step"] for e in entries] == [5, 10, 15, 20, 20]
    for point, entry in zip(sink.points, logged):
        assert point.loss == pytest.approx(entry["loss"], rel=1e-3)
        assert point.tok_s == pytest.approx(entry["train_tokens_per_second"], rel=1e-3)
    assert sink.points[-1].extra["train_loss"] == pytest.approx(closing["train_loss"], rel=1e-3)
    assert verdict.summary["format"].startswith("auto: hf-trainer, no progress bar")


def test_hf_trainer_under_torchrun_redirects_pairs_dicts_and_bar_in_any_order(python, tmp_path):
    """torchrun --log-dir D --redirects 3: a rank's dicts go to stdout.log, its bar to
    stderr.log, two files the monitor reads as they grow. Whichever arrives first, in
    whatever pieces, the points' steps are the Trainer's log_history (with and without
    logging_steps given)."""
    from orchestrator.watch.logformats import LogParser

    history = tmp_path / "history.json"
    assert run(torchrun(python, "--master-port", "29613", "--log-dir", str(tmp_path / "logs"),
                        "--redirects", "3", str(REAL / "hf_tiny_trainer.py"), "--output-dir",
                        str(tmp_path / "out"), "--history", str(history), "--steps", "20",
                        "--logging-steps", "5"), tmp_path / "agent.log", 300, tmp_path) == 0
    [rank0] = (tmp_path / "logs").glob("*/attempt_0/0")
    texts = {name: raw(rank0 / f"{name}.log") for name in ("stdout", "stderr")}
    assert "{'loss'" in texts["stdout"] and "%|" in texts["stderr"]
    truth = [(e["step"], e.get("loss")) for e in json.loads(history.read_text())]

    def read(order: list[tuple[str, str]], logging_steps=None) -> list[tuple]:
        fmt = make_format("auto", logging_steps=logging_steps)
        parsers = {name: LogParser(fmt, worker=0, source=f"r/attempt_0/0/{name}.log") for name in texts}
        points = []
        for name, text in order:
            points += parsers[name].feed(text)[1]
        for parser in parsers.values():
            points += parser.finish()[1]
        return [(p.step, None if p.loss is None else round(p.loss, 2)) for p in stored(points)]

    def pieces(name: str, count: int) -> list[tuple[str, str]]:
        size = len(texts[name]) // count + 1
        return [(name, texts[name][i:i + size]) for i in range(0, len(texts[name]), size)]

    expected = [(step, None if loss is None else round(loss, 2)) for step, loss in truth]
    assert [s for s, _ in expected] == [5, 10, 15, 20, 20]
    alternating = [piece for pair in zip(pieces("stdout", 9), pieces("stderr", 9)) for piece in pair]
    for order in ([("stdout", texts["stdout"]), ("stderr", texts["stderr"])],
                  [("stderr", texts["stderr"]), ("stdout", texts["stdout"])], alternating):
        assert read(order) == expected
        assert read(order, logging_steps=5) == expected
