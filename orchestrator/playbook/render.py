"""Jinja2 templating of playbook values, with every error placed at the value's file:line:col.

Rules (the Ansible ones a user already knows, minus the surprises):
- A string holding `{{ ... }}` or `{% ... %}` is a template; anything else is taken as is.
- A string that is exactly one `{{ expression }}` keeps the expression's type: a list stays a
  list (so `"{{ trainer_args }}"` can be spliced into an argv), a number stays a number.
  Everything else renders to a string.
- Undefined names are errors (StrictUndefined), never empty strings.
- `when:` is a bare expression (`fx.state == 'vulnerable'`), like Ansible's.
"""

from __future__ import annotations

import copy
import difflib
import re
from typing import Any, Iterable

import jinja2
import jinja2.meta

from orchestrator.config.jinja import ENV, NATIVE_ENV, SANDBOX_HINT, is_security_error
from orchestrator.config.schema import Param, check_value, is_template, type_name
from orchestrator.config.yamlsrc import Loc
from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.model import BUILTIN_NAMES, StepSpec

_SINGLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.DOTALL)


class Unknown:
    """Stands for a value only known at run time (dry runs: registered results, facts)."""

    # What jinja2's sandbox asks of anything called; found here, not through __getattr__.
    unsafe_callable = False
    alters_data = False

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs) -> "Unknown":
        return Unknown(f"{self._name}()")

    def __getattr__(self, attr: str) -> "Unknown":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unknown(f"{self._name}.{attr}")

    def __getitem__(self, key) -> "Unknown":
        return Unknown(f"{self._name}[{key!r}]")

    def __str__(self) -> str:
        return f"<{self._name}>"

    __repr__ = __str__

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        raise UnknownAtPlanTime(self._name)

    def __eq__(self, other) -> bool:
        raise UnknownAtPlanTime(self._name)

    __hash__ = object.__hash__


def contains_unknown(value: Any, names: Iterable[str] = ()) -> bool:
    """Does a rendered value still hold something only known at run time: an Unknown, or
    (for the given names) the text an Unknown renders to inside a string, like "<run_id>"."""
    if isinstance(value, Unknown):
        return True
    if isinstance(value, dict):
        return any(contains_unknown(v, names) for v in value.values())
    if isinstance(value, list):
        return any(contains_unknown(v, names) for v in value)
    return isinstance(value, str) and "<" in value and ">" in value and "{" not in value and \
        any(f"<{name}" in value for name in names)


class UnknownAtPlanTime(Exception):
    """A decision needs a value that exists only once the run gets there."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


# ----------------------------------------------------------------------- rendering
def render(value: Any, context: dict, loc: Loc) -> Any:
    """Render every template string inside value (dicts and lists recursively)."""
    if isinstance(value, dict):
        return {k: render(v, context, loc.child(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, context, loc.child(i)) for i, v in enumerate(value)]
    if not is_template(value):
        return value
    single = _SINGLE_EXPRESSION.match(value)
    if single and "{{" not in single.group("expr") and "{%" not in value:
        return _evaluate(single.group("expr"), context, loc, value)
    try:
        return ENV.from_string(value).render(context)
    except UnknownAtPlanTime:
        raise
    except Exception as error:  # noqa: BLE001 - any template failure is the user's to fix
        raise _template_error(error, loc, value) from None


def evaluate_condition(expression: Any, context: dict, loc: Loc) -> bool:
    """A `when:` value: true/false, a bare expression, or a `{{ }}` template."""
    if isinstance(expression, bool):
        return expression
    text = str(expression)
    single = _SINGLE_EXPRESSION.match(text)
    if single:
        text = single.group("expr")
    value = _evaluate(text, context, loc, str(expression))
    if isinstance(value, str):
        # A rendered "false"/"no"/"0" means false, as a YAML-minded user expects.
        return value.strip().lower() not in ("", "false", "no", "0", "none", "off")
    return bool(value)


def _evaluate(expression: str, context: dict, loc: Loc, original: str) -> Any:
    try:
        compiled = NATIVE_ENV.compile_expression(expression.strip(), undefined_to_none=False)
        result = compiled(**context)
    except UnknownAtPlanTime:
        raise
    except Exception as error:  # noqa: BLE001
        raise _template_error(error, loc, original) from None
    if isinstance(result, jinja2.Undefined):
        raise _template_error(result._undefined_exception(result._undefined_message), loc, original)
    return result


def _template_error(error: Exception, loc: Loc, text: str) -> ConfigError:
    if isinstance(error, jinja2.TemplateSyntaxError):
        within = f" (line {error.lineno} of the template)" if error.lineno and "\n" in text else ""
        return loc.error(f"template syntax error{within}: {error.message}")
    if isinstance(error, jinja2.UndefinedError):
        return loc.error(f"in template {_short(text)}: {error.message}")
    if is_security_error(error):
        return loc.error(f"in template {_short(text)}: refused: {error}", hint=SANDBOX_HINT)
    return loc.error(f"in template {_short(text)}: {type(error).__name__}: {error}")


def _short(text: str, width: int = 60) -> str:
    text = " ".join(str(text).split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def render_params(schema: dict[str, Param], spec: StepSpec, context: dict, *,
                  validating: bool = False) -> dict:
    """A step's settings as its plan() and run() get them: each rendered, checked against its
    kind's schema at its file:line:col, the defaults filled in. The one place a step's settings
    are rendered and checked: the loader validates with it, a dry run plans with it and the
    engine runs with it.

    A value still holding an Unknown (what only the run will know) is left unchecked: it is
    checked once rendered, at the same position. validating (the loader: vars known, the
    target and registered results Unknown): a value whose rendering needs the run is left
    out, and so is text holding a built-in's placeholder ("/x/<run_id>")."""
    params = {}
    for name, param in schema.items():
        where = spec.params_loc.child(name)
        if name not in spec.params:
            if param.required:
                raise spec.params_loc.error(f"the {spec.kind} step needs {name}: "
                                            f"({param.doc or type_name(param.types)})")
            params[name] = copy.deepcopy(param.default)
            continue
        try:
            value = render(spec.params[name], context, where)
        except (UnknownAtPlanTime, ConfigError):
            if validating:
                continue  # needs run-time values; the run renders and checks it
            raise
        if not contains_unknown(value, BUILTIN_NAMES if validating else ()):
            check_value(name, param, value, where)
        params[name] = value
    return params


# ------------------------------------------------------------------ static checks
def referenced_names(value: Any, loc: Loc, expression: bool = False) -> list[tuple[str, Loc, str]]:
    """Every top-level name a value's templates use, with where and in which text (syntax
    errors raised with their position)."""
    found: list[tuple[str, Loc, str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += referenced_names(v, loc.child(k))
        return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found += referenced_names(v, loc.child(i))
        return found
    if not isinstance(value, str) or not (expression or is_template(value)):
        return found
    text = value
    if expression and not is_template(value):
        text = "{{ " + value + " }}"
    try:
        tree = ENV.parse(text)
    except jinja2.TemplateSyntaxError as error:
        raise _template_error(error, loc, value) from None
    return [(name, loc, value) for name in sorted(jinja2.meta.find_undeclared_variables(tree))]


def check_names(value: Any, loc: Loc, known: Iterable[str], expression: bool = False,
                what: str = "variable") -> None:
    known = set(known)
    for name, where, text in referenced_names(value, loc, expression):
        if name not in known and name not in ENV.globals:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else (
                "define it under vars:, pass -e NAME=VALUE, or register it in an earlier step")
            raise where.error(f"undefined {what} {name!r} in template {_short(text)}", hint=hint)
