"""The persistent command session, on the local transport."""

import json
import sys

import pytest

from orchestrator.errors import CommandTimeout, OrchError
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.session import ExecSession

from tests.unit.test_local_transport import ECHO_ARGV, HOSTILE


@pytest.fixture()
def session():
    session = ExecSession(Target("dev", LocalTransport()), python=sys.executable)
    yield session
    session.close()


def test_argv_stdin_and_exit_codes(session):
    assert json.loads(session.run(ECHO_ARGV + HOSTILE, check=True).text) == HOSTILE
    assert session.run(["cat"], stdin=b"\x00\xffbytes").stdout == b"\x00\xffbytes"
    assert [session.run(["sh", "-c", f"exit {c}"]).exit_code for c in (0, 1, 255)] == [0, 1, 255]


def test_timeout_then_the_session_still_works(session):
    with pytest.raises(CommandTimeout):
        session.run(["sleep", "5"], timeout=0.3)
    assert session.run(["echo", "ok"]).text == "ok\n"


def test_missing_program(session):
    with pytest.raises(OrchError, match="command not found"):
        session.run(["orch-no-such-program"])


def test_restarts_after_the_server_dies(session):
    session.run(["true"])
    session._process.close()
    assert session.run(["echo", "again"]).text == "again\n"


def test_bad_interpreter_is_a_clear_error():
    session = ExecSession(Target("dev", LocalTransport()), python="/nonexistent/python")
    with pytest.raises(OrchError, match="cannot start a command session"):
        session.run(["true"])
