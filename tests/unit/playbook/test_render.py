"""Template rendering: native types, argv splicing, strict undefined names with positions."""

from __future__ import annotations

import pytest

from orchestrator.config.yamlsrc import load_yaml
from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.render import (Loc, Unknown, UnknownAtPlanTime, evaluate_condition,
                                          render)
from orchestrator.playbook.steps.shell import flatten


def loc_of(tmp_path, text: str, path=()):
    file = tmp_path / "v.yaml"
    file.write_text(text)
    source = load_yaml(str(file))
    return source, Loc(source, path)


def test_single_expression_keeps_its_type(tmp_path):
    source, loc = loc_of(tmp_path, "x: 1\n")
    context = {"n": 50, "items": ["--race"], "flag": True, "none": None}
    assert render("{{ n }}", context, loc) == 50
    assert render("{{ items }}", context, loc) == ["--race"]
    assert render(" {{ flag }} ", context, loc) is True
    assert render("{{ n }} steps", context, loc) == "50 steps"
    assert render("plain", context, loc) == "plain"
    assert render({"a": ["{{ n }}", 2]}, context, loc) == {"a": [50, 2]}
    assert render("{{ ['--race'] if flag else [] }}", context, loc) == ["--race"]


def test_argv_splices_rendered_lists():
    assert flatten(["python", ["--a", 1], [], None, ["--b", ["x"]]]) == ["python", "--a", 1, "--b", "x"]


def test_undefined_is_an_error_at_the_value(tmp_path):
    source, _ = loc_of(tmp_path, "steps:\n  - shell: [echo, '{{ missing }}']\n")
    loc = Loc(source, ("steps", 0, "shell", 1))
    with pytest.raises(ConfigError) as caught:
        render("{{ missing }}", {}, loc)
    assert str(caught.value).startswith(f"{tmp_path}/v.yaml:2:19: in template '{{{{ missing }}}}'")
    assert "'missing' is undefined" in str(caught.value)
    with pytest.raises(ConfigError, match="has no attribute 'state'"):
        render("{{ fx.state }}", {"fx": {"skipped": True}}, loc)


def test_runtime_template_errors_name_the_value(tmp_path):
    source, loc = loc_of(tmp_path, "a: 1\n", ("a",))
    with pytest.raises(ConfigError) as caught:
        render("{{ 1 / 0 }}", {}, loc)
    assert str(caught.value).startswith(f"{tmp_path}/v.yaml:1:4: in template")
    assert "ZeroDivisionError" in str(caught.value)


def test_conditions(tmp_path):
    _, loc = loc_of(tmp_path, "a: 1\n")
    context = {"fx": {"state": "vulnerable"}, "patch": True, "off": "false"}
    assert evaluate_condition("patch and fx.state == 'vulnerable'", context, loc) is True
    assert evaluate_condition("{{ fx.state == 'patched' }}", context, loc) is False
    assert evaluate_condition(False, context, loc) is False
    assert evaluate_condition("{{ off }}", context, loc) is False
    with pytest.raises(ConfigError):
        evaluate_condition("nope == 1", context, loc)


def test_unknown_values_defer_decisions_in_dry_runs(tmp_path):
    _, loc = loc_of(tmp_path, "a: 1\n")
    context = {"fx": Unknown("fx")}
    assert render("state={{ fx.state }}", context, loc) == "state=<fx.state>"
    with pytest.raises(UnknownAtPlanTime) as caught:
        evaluate_condition("fx.state == 'vulnerable'", context, loc)
    assert caught.value.name == "fx.state"
