"""Nights without a trainer: a fake runner, seeded baselines and histories, a webhook to
receive alerts, run numbers from one in each test."""

from __future__ import annotations

import http.server
import json
import sys
import threading

import pytest

from orchestrator.runs.store import RunStore
from tests.fixtures.synthetic import synthetic_run


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "dflash.yaml"
    path.write_text("name: dflash\n")
    return str(path)


RUNS = iter(range(1, 10_000))


@pytest.fixture(autouse=True)
def run_numbers_from_one(monkeypatch):
    """Each test numbers its synthetic runs from 1, so their seeds (and so their noise) do not
    depend on the tests that ran before it in the same process: pytest-xdist's order varies.
    Modules that use fake_runner import this fixture too."""
    monkeypatch.setattr(sys.modules[__name__], "RUNS", iter(range(1, 10_000)))


def fake_runner(**kw):
    """A stand-in for orchestrator.nightly.rerun.run_playbook that records one synthetic run."""
    calls = []

    def run(playbook, *, targets, extra_vars, **options):
        calls.append({"targets": targets, "extra_vars": extra_vars})
        n = next(RUNS)
        record = synthetic_run(f"20261129-{n:06d}-fake00", playbook=playbook, seed=n,
                               started_at=f"2026-11-29T{n // 60 % 24:02d}:{n % 60:02d}:00+00:00",
                               **kw)
        with RunStore() as store:
            store.begin(record)
        return record
    run.calls = calls
    return run


def seed_baseline(playbook, **kw):
    with RunStore() as store:
        store.begin(synthetic_run("20261128-020000-base00", playbook=playbook,
                                  started_at="2026-11-28T02:00:00+00:00", **kw))


# ------------------------------------------------------------------ notifications
class Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    status = 200

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(Hook.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    Hook.received, Hook.status = [], 200
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def seed_history(playbook, levels, tok_s=6000):
    """Earlier nightlies of the same shape, LEVELS oldest first (x tok_s)."""
    with RunStore() as store:
        for day, level in enumerate(levels, start=10):
            store.begin(synthetic_run(f"202611{day:02d}-020000-hist00", playbook=playbook,
                                      tok_s=tok_s * level, seed=day,
                                      started_at=f"2026-11-{day:02d}T02:00:00+00:00"))
