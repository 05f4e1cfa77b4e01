"""TensorBoard event files: collected bounded from a target, read on the controller with
TensorBoard's loader; cut, corrupt, crafted and oversized files are said, never raised.

The files are written with TensorBoard's own EventFileWriter (the writer under
torch.utils.tensorboard's SummaryWriter; tests/trainer/test_real_tensorboard.py uses
SummaryWriter itself)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest

from orchestrator.ground.errors import PayloadError
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.payload_api import collect_files
from orchestrator.watch.monitor import Monitor, MonitorSettings
from orchestrator.watch.tbevents import (READER_MISSING, TAGS, ReaderMissing, read_event_file,
                                         tensorboard_points, whole_records)

from tests.support.monitor_sinks import Sink

pytest.importorskip("tensorboard", reason="the test extra installs tensorboard")
from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402


def write_events(folder, steps: dict[int, dict[str, float]]) -> str:
    """An event file in folder with these scalars per step; returns its path."""
    writer = EventFileWriter(str(folder))
    for step, values in steps.items():
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)
                                             for tag, value in values.items()])
        writer.add_event(event_pb2.Event(step=step, wall_time=time.time(), summary=summary))
    writer.close()
    [name] = [n for n in os.listdir(folder) if "tfevents" in n]
    return os.path.join(folder, name)


SPECFORGE_STEPS = {step: {"train/loss": 2.0 / step, "train/acc": 0.1 * step,
                          "train/perf/global_samples_per_second": 40.0 + step}
                   for step in (5, 10, 15)}


def test_scalars_become_one_point_per_step_with_the_train_prefix_dropped(tmp_path):
    path = write_events(tmp_path, SPECFORGE_STEPS)
    event_file = read_event_file(path, open(path, "rb").read())
    assert event_file.problem is None and event_file.records == 4   # the file_version event too
    points = tensorboard_points([event_file])
    assert [p.step for p in points] == [5, 10, 15]
    assert points[0].loss == pytest.approx(0.4)
    assert points[2].metrics == pytest.approx({"acc": 1.5, "perf/global_samples_per_second": 55.0})


def test_a_cut_file_gives_its_whole_records_and_says_where_it_was_cut(tmp_path):
    path = write_events(tmp_path, SPECFORGE_STEPS)
    data = open(path, "rb").read()[:-7]
    event_file = read_event_file(path, data)
    assert [p.step for p in tensorboard_points([event_file])] == [5, 10]
    assert event_file.problem.startswith(f"cut at byte {whole_records(data)}")


def test_a_corrupt_record_stops_the_reading_there_and_says_so(tmp_path):
    path = write_events(tmp_path, SPECFORGE_STEPS)
    data = bytearray(open(path, "rb").read())
    data[len(data) - 10] ^= 0xFF                  # inside the last record's data
    event_file = read_event_file(path, bytes(data))
    assert [p.step for p in tensorboard_points([event_file])] == [5, 10]
    assert "corrupt record at byte" in event_file.problem


def test_a_crafted_record_length_is_not_read_into_memory(tmp_path):
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    length = struct.pack("<Q", 1 << 40)           # TensorBoard's loader would read 1 TiB at once
    data = length + struct.pack("<I", masked_crc32c(length)) + b"x" * 1000
    event_file = read_event_file("crafted.tfevents", data)
    assert event_file.records == 0 and event_file.problem.startswith("cut at byte 0")


def test_junk_is_no_points_and_a_clear_problem(tmp_path):
    event_file = read_event_file("junk.tfevents", os.urandom(4096))
    assert event_file.scalars == [] and event_file.problem


def test_tags_past_the_cap_are_counted_not_kept(tmp_path):
    path = write_events(tmp_path, {1: {f"train/t{i}": 1.0 for i in range(TAGS + 40)}})
    event_file = read_event_file(path, open(path, "rb").read())
    assert len({tag for _, tag, _ in event_file.scalars}) == TAGS and event_file.tags_left_out == 40


def test_without_the_reader_the_message_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_file_loader", None)
    with pytest.raises(ReaderMissing, match=r"pip install 'orch\[tensorboard\]'"):
        read_event_file("x", b"")
    write_events(tmp_path, SPECFORGE_STEPS)
    monitor = Monitor(Target("here", LocalTransport("here")), str(tmp_path / "run"),
                      MonitorSettings(tensorboard=str(tmp_path)), Sink())
    assert monitor.read_tensorboard()["error"] == READER_MISSING


# ------------------------------------------------------------------ collecting them
def test_collect_finds_event_files_in_subfolders_and_not_through_symlinks(tmp_path):
    write_events(tmp_path / "runs" / "a", {1: {"train/loss": 1.0}})
    write_events(tmp_path / "runs" / "b", {2: {"train/loss": 0.5}})
    (tmp_path / "runs" / "notes.txt").write_text("not an event file")
    outside = tmp_path / "elsewhere"
    write_events(outside, {3: {"train/loss": 9.0}})
    os.symlink(outside, tmp_path / "runs" / "link")
    found = collect_files(Target("here", LocalTransport("here")), str(tmp_path / "runs"))
    assert [f["path"].split("/")[0] for f in found["files"]] == ["a", "b"]
    assert all(f["read"] == f["size"] == len(f["data"]) for f in found["files"])


def test_collect_is_bounded_in_bytes_and_files(tmp_path):
    big = write_events(tmp_path, {step: {"train/loss": 1.0, "train/pad" * 50: 2.0}
                                  for step in range(1, 2000)})
    size = os.path.getsize(big)
    target = Target("here", LocalTransport("here"))
    found = collect_files(target, str(tmp_path), max_bytes=10_000)
    [entry] = found["files"]
    assert entry["size"] == size > 10_000 and entry["read"] == len(entry["data"]) == 10_000
    assert found["cut"] is True
    event_file = read_event_file(entry["path"], entry["data"])
    assert event_file.problem.startswith("cut at byte") and event_file.scalars
    for i in range(3):
        write_events(tmp_path / f"more{i}", {1: {"train/loss": 1.0}})
    found = collect_files(target, str(tmp_path), max_files=2)
    assert len(found["files"]) == 2 and found["left_out"] == 2


def test_collect_of_a_missing_path_is_a_typed_error(tmp_path):
    with pytest.raises(PayloadError, match="no such file or folder") as error:
        collect_files(Target("here", LocalTransport("here")), str(tmp_path / "none"))
    assert error.value.kind == "missing"


def test_the_monitor_says_a_missing_folder_in_its_record(tmp_path):
    monitor = Monitor(Target("here", LocalTransport("here")), str(tmp_path / "run"),
                      MonitorSettings(tensorboard=str(tmp_path / "none")), Sink())
    assert "no such file or folder" in monitor.read_tensorboard()["error"]


def test_orch_imports_the_monitor_without_tensorboard_installed():
    # only reading event files needs the optional package
    blocked = "import sys; sys.modules['tensorboard'] = None; import orchestrator.watch.monitor"
    assert subprocess.run([sys.executable, "-c", blocked]).returncode == 0
