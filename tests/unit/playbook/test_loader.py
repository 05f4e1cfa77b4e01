"""Playbook loading and validation: each kind of mistake gives its own file:line:col."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.loader import load_playbook, normalize_extra_vars, parse_extra_vars

GOOD = """\
name: demo
targets: [dev]
vars:
  steps: 50
  cmd: [python3, -c, "print({{ steps }})"]
steps:
  - name: hello
    shell: {argv: "{{ cmd }}"}
    register: hello
  - name: after
    shell: [echo, "{{ hello.rc }}"]
    when: hello.rc == 0
"""


def write(tmp_path, text: str, name: str = "play.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def error_of(tmp_path, text: str, extra=None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_playbook(path, extra)
    message = str(caught.value)
    assert message.startswith(path + ":"), message
    return message[len(path) + 1:]


def test_good_playbook_loads(tmp_path):
    book = load_playbook(write(tmp_path, GOOD))
    assert book.name == "demo"
    assert [s.kind for s in book.steps] == ["shell", "shell"]
    assert book.steps[0].register == "hello"
    assert book.steps[1].params == {"argv": ["echo", "{{ hello.rc }}"]}  # shorthand
    assert len(book.sha256) == 64


# (YAML, expected "line:col: message part") -- one per kind of mistake
MISTAKES = [
    pytest.param("name: x\nstepz: []\n", "2:1: unknown key 'stepz'", id="unknown-top-key"),
    pytest.param("name: x\nsteps:\n  - lanch: {command: [a]}\n", "3:5: unknown key 'lanch'",
                 id="unknown-step-kind"),
    pytest.param("name: x\nsteps:\n  - name: a\n", "3:5: step 1 has no kind", id="no-kind"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    launch: {command: [b]}\n",
                 "4:5: step 1 has two kinds", id="two-kinds"),
    pytest.param("name: x\nsteps:\n  - monitor: {hang_afterr: 3}\n",
                 "3:15: unknown key 'hang_afterr'", id="unknown-param"),
    pytest.param("name: x\nsteps:\n  - monitor: {hang_after: soon}\n",
                 "3:27: hang_after must be an integer or a number, not 'soon'", id="wrong-type"),
    pytest.param("name: x\nsteps:\n  - grep: {pattern: a, mode: defs}\n",
                 "3:30: mode must be one of grep, def", id="bad-choice"),
    pytest.param("name: x\nsteps:\n  - launch: {env: {A: 1}}\n",
                 "3:13: the launch step needs command:", id="missing-required"),
    pytest.param("name: x\nsteps:\n  - shell: [echo, '{{ nope }}']\n",
                 "3:19: undefined variable 'nope'", id="undefined-var"),
    pytest.param("name: x\nvars: {steps: 3}\nsteps:\n  - shell: [echo, '{{ step }}']\n",
                 "4:19: undefined variable 'step'", id="undefined-var-did-you-mean"),
    pytest.param("name: x\nsteps:\n  - shell: [echo, '{{ a b }}']\n",
                 "3:19: template syntax error", id="template-syntax"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    when: 'x =='\n",
                 "4:11: template syntax error", id="when-syntax"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    when: later.rc == 0\n  - shell: [b]\n    register: later\n",
                 "4:11: undefined variable 'later'", id="register-used-before"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    retries: many\n",
                 "4:14: steps[0].retries must be an integer", id="retries-type"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    timeout: -1\n",
                 "4:14: timeout must be a positive number", id="negative-timeout"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    register: 2fast\n",
                 "4:15: register '2fast' is not a valid variable name", id="bad-register"),
    pytest.param("name: x\nvars:\n  a: '{{ b }}'\n  b: '{{ a }}'\nsteps:\n  - shell: [x]\n",
                 "variables refer to each other in a loop", id="var-cycle"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n  - shell: [b]\n  shell: [c]\n",
                 "5:3: invalid YAML", id="bad-yaml"),
    pytest.param("name: x\nsteps: {shell: [a]}\n", "2:8: steps must be a list", id="steps-not-list"),
    pytest.param("name: x\nsteps:\n  - push: {src: a}\n", "3:11: push needs both src: and dest:",
                 id="push-half"),
    pytest.param("name: x\nsteps:\n  - monitor: {metric_regex: 'drafter=(\\d+)'}\n",
                 "3:29: bad metric_regex: the metric regex needs a named group", id="regex-group"),
    pytest.param("name: x\nsteps:\n  - shell: {argv: [a, {b: c}]}\n",
                 "3:23: each item of argv must be", id="argv-item-type"),
    pytest.param("name: x\nsteps:\n  - shell: [a]\n    continue_on_error: yes please\n",
                 "4:24: steps[0].continue_on_error must be true or false", id="bool-type"),
    pytest.param("name: x\nvars:\n  target: 3\nsteps:\n  - shell: [a]\n",
                 "3:3: 'target' is a built-in name", id="builtin-var"),
    pytest.param("name: x\nvars: {steps: 1}\nmcp:\n  vars: [steps, stepz]\nsteps:\n  - shell: [a]\n",
                 "4:17: mcp.vars names 'stepz', which is not a var of this playbook",
                 id="mcp-unknown-var"),
    pytest.param("name: x\nvars: {steps: 1}\nmcp:\n  vars: {steps: int}\nsteps:\n  - shell: [a]\n",
                 "4:17: mcp.vars.steps: the kind must be one of scalar, string, integer",
                 id="mcp-bad-kind"),
    pytest.param("name: x\nvars: {steps: 1}\nmcp:\n  var: [steps]\nsteps:\n  - shell: [a]\n",
                 "4:3: unknown key 'var' in mcp", id="mcp-unknown-key"),
    pytest.param("name: x\nvars: {steps: 1}\nmcp:\n  vars: steps\nsteps:\n  - shell: [a]\n",
                 "4:9: mcp.vars (a list of names, or names: kinds) must be a mapping",
                 id="mcp-vars-not-list"),
]


@pytest.mark.parametrize("text,expected", MISTAKES)
def test_mistakes_give_file_line_col(tmp_path, text, expected):
    message = error_of(tmp_path, text)
    position, _, rest = expected.partition(": ")
    if position[0].isdigit():
        assert message.startswith(position + ": "), message
        assert rest in message, message
    else:
        assert expected in message, message


def test_did_you_mean_for_keys_and_vars(tmp_path):
    path = write(tmp_path, "name: x\nsteps:\n  - monitor: {hang_afterr: 3}\n")
    with pytest.raises(ConfigError) as caught:
        load_playbook(path)
    assert "did you mean 'hang_after'" in str(caught.value)
    path = write(tmp_path, "name: x\nvars: {steps: 3}\nsteps:\n  - shell: [echo, '{{ step }}']\n")
    with pytest.raises(ConfigError) as caught:
        load_playbook(path)
    assert "did you mean 'steps'" in str(caught.value)


def test_extra_vars_count_as_defined(tmp_path):
    path = write(tmp_path, "name: x\nsteps:\n  - shell: [echo, '{{ given }}']\n")
    with pytest.raises(ConfigError):
        load_playbook(path)
    assert load_playbook(path, {"given": 1}).steps


def test_extends_merges_vars_and_keeps_positions(tmp_path):
    write(tmp_path, "name: base\ntargets: [a]\nvars: {x: 1, y: 2}\nsteps:\n  - shell: [echo, '{{ x }}']\n",
          "base.yaml")
    child = write(tmp_path, "extends: base.yaml\nname: child\nvars: {y: 3}\n", "child.yaml")
    book = load_playbook(child)
    assert book.name == "child" and book.targets == ["a"]
    assert book.vars == {"x": 1, "y": 3}
    assert book.var_locs["y"].where() == f"{child}:3:11"
    assert book.var_locs["x"].where().endswith("base.yaml:3:11")
    broken = write(tmp_path, "extends: base.yaml\nsteps:\n  - shell: [echo, '{{ z }}']\n", "broken.yaml")
    with pytest.raises(ConfigError) as caught:
        load_playbook(broken)
    assert str(caught.value).startswith(f"{broken}:3:19: undefined variable 'z'")


def test_extends_missing_and_loop(tmp_path):
    path = write(tmp_path, "extends: nowhere.yaml\n")
    with pytest.raises(ConfigError) as caught:
        load_playbook(path)
    assert str(caught.value).startswith(f"{path}:1:10: extends 'nowhere.yaml': no such file")
    write(tmp_path, "extends: b.yaml\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\n", "b.yaml")
    with pytest.raises(ConfigError, match="extends itself"):
        load_playbook(str(tmp_path / "a.yaml"))


def test_parse_extra_vars():
    assert parse_extra_vars(["a=1", "b=true", "c=[x, y]", "d=text", "e=", "f=a: b", "g={k: v}"]) == \
        {"a": 1, "b": True, "c": ["x", "y"], "d": "text", "e": "", "f": "a: b", "g": {"k": "v"}}
    with pytest.raises(ConfigError):
        parse_extra_vars(["novalue"])
    with pytest.raises(ConfigError):
        parse_extra_vars(["run_id=3"])


@pytest.mark.parametrize("name", ["remote_dir", "state_dir", "target", "run_id"])
def test_every_source_of_extra_vars_refuses_built_in_names(tmp_path, name):
    """-e NAME=, -e @FILE and an already parsed dict (an MCP client's vars, nightly's) go
    through one check: a built-in name is refused, whichever brought it."""
    (tmp_path / "vars.yaml").write_text(f"fine: 1\n{name}: /tmp/elsewhere\n")
    for given in ([f"{name}=/tmp/elsewhere"], [f"@{tmp_path / 'vars.yaml'}"]):
        with pytest.raises(ConfigError, match=f"'{name}' is a built-in name"):
            normalize_extra_vars(given)
    with pytest.raises(ConfigError, match=f"vars.yaml:2:1: the var '{name}' is a built-in name"):
        parse_extra_vars([f"@{tmp_path / 'vars.yaml'}"])
    with pytest.raises(ConfigError, match=f"extra var '{name}' is a built-in name"):
        normalize_extra_vars({name: "/tmp/elsewhere"})
    with pytest.raises(ConfigError, match="is not a valid variable name"):
        normalize_extra_vars({"two words": 1})


def test_mcp_vars_merge_through_extends(tmp_path):
    write(tmp_path, "name: base\nvars: {x: 1, y: 2}\nmcp:\n  vars: [x]\nsteps:\n  - shell: [a]\n",
          "base.yaml")
    child = write(tmp_path, "extends: base.yaml\nvars: {z: 3}\nmcp:\n  vars: {z: integer}\n",
                  "child.yaml")
    assert load_playbook(child).client_vars == {"x": "scalar", "z": "integer"}
    bare = write(tmp_path, "extends: base.yaml\n", "bare.yaml")
    assert load_playbook(bare).client_vars == {"x": "scalar"}


def test_repo_playbooks_validate():
    for name in ("dflash", "dflash-local", "dflash-demo"):
        book = load_playbook(f"playbooks/{name}.yaml")
        assert book.steps


def test_validate_command(tmp_path):
    runner = CliRunner()
    good = write(tmp_path, GOOD)
    inventory = write(tmp_path, "hosts: {here: {transport: local}}\ncontainers: {dev: {host: here}}\n",
                      "inv.yaml")
    result = runner.invoke(main, ["-i", inventory, "validate", good])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output
    bad = write(tmp_path, "name: x\ntargets: [nope]\nsteps:\n  - shell: [a]\n", "bad.yaml")
    result = runner.invoke(main, ["-i", inventory, "validate", bad])
    assert result.exit_code == 2
    assert f"{bad}:2:11: unknown target 'nope'" in result.output
    result = runner.invoke(main, ["-i", inventory, "validate", "--json", bad])
    assert result.exit_code == 2 and '"ok": false' in result.output


def test_types_of_templated_values_are_checked_when_vars_decide_them(tmp_path):
    text = ("name: x\nvars: {hang: 30}\nsteps:\n  - launch: {command: [a]}\n"
            "  - monitor: {hang_after: '{{ hang }}', run_dir: '/r/{{ target.name }}'}\n")
    path = write(tmp_path, text)
    assert load_playbook(path).steps
    with pytest.raises(ConfigError) as caught:
        load_playbook(path, {"hang": "soon"})
    assert str(caught.value).startswith(f"{path}:5:27: hang_after must be an integer or a number, not 'soon'")


def test_a_push_source_that_does_not_exist_is_a_position_error(tmp_path):
    """validate and --dry-run look for a push's src where the run will (beside the playbook,
    templates/); a templated src waits for run time."""
    (tmp_path / "there.txt").write_text("x\n")
    text = ("name: x\ntargets: [dev]\nsteps:\n  - push: {src: there.txt, dest: /tmp/a}\n"
            "  - push:\n      files:\n        - {src: there.txt, dest: /tmp/b}\n"
            "        - {src: missing.txt, dest: /tmp/c}\n"
            "  - push: {src: '{{ later }}', dest: /tmp/d}\n")
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_playbook(path, {"later": "whatever.txt"})
    assert str(caught.value).startswith(f"{path}:8:17: push: missing.txt not found (looked in ")
    inventory = write(tmp_path, "hosts: {here: {transport: local}}\ncontainers: {dev: {host: here}}\n",
                      "inv.yaml")
    for command in (["validate", path], ["run", path, "--dry-run"]):
        result = CliRunner().invoke(main, ["-i", inventory, *command, "-e", "later=x"])
        assert result.exit_code == 2, result.output
        assert f"{path}:8:17: push: missing.txt not found" in result.output
    (tmp_path / "missing.txt").write_text("now here\n")
    assert len(load_playbook(path, {"later": "whatever.txt"}).steps) == 3
