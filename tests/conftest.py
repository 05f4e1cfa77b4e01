"""Shared test settings: keep every test's orch data out of the user's home."""

import os
import shutil
import tempfile

import pytest

from tests.support.agents import stop_agents

_SESSION_DATA_DIR = tempfile.mkdtemp(prefix="orch-test-data-")
_SESSION_AGENT_DIR = tempfile.mkdtemp(prefix="orch-test-agent-")


def pytest_configure(config):
    # Module- and session-scoped fixtures run orch before any per-test setting applies:
    # give the whole session a data directory of its own too, never the user's store.
    os.environ["ORCH_DATA_DIR"] = _SESSION_DATA_DIR
    os.environ.pop("ORCH_STORE", None)
    # The warm agent (docs/guide/agent.md): the session's own socket folder, never the user's agent;
    # stopped at the end. Commands run on the direct path unless a test asks for the agent
    # (the cli_path fixture runs the exec and forensics tests both ways).
    os.environ["ORCH_AGENT_DIR"] = _SESSION_AGENT_DIR
    os.environ["ORCH_AGENT"] = "off"


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_DATA_DIR, ignore_errors=True)
    stop_agents(_SESSION_AGENT_DIR)
    shutil.rmtree(_SESSION_AGENT_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path_factory.mktemp("orch-data")))
