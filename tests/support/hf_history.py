"""A run of scripts/hf_tiny_trainer.py (20 steps, a log every 5) against the log_history it
wrote itself: what orch recorded from its log must be that history, entry for entry."""

from __future__ import annotations

import pytest


def assert_recorded_as_history(record, history: list[dict], extra: str) -> dict:
    """record's metrics are history's logged entries (steps 5, 10, 15, 20), their loss and the
    field extra step by step, and the closing summary's train_runtime joins the last point.
    Returns the closing summary (history's last entry) for more checks."""
    logged, closing = history[:-1], history[-1]
    assert [p.step for p in record.metrics] == [e["step"] for e in logged] == [5, 10, 15, 20]
    for point, entry in zip(record.metrics, logged):
        assert point.loss == pytest.approx(entry["loss"], rel=1e-3)
        assert point.extra[extra] == pytest.approx(entry[extra], rel=1e-3)
    assert record.metrics[-1].extra["train_runtime"] == pytest.approx(closing["train_runtime"], rel=1e-3)
    return closing
