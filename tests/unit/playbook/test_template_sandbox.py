"""Templates are rendered in jinja2's immutable sandbox: the known ways out of plain jinja2
(function globals, the class hierarchy, mutating methods) leave no file behind, wherever the
template comes from: a playbook var, `-e` on `validate` and `run --dry-run`, a pushed file.
(MCP run_start vars are refused before any rendering: tests/unit/mcp/test_server.py.)"""

from __future__ import annotations

import textwrap

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.config.yamlsrc import load_yaml
from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.loader import load_playbook
from orchestrator.playbook.render import Loc, Unknown, render
from tests.support.step_fakes import Reply, harness

# Each writes the file named by {mark}; plain jinja2 runs every one of them.
ESCAPES = [
    "{{{{ lipsum.__globals__['os'].system('touch {mark}') }}}}",
    "{{{{ cycler.__init__.__globals__.os.system('touch {mark}') }}}}",
    "{{{{ joiner.__init__.__globals__['os'].popen('touch {mark}').read() }}}}",
    "{{{{ namespace.__init__.__globals__['os'].system('touch {mark}') }}}}",
    "{{{{ lipsum|attr('__globals__')|attr('__getitem__')('os')|attr('system')('touch {mark}') }}}}",
    "{{% for c in ''.__class__.__mro__[1].__subclasses__() %}}{{% if c.__name__ == 'catch_warnings' %}}"
    "{{{{ c()._module.__builtins__['__import__']('os').system('touch {mark}') }}}}{{% endif %}}{{% endfor %}}",
    "{{{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch {mark}') }}}}",
]
IDS = ["lipsum", "cycler", "joiner", "namespace", "attr-filter", "mro-subclasses", "self"]


@pytest.fixture
def mark(tmp_path):
    path = tmp_path / "escaped"
    yield path
    assert not path.exists(), "a template ran code on the controller"


def _loc(tmp_path):
    file = tmp_path / "v.yaml"
    file.write_text("x: 1\n")
    return Loc(load_yaml(str(file)), ("x",))


@pytest.mark.parametrize("template", ESCAPES, ids=IDS)
def test_render_refuses_the_escapes(tmp_path, mark, template):
    with pytest.raises(ConfigError) as caught:
        render(template.format(mark=mark), {}, _loc(tmp_path))
    assert "Traceback" not in str(caught.value)


def test_the_immutable_sandbox_refuses_changing_a_value_in_place(tmp_path):
    with pytest.raises(ConfigError, match="unsafe|not safely callable"):
        render("{{ items.append(1) }}", {"items": [0]}, _loc(tmp_path))
    assert render("{{ items + [1] }}", {"items": [0]}, _loc(tmp_path)) == [0, 1]  # still native


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.parametrize("template", ESCAPES[:3] + ESCAPES[5:6], ids=IDS[:3] + IDS[5:6])
def test_a_playbook_var_cannot_escape(tmp_path, mark, template):
    book = {"name": "x", "vars": {"evil": template.format(mark=mark)},
            "steps": [{"shell": ["echo", "{{ evil }}"]}]}
    path = _write(tmp_path, "play.yaml", yaml.safe_dump(book))
    try:
        load_playbook(path)
    except ConfigError:
        pass  # refused or deferred to run time: either way, nothing ran


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]])
@pytest.mark.parametrize("template", ESCAPES[:2] + ESCAPES[5:6], ids=IDS[:2] + IDS[5:6])
def test_cli_extra_vars_cannot_escape(tmp_path, mark, template, command):
    play = _write(tmp_path, "play.yaml", "name: x\ntargets: [dev]\nsteps:\n  - shell: [echo, '{{ v }}']\n")
    inventory = _write(tmp_path, "inv.yaml",
                       "hosts: {here: {transport: local}}\ncontainers: {dev: {host: here}}\n")
    result = CliRunner().invoke(main, ["-i", inventory, *command, play, "-e",
                                       "v=" + template.format(mark=mark)])
    assert "Traceback" not in result.output


PUSH = """\
    name: t
    targets: [dev]
    steps:
      - push: {src: evil.j2, dest: /srv/evil.txt, template: true}
"""


@pytest.mark.parametrize("template", ESCAPES, ids=IDS)
def test_a_pushed_template_cannot_escape(tmp_path, mark, template):
    h = harness(tmp_path, PUSH, files={"evil.j2": template.format(mark=mark)})
    h.host.on(lambda argv, stdin: "orch-sha" in argv, Reply())
    record = h.record()
    assert record.steps[0].status == "failed"
    assert "template error" in record.steps[0].message


def test_a_method_of_a_value_known_only_at_run_time_renders_in_a_dry_run(tmp_path):
    """The sandbox checks every call; a registered result's method (r.stdout.strip()) is an
    Unknown it may call, so a dry run shows the plan instead of an error."""
    context = {"r": Unknown("r")}
    assert render("x {{ r.stdout.strip() }}", context, _loc(tmp_path)) == "x <r.stdout.strip()>"
