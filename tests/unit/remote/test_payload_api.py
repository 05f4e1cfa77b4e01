"""The controller's payload API against a fake transport: what each function ships (which
payload, which interpreter, which arguments, argv or stdin), how it reads the JSON lines
back, and which typed error each way of failing raises. The payloads themselves run for real
in tests/unit/test_payload_*.py and, in containers, in tests/integration."""

from __future__ import annotations

import ast
import json

import pytest

from orchestrator import __version__

from orchestrator.targets import inventory_check

from orchestrator.remote import payload_api
from orchestrator.ground.errors import (ConnectionProblem, HostUnreachable, OrchError, PayloadError,
                                 PayloadNoResult, PythonUnavailable)
from orchestrator.payloads import payload_source
from orchestrator.remote.base import Result, Transport
from orchestrator.remote.container import Target


class FakeHost(Transport):
    """Answers every command with the next scripted (exit code, stdout lines, stderr);
    stdout is fed to the caller in small chunks that split lines, as a channel does."""

    name = "pve"

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[dict] = []
        self.spawned: list[list[str]] = []

    def _run(self, argv, options):
        stdin = options.stdin if isinstance(options.stdin, (bytes, type(None))) else b"".join(options.stdin)
        self.calls.append({"argv": argv, "stdin": stdin, "timeout": options.timeout})
        code, lines, stderr = self.answers.pop(0)
        out = "".join(line + "\n" for line in lines).encode()
        for start in range(0, len(out), 7):
            if options.on_stdout:
                options.on_stdout(out[start:start + 7])
        return Result(argv, code, out, stderr.encode(), 0.0)

    def spawn(self, argv):
        self.spawned.append(argv)
        return "the process"


def result(**fields) -> str:
    return json.dumps({"event": "result", **fields})


def target(*answers, venv=None, gpus=()) -> tuple[Target, FakeHost]:
    host = FakeHost(*answers)
    return Target("ct1", host, venv=venv, gpus=gpus), host


def args_of(call: dict) -> dict:
    """The arguments a payload got: in argv, or set by the first line of its script on stdin."""
    if len(call["argv"]) > 2:
        return json.loads(call["argv"][2])
    header = call["stdin"].split(b"\n", 1)[0].decode()
    return json.loads(ast.literal_eval(header.split(" = ", 1)[1].split("  # orch", 1)[0])[0])


# ------------------------------------------------------------------------ run_payload
def test_the_result_line_is_returned_and_earlier_events_reach_on_event():
    t, host = target((0, ["a library prints this", json.dumps({"event": "hit", "n": 1}),
                          "{not json", result(answer=42)], ""))
    seen = []
    found = payload_api.run_payload(t, "torch_locate", {"package": "x"}, on_event=seen.append)
    assert found == {"event": "result", "answer": 42}
    assert seen == [{"event": "hit", "n": 1}]
    assert host.calls[0]["argv"] == ["python3", "-", '{"package": "x"}']
    assert host.calls[0]["stdin"] == payload_source("torch_locate")


def test_an_error_line_is_a_payload_error_with_its_kind():
    t, _ = target((1, [json.dumps({"event": "error", "message": "torch is not installed",
                                   "kind": "not-installed"})], ""))
    with pytest.raises(PayloadError, match="ct1: torch is not installed") as raised:
        payload_api.run_payload(t, "torch_locate", {})
    assert raised.value.kind == "not-installed" and type(raised.value) is PayloadError


@pytest.mark.parametrize("code, stderr", [(127, "sh: 1: /root/venv/bin/python: not found"),
                                          (126, "permission denied"),
                                          (1, "exec: /root/venv/bin/python: No such file or directory")])
def test_an_interpreter_that_cannot_run_says_so_with_a_hint(code, stderr):
    t, _ = target((code, [], stderr), venv="/root/venv")
    with pytest.raises(PythonUnavailable, match="ct1: cannot run /root/venv/bin/python") as raised:
        payload_api.run_payload(t, "torch_locate", {})
    assert "bootstrapped" in raised.value.hint and not isinstance(raised.value, PayloadError)


