"""The Proxmox-like sandbox as a pytest fixture for integration tests.

    def test_something(sandbox):
        inventory = sandbox.inventory_path       # STATE/inventory.yaml
        sandbox.link_down("sb1")                 # faults: see sandbox/orch_sandbox/handle.py

The sandbox (2 hosts sb1, sb2; CTs 200, 201 running, 202 stopped) is brought up once per
session (`up` is idempotent and repairs what earlier tests broke) and left up afterwards,
so the next run starts in about 0.05 s; ORCH_SANDBOX_TEARDOWN=1 takes it down at the end
(as scripts/own-sandbox-namespace.sh asks for the sandboxes it makes for extra workers).
Where the sandbox cannot run (not root, no LXC, ...) its tests are skipped with the reason;
with ORCH_REQUIRE_SANDBOX=1 (CI) they fail instead, so CI can never pass by skipping.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.ground.errors import OrchError
from orchestrator.targets.fleet import Fleet


def sandbox_required() -> bool:
    return os.environ.get("ORCH_REQUIRE_SANDBOX") == "1"


def sandbox_unavailable(reason: str):
    if sandbox_required():
        pytest.fail(f"ORCH_REQUIRE_SANDBOX=1 but the sandbox cannot run:\n{reason}",
                    pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(items):
    """Tests that use the sandbox are marked `sandbox` (select them with -m sandbox):
    scripts/test.sh runs them on pytest-xdist workers of their own, a test file at a time
    each, every worker with its own sandbox (they share its hosts and containers), and the
    rest beside them on other workers."""
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(scope="session")
def sandbox():
    try:
        import orch_sandbox as sb
    except ModuleNotFoundError:
        sandbox_unavailable("the sandbox distribution is not installed: pip install -e ./sandbox")
    missing = sb.missing_prerequisites()
    if missing:
        sandbox_unavailable(sb.describe(missing))
    try:
        handle = sb.up()
    except OrchError as error:
        sandbox_unavailable(f"orch sandbox up failed: {error}")
    yield handle
    if os.environ.get("ORCH_SANDBOX_TEARDOWN") == "1":
        sb.down()


@pytest.fixture(scope="module")
def fleet(sandbox):
    """One Fleet on the sandbox's inventory per test module (a module may define its own)."""
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def ct(fleet):
    """CT 200 of host sb1, the container most transport tests use."""
    return fleet.targets(["sb1-200"])[0]


@pytest.fixture(params=["direct", "agent"])
def cli_path(request, monkeypatch):
    """Runs a test's `orch` commands (`python -m orchestrator`, as `orch` itself) once on the
    direct path and once through the warm agent. ORCH_AGENT=require: a quick command the
    agent does not take fails instead of falling back, so the agent leg cannot pass by
    running in-process."""
    monkeypatch.setenv("ORCH_AGENT", "off" if request.param == "direct" else "require")
    return request.param
