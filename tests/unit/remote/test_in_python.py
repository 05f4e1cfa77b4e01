"""`python3 - ARGS` payloads run in a fork of a python3 already running in the container:
the reaper's (direct path) or the warm exec server's (payloads/_inproc.py). Same output,
exit codes and environment as a new interpreter; nothing the script does reaches the
process it was forked from."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from orchestrator.ground.errors import CommandTimeout
from orchestrator.payloads import payload_source
from orchestrator.remote.base import RunOptions
from orchestrator.remote.container import Target, reaped
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.session import ExecSession

pytestmark = pytest.mark.skipif(not shutil.which("python3"), reason="needs a python3 on PATH")

# sys.flags.isolated is 1 only in the reaper's / server's own `python3 -I -S`: the proof
# that the script ran in that interpreter, not in a new one
WHERE = b"import json, os, sys; print(json.dumps([sys.argv, sys.flags.isolated, " \
        b"os.environ.get('ORCH_T'), os.getpgid(0) == os.getpid()]))\n"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "ORCH_T": "from the command's env"}


def reaper_run(argv, script, in_python, timeout=30):
    return subprocess.run(reaped(argv, timeout, in_python), input=script, capture_output=True,
                          env=ENV, timeout=timeout)


def test_reaped_argv_asks_for_it_only_for_python3_dash():
    assert "--in-python" in reaped(["python3", "-", "{}"], 10, True)
    assert "--in-python" not in reaped(["python3", "-", "{}"], 10, False)
    assert "--in-python" not in reaped(["python3", "-c", "pass"], 10, True)
    assert "--in-python" not in reaped(["/root/venv/bin/python", "-", "{}"], 10, True)


def test_a_command_named_like_the_flag_is_still_the_command():
    done = subprocess.run(reaped(["--in-python", "python3", "-c", "print(1)"], 10), env=ENV,
                          capture_output=True, timeout=30)
    assert done.returncode == 127 and b"--in-python" in done.stderr and not done.stdout


@pytest.mark.parametrize("in_python", [False, True])
def test_the_reaper_runs_the_script_as_python3_dash_would(in_python):
    done = reaper_run(["python3", "-", "a b", "'c'"], WHERE, in_python)
    argv, isolated, env, own_group = json.loads(done.stdout)
    assert (done.returncode, argv, env, own_group) == (0, ["-", "a b", "'c'"],
                                                       ENV["ORCH_T"], True)
    assert isolated == (1 if in_python else 0)


def test_the_probe_answers_alike_in_the_reaper_and_in_a_new_python3():
    answers = [json.loads(reaper_run(["python3", "-", '{"venv": null}'], payload_source("probe"),
                                     in_python).stdout) for in_python in (False, True)]
    assert answers[0] == answers[1] and answers[0]["event"] == "result"


@pytest.mark.parametrize("script, code, stderr", [
    (b"raise SystemExit(3)", 3, b""),
    (b"import sys; sys.exit('said why')", 1, b"said why\n"),
    (b"print('partial')\nraise ValueError('boom')", 1, b"ValueError: boom"),
    (b"def (", 1, b"SyntaxError"),
])
def test_exits_and_errors_are_python3s(script, code, stderr):
    cold, warm = (reaper_run(["python3", "-"], script, in_python) for in_python in (False, True))
    assert warm.returncode == cold.returncode == code
    assert stderr in warm.stderr and stderr in cold.stderr and warm.stdout == cold.stdout
    assert b"run_here" not in warm.stderr   # the traceback starts at the script, as python3's


@pytest.fixture()
def session():
    session = ExecSession(Target("dev", LocalTransport()), python="python3")
    yield session
    session.close()


def test_the_session_forks_its_own_interpreter_only_when_asked(session):
    for in_python, isolated in ((False, 0), (True, 1)):
        done = session.run(["python3", "-", "x"], stdin=WHERE, env={"ORCH_T": "t"},
                           in_python=in_python)
        assert json.loads(done.stdout) == [["-", "x"], isolated, "t", True]


def test_a_script_cannot_break_the_session(session):
    hostile = (b"import os, sys\nsys.modules.clear()\nos.close(0)\nsys.stdout.close()\n"
               b"raise SystemExit(4)\n")
    assert session.run(["python3", "-"], stdin=hostile, in_python=True).exit_code == 4
    assert session.run(["python3", "-"], stdin=b"import os; os.kill(os.getppid(), 0); "
                       b"import sys; sys.stdout.write('x' * 300000)",
                       in_python=True).stdout == b"x" * 300000
    with pytest.raises(CommandTimeout):
        session.run(["python3", "-"], stdin=b"import time; time.sleep(60)", timeout=1,
                    in_python=True)
    done = session.run(["python3", "-", "again"], stdin=WHERE, in_python=True)
    assert done.exit_code == 0 and json.loads(done.stdout)[0] == ["-", "again"]


def test_the_script_travels_in_the_request_compiled_once_by_the_server(session):
    request, rest = session._request(["python3", "-", "{}"],
                                     RunOptions(stdin=b"print(1)", in_python=True))
    assert (request["in_python"], request["script"], rest) == (True, "print(1)", None)
    request, rest = session._request(["python3", "-"], RunOptions(stdin=b"print(1)"))
    assert "in_python" not in request and "script" not in request and rest == b"print(1)"
    latin = b"# -*- coding: latin-1 -*-\nprint(repr('\xe9'))\n"   # not UTF-8: stays on stdin
    request, rest = session._request(["python3", "-"], RunOptions(stdin=latin, in_python=True))
    assert "script" not in request and rest == latin
    assert session.run(["python3", "-"], stdin=latin, in_python=True).stdout == \
        "'\u00e9'\n".encode()
    # as after `python3 -` read its script: nothing left on stdin
    for _ in range(2):
        done = session.run(["python3", "-"], stdin=b"import sys; print(repr(sys.stdin.read()))",
                           in_python=True)
        assert done.stdout == b"''\n"