def test_a_payload_that_dies_without_a_word_shows_its_stderr():
    t, _ = target((1, [json.dumps({"event": "hit"})], "Traceback ...\nMemoryError"))
    with pytest.raises(PayloadNoResult, match=r"payload fx_race ended with exit code 1 and "
                                              r"no result:\n  \| Traceback ...\n  \| MemoryError"):
        payload_api.run_payload(t, "fx_race", {})


def test_transport_errors_pass_through_untouched():
    class Unreachable(FakeHost):
        def _run(self, argv, options):
            raise HostUnreachable("pve: no route to host")
    with pytest.raises(HostUnreachable):
        payload_api.probe(Target("ct1", Unreachable()))


def test_parse_event_takes_text_or_bytes_and_only_protocol_lines():
    assert payload_api.parse_event(b'  {"event": "beat", "offset": 3}\n') == {"event": "beat", "offset": 3}
    assert payload_api.parse_event('{"event": "data", "text": "\xe9"}')["text"] == "\xe9"
    for other in ('{"no_event": 1}', "[1, 2]", "{broken", "plain text", b"\xff\xfe", ""):
        assert payload_api.parse_event(other) is None


# ------------------------------------------------------------------------ each payload
def test_locate():
    t, host = target((0, [result(version="2.13.0")], ""), venv="/opt/v")
    assert payload_api.locate(t, "numpy")["version"] == "2.13.0"
    assert host.calls[0]["argv"][0] == "/opt/v/bin/python"
    assert args_of(host.calls[0]) == {"package": "numpy"}


def test_search_collects_hits_and_definitions_and_forwards_every_event():
    hit = {"event": "hit", "path": "a.py", "line": 3}
    definition = {"event": "def", "path": "b.py", "line": 9}
    progress = {"event": "progress", "files": 10}
    t, host = target((0, [json.dumps(e) for e in (hit, progress, definition)] + [result(files=10)], ""))
    seen = []
    found = payload_api.search(t, "is_fx_tracing", fixed=True, mode="def", on_event=seen.append)
    assert found["matches"] == [hit, definition] and found["files"] == 10
    assert seen == [hit, progress, definition]
    sent = args_of(host.calls[0])
    assert (sent["pattern"], sent["fixed"], sent["mode"], sent["package"]) == ("is_fx_tracing", True, "def", "torch")
    assert host.calls[0]["timeout"] == payload_api.SEARCH_TIMEOUT


def test_source_read():
    t, host = target((0, [result(text="def f():\n")], ""))
    assert payload_api.source_read(t, "torch", "fx/_symbolic_trace.py", 10, 20, max_bytes=99)["text"]
    assert args_of(host.calls[0]) == {"package": "torch", "path": "fx/_symbolic_trace.py",
                                      "start_line": 10, "end_line": 20, "max_bytes": 99}


def test_fx_patch_sends_the_version_and_refuses_an_unknown_action():
    t, host = target((0, [result(state="patched")], ""))
    assert payload_api.fx_patch(t, "apply")["state"] == "patched"
    assert args_of(host.calls[0]) == {"action": "apply", "patch_set": "fx-tls",
                                      "orch_version": __version__}
    with pytest.raises(ValueError, match="unknown fx-tls action"):
        payload_api.fx_patch(t, "explode")
    assert len(host.calls) == 1


def test_a_busy_patch_lock_is_its_own_error_and_exit_code():
    from orchestrator.ground.errors import ExitCode, PatchBusy
    busy = json.dumps({"event": "error", "kind": "busy",
                       "message": "another orch patch action is changing torch"})
    t, host = target((1, [busy], ""))
    with pytest.raises(PatchBusy) as caught:
        payload_api.fx_patch(t, "status", patch_set="fx-threads")
    assert caught.value.exit_code == ExitCode.LOCKED != ExitCode.FAILED
    assert args_of(host.calls[0])["patch_set"] == "fx-threads"


