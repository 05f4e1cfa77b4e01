"""The local transport and the Target layer on it: argv arrives exactly, pipes never block."""

import sys

import pytest
from hypothesis import given, settings, strategies as st

from orchestrator.ground.errors import (CommandFailed, CommandTimeout, ContainerNotRunning,
                                 NoSuchContainer, OrchError)
from orchestrator.remote.base import (STREAMED_TAIL_BYTES, LineSplitter, Result, Transport,
                                      validate_argv)
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from tests.support.argv import ECHO_ARGV, HOSTILE

ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)


@pytest.fixture(scope="module")
def target():
    return Target("dev", LocalTransport("here"))


def test_hostile_strings_arrive_exactly(target):
    import json
    result = target.run(ECHO_ARGV + HOSTILE, check=True)
    assert json.loads(result.text) == HOSTILE


@settings(max_examples=40, deadline=None)
@given(st.lists(ARG, max_size=6))
def test_any_argv_round_trips(target, args):
    import json
    assert json.loads(target.run(ECHO_ARGV + args, check=True).text) == args


@pytest.mark.parametrize("code", [0, 1, 2, 100, 254, 255])
def test_exit_codes_propagate(target, code):
    assert target.run(["sh", "-c", f"exit {code}"]).exit_code == code


def test_big_stdout_and_stderr_at_once(target):
    script = ("import sys\nchunk = b'x' * 65536\nfor _ in range(160):\n"
              "    sys.stdout.buffer.write(chunk); sys.stderr.buffer.write(chunk)\n")
    result = target.run([sys.executable, "-c", script], timeout=60, check=True)
    assert len(result.stdout) == len(result.stderr) == 160 * 65536


def test_timeout_kills_and_says_so(target):
    with pytest.raises(CommandTimeout, match="did not finish within 0.5 s"):
        target.run(["sleep", "30"], timeout=0.5)


def test_check_raises_with_exit_code_and_stderr(target):
    with pytest.raises(CommandFailed) as caught:
        target.run(["sh", "-c", "echo boom >&2; exit 3"], check=True)
    assert caught.value.result.exit_code == 3 and "boom" in str(caught.value)


def test_missing_program_is_a_clear_error(target):
    with pytest.raises(OrchError, match="command not found"):
        target.run(["orch-no-such-program"])


def test_stdin_and_streaming(target):
    chunks = []
    result = target.run(["cat"], stdin=b"hello\nworld\n", on_stdout=chunks.append)
    assert result.stdout == b"hello\nworld\n" == b"".join(chunks)


def test_put_get_roundtrip_with_awkward_path(target, tmp_path):
    path = str(tmp_path / "a dir $x" / "f'ile")
    (tmp_path / "a dir $x").mkdir()
    data = bytes(range(256)) * 100
    target.put(path, data, mode=0o600)
    assert target.get(path) == data


def test_argv_must_be_a_list():
    with pytest.raises(TypeError):
        validate_argv("ls -l")
    with pytest.raises(ValueError):
        validate_argv([])
    with pytest.raises(ValueError, match="NUL"):
        validate_argv(["a\0b"])


def test_line_splitter_keeps_partial_lines():
    lines = []
    splitter = LineSplitter(lines.append)
    for chunk in (b"ab", b"c\nde", b"f\n\ng"):
        splitter.feed(chunk)
    assert lines == ["abc", "def", ""]
    splitter.flush()
    assert lines[-1] == "g"


def test_container_wraps_with_pct_exec():
    container = Target("ct", LocalTransport("pve"), vmid=200)
    path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # --keep-env 0: nothing of the host session's environment reaches the container
    assert container.wrap(["echo", "a b"]) == ["pct", "exec", "200", "--keep-env", "0", "--",
                                               "env", "--", path, "echo", "a b"]
    pinned = Target("ct", LocalTransport("pve"), vmid=200, env={"PATH": "/opt/bin"})
    assert pinned.wrap(["rg"])[6:] == ["env", "--", "PATH=/opt/bin", "rg"]
    # env would take a program named with '=' for an assignment: sh's exec runs it instead
    assert container.wrap(["/bin/a=b"])[6:] == ["env", "--", path, "sh", "-c", 'exec "$@"',
                                                "sh", "/bin/a=b"]


