"""inventory check's rows when the probe fails: a host that failed is not asked again."""

from __future__ import annotations

import pytest

from orchestrator.ground.errors import ConnectionLost, HostUnreachable
from orchestrator.remote import payload_api
from orchestrator.targets import inventory_check


class Unasked:
    """A target that must not be run on again (its host already failed)."""

    name, vmid, gpus, venv = "sb3-200", 200, [], None

    def describe(self):
        return "sb3-200 (CT 200 on host sb3)"

    def run(self, *args, **kwargs):
        raise AssertionError("asked the failed host again")


@pytest.mark.parametrize("error", [HostUnreachable("cannot reach host sb3: timed out"),
                                   ConnectionLost("host sb3: connection lost")])
def test_a_failed_host_is_reported_without_asking_it_again(monkeypatch, error):
    def failing_probe(target):
        raise error
    monkeypatch.setattr(payload_api, "probe", failing_probe)
    rows = inventory_check.check_targets([Unasked()])
    assert rows == [{"target": "sb3-200", "where": "sb3-200 (CT 200 on host sb3)", "ok": False,
                     "reachable": False, "running": False, "error": str(error)}]