def test_fx_race_streams_its_trials():
    trial = {"event": "trial", "index": 1, "cross_thread_raised": True}
    t, host = target((0, [json.dumps(trial), result(verdict="vulnerable")], ""))
    seen = []
    assert payload_api.fx_race(t, 3, on_event=seen.append)["verdict"] == "vulnerable"
    assert seen == [trial] and args_of(host.calls[0]) == {"trials": 3, "timeout": 120}


def test_probe_runs_with_the_system_python_and_names_the_venv():
    t, host = target((0, [result(python_version="3.11.2", gpus=None)], ""), venv="/root/venv")
    assert payload_api.probe(t)["python_version"] == "3.11.2"
    assert host.calls[0]["argv"][0] == "python3"          # not the venv's: it may be missing
    assert args_of(host.calls[0]) == {"venv": "/root/venv"}


def test_bootstrap_merges_its_action_and_streams_pip():
    pip = {"event": "pip", "line": "Successfully installed x"}
    t, host = target((0, [json.dumps(pip), result(changed=True)], ""))
    seen = []
    assert payload_api.bootstrap(t, "install", python="python3.11", timeout=5, on_event=seen.append,
                                 venv="/v", packages=["x==1"])["changed"]
    assert host.calls[0]["argv"][0] == "python3.11" and seen == [pip]
    assert args_of(host.calls[0]) == {"action": "install", "venv": "/v", "packages": ["x==1"]}


def test_the_launcher_ships_its_arguments_on_stdin_never_in_argv():
    t, host = target((0, [result(state="running", pid=7)], ""), venv="/root/venv")
    found = payload_api.launcher(t, "start", "/var/tmp/run", argv=["python", "train.py"],
                                 env={"HF_TOKEN": "hf_secret"})
    assert found["pid"] == 7
    call = host.calls[0]
    assert call["argv"] == ["python3", "-"] and "hf_secret" not in " ".join(call["argv"])
    assert args_of(call)["env"] == {"HF_TOKEN": "hf_secret"} and args_of(call)["action"] == "start"
    assert call["stdin"].endswith(payload_source("launcher"))


def test_explain_frames_ships_a_long_tracebacks_frames_on_stdin():
    """Thousands of frames pass the kernel's limit on one argv string (128 KiB)."""
    frames = [{"file": f"/venv/lib/python3.11/site-packages/pkg/m{i}.py", "line": i,
               "function": "f", "innermost": False} for i in range(3000)]
    t, host = target((0, [result(frames=[], files={}, modules={})], ""), venv="/root/venv")
    assert payload_api.explain_frames(t, frames, roots=["/root/run"])["frames"] == []
    call = host.calls[0]
    assert call["argv"] == ["/root/venv/bin/python", "-"]
    assert args_of(call) == {"frames": frames, "roots": ["/root/run"], "context": 3, "ran_at": None}
    assert call["stdin"].endswith(payload_source("explain_frames"))


def test_stop_run_waits_past_its_grace():
    t, host = target((0, [result(already=False, sent="SIGTERM")], ""))
    payload_api.stop_run(t, "/var/tmp/run", grace=4, reason="hang")
    assert host.calls[0]["timeout"] == 34
    assert args_of(host.calls[0]) == {"action": "stop", "run_dir": "/var/tmp/run", "grace": 4,
                                      "reason": "hang"}


def test_a_launcher_error_is_a_payload_error():
    t, _ = target((1, [json.dumps({"event": "error", "message": "a run is already going in /r",
                                   "kind": "failed"})], ""))
    with pytest.raises(PayloadError, match="already going"):
        payload_api.launcher(t, "start", "/r", argv=["true"])