def test_a_containers_variables_reach_pct_through_a_cleared_environment_never_its_argv():
    """With variables, the host runs `sh -c 'exec env -i -- PATH="$PATH" "$@"' K=V pct exec
    VMID --keep-env 1 -- ...`: lxc-attach (which lives as long as the command) gets them in
    its environment, not its argv, and nothing else of the host session."""
    seen = []

    class Host(LocalTransport):
        def _run(self, argv, options):
            seen.append((argv, dict(options.env)))
            return Result(argv, 0, b"", b"", 0.0)

    Target("ct", Host("pve"), vmid=200).run(["true"], env={"HF_TOKEN": "hf_x", "PATH": "/opt/bin"})
    argv, host_env = seen[0]
    assert host_env == {}
    assert argv[:6] == ["sh", "-c", 'exec env -i -- PATH="$PATH" "$@"', "orch-env", "HF_TOKEN=hf_x", "pct"]
    pct_exec = argv[5:]
    assert pct_exec[:6] == ["pct", "exec", "200", "--keep-env", "1", "--"]
    assert "hf_x" not in " ".join(pct_exec) and "PATH=/opt/bin" in pct_exec


def test_a_pct_without_keep_env_gets_the_command_once_without_it():
    """pct before pve-container 5.0.9 refuses the option in its parameter check (nothing
    ran): the command runs again without it, and the host is remembered."""
    refusal = ("Unknown option: keep-env\n400 unable to parse option\n"
               "pct exec <vmid> [<extra-args>]\n")

    class OldPct(Transport):
        name = "old-pve"
        calls: list = []

        def _run(self, argv, options):
            self.calls.append(argv)
            if "--keep-env" in argv:
                return Result(argv, 255, b"", refusal.encode(), 0.1)
            return Result(argv, 0, b"ran\n", b"", 0.1)

    host = OldPct()
    container = Target("ct", host, vmid=200)
    assert container.run(["true"]).text == "ran\n"
    assert container.run(["true"]).text == "ran\n"
    assert ["--keep-env" in argv for argv in host.calls] == [True, False, False]


def test_a_streamed_output_keeps_only_its_tail_in_the_result():
    seen = []
    result = LocalTransport("here").run(
        ["sh", "-c", "head -c 100000 /dev/zero; echo the-end >&2"], capture=False,
        on_stdout=seen.append)
    assert sum(map(len, seen)) == 100000
    assert len(result.stdout) == STREAMED_TAIL_BYTES and result.stderr == b"the-end\n"


class ScriptedHost(Transport):
    """A host whose `pct exec` answers are given, and whose `pct status` says `status`."""
    name = "pve"

    def __init__(self, answer, status="status: running\n", status_code=0):
        self.answer, self.status, self.status_code = answer, status, status_code
        self.calls = []

    def _run(self, argv, options):
        self.calls.append(argv[:2])
        if argv[:2] == ["pct", "status"]:
            return Result(argv, self.status_code, self.status.encode(), b"", 0.0)
        code, stdout, stderr = self.answer
        return Result(argv, code, stdout, stderr, 0.0)


NOT_RUNNING = b"container '200' not running!\n"
NO_CONFIG = b"Configuration file 'nodes/pve/lxc/200.conf' does not exist\n"


@pytest.mark.parametrize("answer, status, status_code, raised", [
    ((2, b"", NOT_RUNNING), "status: stopped\n", 0, ContainerNotRunning),
    ((13, b"", NOT_RUNNING), "status: stopped\n", 0, ContainerNotRunning),   # any errno
    ((2, b"", NO_CONFIG), "", 2, NoSuchContainer),
    ((255, b"", NO_CONFIG), "", 2, NoSuchContainer),
    ((2, b"", b"perl: warning: Setting locale failed.\n" + NOT_RUNNING), "status: stopped\n", 0,
     ContainerNotRunning),
    # the command printed pct's sentence itself: pct status disagrees
    ((2, b"", NOT_RUNNING), "status: running\n", 0, None),
    ((2, b"", NO_CONFIG), "status: running\n", 0, None),
])
def test_pct_errors_are_confirmed_before_they_are_raised(answer, status, status_code, raised):
    host = ScriptedHost(answer, status, status_code)
    container = Target("ct", host, vmid=200)
    if raised is None:
        assert container.run(["true"]).exit_code == answer[0]
    else:
        with pytest.raises(raised):
            container.run(["true"])
    assert host.calls[-1] == ["pct", "status"]


@pytest.mark.parametrize("answer", [
    (2, b"some output\n", NOT_RUNNING),                      # the command ran: it printed
    (2, b"", NOT_RUNNING + b"retrying\n"),                   # the sentence is not the end
    (2, b"", b"container '201' not running!\n"),             # another CT's sentence
    (1, b"", b"No such file or directory\n"),
    (0, b"", NOT_RUNNING),                                   # success is never pct's error
])
def test_pct_status_is_not_asked_unless_the_text_is_exactly_pcts(answer):
    host = ScriptedHost(answer, "status: stopped\n")
    assert Target("ct", host, vmid=200).run(["true"]).exit_code == answer[0]
    assert ["pct", "status"] not in host.calls
