"""TensorBoard event files as metric points, read on the controller with TensorBoard's own
loader (the `tensorboard` package, the optional extra `orch[tensorboard]`).

A trainer with a TensorBoard writer (SpecForge's `tracking.report_to: tensorboard`, a Hugging
Face Trainer's `report_to="tensorboard"`, torch.utils.tensorboard) logs each scalar as a
(tag, step, value). The container only hands the files over (payloads/collect_files.py);
they are parsed here, after two bounds of our own, since the files are container output:
- framing: a record is an 8-byte length, 4 bytes of CRC, the data, 4 more bytes of CRC. The
  loader reads the length's count of bytes in one go (a crafted length is a MemoryError),
  so it is given only the whole records, and what follows them is said to be cut;
- size: at most TAGS distinct tags are kept (the rest counted), and the bytes were bounded
  when collected.
The loader stops quietly at a corrupt record (a CRC that does not match): the bytes it did
not consume say so. docs/design/trainer-logs.md has the tags SpecForge and the Trainer write.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.watch.logformats import LogPoint, number

READER_MISSING = ("reading TensorBoard event files needs the tensorboard package on the "
                  "controller: pip install 'orch[tensorboard]'")
TAGS = 256
_RECORD_OVERHEAD = 16          # length (8) + its CRC (4) + the data's CRC (4)
_PREFIXES = ("train/",)        # SpecForge's and the Trainer's namespace for training numbers
_TOK_S = "train_tokens_per_second"


class ReaderMissing(RuntimeError):
    """The controller has no tensorboard package."""


@dataclass
class EventFile:
    """What one event file gave: its scalars and, where it was not read to its end, why."""

    path: str
    scalars: list = field(default_factory=list)   # (step, tag, value) in file order
    records: int = 0
    problem: Optional[str] = None
    tags_left_out: int = 0


def whole_records(data: bytes) -> int:
    """The length of the prefix of data made of whole records (by their length fields only)."""
    offset = 0
    while offset + 8 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        end = offset + _RECORD_OVERHEAD + length
        if end > len(data):
            break
        offset = end
    return offset


def read_event_file(path: str, data: bytes) -> EventFile:
    """The scalars of one event file (its bytes; path names it in messages)."""
    loader = _loader()
    result = EventFile(path)
    whole = whole_records(data)
    with tempfile.NamedTemporaryFile(prefix="orch-tfevents-", delete=False) as handle:
        handle.write(data[:whole])
    try:
        consumed = _read_records(loader, handle.name, result)
    finally:
        os.unlink(handle.name)
    if consumed < whole:
        result.problem = (f"corrupt record at byte {consumed} (its checksum does not match): "
                          f"the {len(data) - consumed} bytes from there on were not read")
    elif whole < len(data):
        result.problem = (f"cut at byte {whole}: the last {len(data) - whole} bytes are not a "
                          "whole record (the file was still being written, or was collected "
                          "only in part)")
    return result


def _read_records(loader, path: str, result: EventFile) -> int:
    raw_loader, event_from, migrate, make_ndarray = loader
    consumed, tags = 0, set()
    for record in raw_loader(path).Load():
        consumed += _RECORD_OVERHEAD + len(record)
        result.records += 1
        try:
            event = migrate(event_from(record))
        except Exception:   # protobuf's DecodeError and its kin: a record that is no event
            return consumed - _RECORD_OVERHEAD - len(record)
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name != "scalars":
                continue
            array = make_ndarray(value.tensor)
            if array.size != 1:
                continue
            if value.tag not in tags and len(tags) >= TAGS:
                result.tags_left_out += 1
                continue
            try:
                scalar = number(float(array.reshape(-1)[0]))
            except (TypeError, ValueError):
                continue   # a "scalar" that is text
            if scalar is None:
                continue   # NaN or infinite: no point to draw
            tags.add(value.tag)
            result.scalars.append((int(event.step), value.tag, scalar))
    return consumed


def _loader():
    """TensorBoard's record loader and its read-time compat (old simple_value scalars into
    today's tensor form); ReaderMissing without the package."""
    try:
        # the optional extra orch[tensorboard]: imported only when event files are read
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto import event_pb2
        from tensorboard import data_compat
        from tensorboard.util import tensor_util
    except ImportError:
        raise ReaderMissing(READER_MISSING) from None
    return RawEventFileLoader, event_pb2.Event.FromString, data_compat.migrate_event, \
        tensor_util.make_ndarray


def tensorboard_points(files: list[EventFile], worker: int = 0) -> list[LogPoint]:
    """One point per step across the files (in file order: a later file's value for a tag at
    a step wins, as after a restart): `train/loss` is the loss, `train_tokens_per_second` the
    tok/s, every other tag a metric under its name without the `train/` prefix."""
    by_step: dict[int, dict] = {}
    for event_file in files:
        for step, tag, value in event_file.scalars:
            by_step.setdefault(step, {})[_name(tag)] = value
    points = []
    for step in sorted(by_step):
        metrics = dict(by_step[step])
        points.append(LogPoint(step=step, worker=worker, loss=metrics.pop("loss", None),
                               tok_s=metrics.pop(_TOK_S, None), metrics=metrics))
    return points


def _name(tag: str) -> str:
    for prefix in _PREFIXES:
        if tag.startswith(prefix):
            return tag[len(prefix):]
    return tag