def test_the_tail_starts_at_once_with_its_source_in_argv():
    t, host = target()
    assert payload_api.start_tail(t, "/var/tmp/run", offset=12, gpu_every=5) == "the process"
    python, unbuffered, dash_c, source, args = host.spawned[0]
    assert (python, unbuffered, dash_c) == ("python3", "-u", "-c")
    assert source == payload_source("launcher").decode()
    assert json.loads(args) == {"action": "tail", "run_dir": "/var/tmp/run", "offset": 12, "gpu_every": 5}


# ------------------------------------------------------------------------ inventory check
def probe_answer(**fields) -> tuple:
    base = {"python_version": "3.11.2", "venv": None, "gpus": None, "ripgrep": True}
    return (0, [result(**{**base, **fields})], "")


def test_check_target_judges_the_probe_against_the_inventory():
    t, _ = target(probe_answer(venv={"path": "/root/venv", "present": False},
                               gpus=[{"index": 0, "name": "H200", "utilization_pct": 3.0}]),
                  venv="/root/venv", gpus=(0, 1))
    report = inventory_check.check_target(t)
    assert report["ok"] is False and report["reachable"] and report["running"]
    assert report["problems"] == ["venv /root/venv missing", "GPUs [1] not seen by nvidia-smi"]
    t, _ = target(probe_answer(gpus=None), gpus=(0,))
    assert inventory_check.check_target(t)["problems"] == ["no nvidia-smi in the container"]
    t, _ = target(probe_answer())
    assert inventory_check.check_target(t)["ok"] is True


def test_check_target_reports_a_missing_python3_with_its_install_command():
    os_release = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
    t, _ = target((127, [], "python3: not found"),          # the probe
                  (127, [], "python3: not found"),          # python3 -c pass
                  (0, os_release.splitlines(), ""))         # cat /etc/os-release
    report = inventory_check.check_target(t)
    assert report["ok"] is False and report["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert "python3 is not installed (Debian GNU/Linux 12 (bookworm))" in report["problems"][0]
    assert any("apt-get install" in fix for fix in report["fix"])


def test_check_target_raises_what_is_not_a_missing_python():
    t, _ = target((1, [json.dumps({"event": "error", "message": "probe broke"})], ""))
    with pytest.raises(PayloadError):
        inventory_check.check_target(t)


def test_check_targets_gives_one_row_per_target_errors_included():
    good, _ = target(probe_answer())

    class Unreachable(FakeHost):
        def _run(self, argv, options):
            raise HostUnreachable("pve2: no route to host")
    bad = Target("ct2", Unreachable())
    rows = inventory_check.check_targets([good, bad])
    assert [r["target"] for r in rows] == ["ct1", "ct2"]
    assert rows[0]["ok"] and rows[0]["where"] == "ct1 (host pve)"
    assert rows[1] == {"target": "ct2", "where": "ct2 (host pve)", "ok": False, "reachable": False,
                       "running": False, "error": "pve2: no route to host"}
    assert inventory_check.reachable(OrchError("x")) and not inventory_check.reachable(ConnectionProblem("y"))


def test_row_texts_are_short_cells_and_the_problems_as_sentences():
    assert inventory_check.row_texts({"python_version": "3.8.10", "venv": {"path": "/v", "present": True},
                                      "gpus": [{"index": 0}, {"index": 2}], "problems": []}) == {
        "python": "3.8.10", "venv": "ok", "gpus": "0,2", "problems": []}
    assert inventory_check.row_texts({"error": "unreachable"}) == {
        "python": "-", "venv": "-", "gpus": "-", "problems": ["unreachable"]}
    assert inventory_check.row_texts({"venv": {"path": "/v", "present": False}, "gpus": [],
                                      "problems": ["venv /v missing"]}) == {
        "python": "-", "venv": "missing", "gpus": "none", "problems": ["venv /v missing"]}
    texts = inventory_check.row_texts({"gpus": {"error": "NVML failed"}, "problems": ["a", "b"]})
    assert texts["gpus"] == "error" and texts["problems"] == ["a", "b", "nvidia-smi: NVML failed"]
