"""The shell step on a fake host: plan lines, output, register/when, failures, retries."""

from __future__ import annotations

import pytest

from orchestrator.ground.errors import ConfigError, ConnectionLost, ExitCode
from orchestrator.ground.verdicts import exit_code_for
from orchestrator.playbook.steps.base import StepFailed
from tests.support.step_fakes import Reply, harness

TWO_STEPS = """\
    name: t
    targets: [dev]
    vars: {greeting: hello}
    steps:
      - name: greet
        shell: {argv: [echo, "{{ greeting }}", "{{ target.name }}"], env: {TOKEN: s3cret}}
        register: out
      - name: again
        shell: [printf, "{{ out.stdout_lines[0] }}"]
        when: out.rc == 0
"""


def test_plan_renders_argv_and_hides_env_values(tmp_path):
    h = harness(tmp_path, TWO_STEPS, dry_run=True)
    record = h.record()
    plans = h.reporter.of("step_plan")
    assert plans[0] == ("step_plan", "dev", "greet", ["TOKEN=... echo hello dev"])
    # the second step's when needs a registered result: decided at run time, planned anyway
    assert plans[1][3][0] == "when: out.rc == 0  (decided at run time: needs out.rc)"
    # a registered value inside a string renders as a placeholder in the plan
    assert plans[1][3][1] == "printf '<out.stdout_lines[0]>'"
    assert h.host.calls == []                     # a dry run touches nothing
    assert record.steps == [] and h.recorder.names() == []


def test_run_streams_output_registers_and_feeds_the_next_step(tmp_path):
    h = harness(tmp_path, TWO_STEPS)
    h.host.on_argv(["echo"], stdout=b"hello dev\n")
    h.host.on_argv(["printf"], stdout=b"hello dev")
    record = h.record()
    assert [c.argv for c in h.host.calls] == [["echo", "hello", "dev"], ["printf", "hello dev"]]
    assert h.host.calls[0].env == {"TOKEN": "s3cret"}
    assert ("step_output", "dev", "greet", "hello dev", "stdout") in h.reporter.events
    assert [(s.name, s.status) for s in record.steps] == [("greet", "changed"), ("again", "changed")]
    assert record.steps[0].data["stdout_lines"] == ["hello dev"]
    assert record.verdict == "ok" and record.exit_code == ExitCode.OK
    assert h.recorder.names() == ["save_step", "save_step"]


def test_when_false_skips_and_registers_skipped(tmp_path):
    h = harness(tmp_path, """\
        name: t
        targets: [dev]
        steps:
          - name: maybe
            shell: [echo, x]
            when: "{{ 1 > 2 }}"
            register: maybe
          - name: after
            shell: [echo, "{{ maybe.status }}"]
        """)
    h.host.on_argv(["echo"], stdout=b"")
    record = h.record()
    assert record.steps[0].status == "skipped"
    assert record.steps[0].message == "when: {{ 1 > 2 }} is false"
    assert [c.argv for c in h.host.calls] == [["echo", "skipped"]]


def test_nonzero_exit_fails_skips_later_steps_but_not_always(tmp_path):
    h = harness(tmp_path, """\
        name: t
        targets: [dev]
        steps:
          - name: breaks
            shell: [false-ish]
          - name: never
            shell: [echo, never]
          - name: cleanup
            shell: [echo, cleanup]
            always: true
        """)
    h.host.on_argv(["false-ish"], exit_code=3, stderr=b"it broke\n")
    h.host.on_argv(["echo"], stdout=b"cleanup\n")
    record = h.record()
    statuses = [(s.name, s.status) for s in record.steps]
    assert statuses == [("breaks", "failed"), ("never", "skipped"), ("cleanup", "changed")]
    assert record.steps[0].message == "false-ish exited 3: it broke"
    assert record.steps[1].message == "an earlier step failed"
    assert record.verdict == "failed" and record.exit_code == exit_code_for("failed") == 10
    assert record.summary["targets"]["dev"] == {"verdict": "failed", "failed_step": "breaks"}


def test_a_dropped_link_is_unreachable(tmp_path):
    h = harness(tmp_path, "name: t\ntargets: [dev]\nsteps:\n  - shell: [uptime]\n")
    h.host.on_argv(["uptime"], error=ConnectionLost("fakehost: the connection dropped"))
    record = h.record()
    assert record.steps[0].status == "failed"
    assert record.steps[0].message == "fakehost: the connection dropped"
    assert record.verdict == "unreachable" and record.exit_code == exit_code_for("unreachable") == 13


def test_a_bad_rendered_param_is_a_usage_error_at_its_line(tmp_path):
    h = harness(tmp_path, """\
        name: t
        targets: [dev]
        steps:
          - shell: [echo, "[0, x]"]
            register: first
          - shell:
              argv: [echo]
              ok_codes: "{{ first.stdout }}"
        """)
    h.host.on_argv(["echo"], stdout=b"not a list\n")
    record = h.record()
    assert record.steps[1].status == "failed"
    assert record.steps[1].message.startswith(
        f"{tmp_path}/playbook.yaml:8:17: ok_codes must be a list, not 'not a list")
    assert record.exit_code == ExitCode.USAGE
    assert len(h.host.calls) == 1          # the bad step never ran


def test_retries_run_the_step_again(tmp_path):
    h = harness(tmp_path, """\
        name: t
        targets: [dev]
        steps:
          - name: flaky
            shell: [flaky]
            retries: 2
            retry_delay: 0
        """)
    first = []

    def first_call(argv, stdin):           # the first attempt fails, the second succeeds
        first.append(argv)
        return len(first) == 1
    h.host.on(first_call, Reply(exit_code=1, stderr=b"not yet\n"))
    h.host.on_argv(["flaky"], stdout=b"ok\n")
    record = h.record()
    assert record.steps[0].status == "changed"
    assert ("step_progress", "dev", "flaky",
            "attempt 1/3 failed: flaky exited 1: not yet; retrying in 0 s") in h.reporter.events
    assert len([c for c in h.host.calls if c.argv == ["flaky"]]) == 2


def test_step_alone_with_a_context(tmp_path):
    """A step kind needs no engine: a StepContext of fakes is enough."""
    h = harness(tmp_path, "name: t\ntargets: [dev]\nsteps:\n  - shell: [ls, /nope]\n")
    h.host.on_argv(["env", "-C", "/tmp", "ls"], exit_code=2, stderr=b"ls: /nope: No such file\n")
    step = h.step()
    params = {"argv": ["ls", "/nope"], "env": {}, "cwd": "/tmp", "ok_codes": [0], "quiet": True}
    assert step.plan(h.context(), params) == ["env -C /tmp ls /nope"]
    with pytest.raises(StepFailed) as failed:
        step.run(h.context(), params)
    assert failed.value.message == "env -C /tmp ls /nope exited 2: ls: /nope: No such file"
    assert failed.value.data["rc"] == 2
    assert h.reporter.events == []          # quiet: nothing printed


def test_an_unknown_target_is_an_error_at_the_playbook_line(tmp_path):
    h = harness(tmp_path, "name: t\ntargets:\n  - dev\n  - nope\nsteps:\n  - shell: [echo]\n")
    with pytest.raises(ConfigError) as error:
        h.record()
    assert str(error.value).startswith(f"{tmp_path}/playbook.yaml:4:5: ")
    assert "nope" in str(error.value)
