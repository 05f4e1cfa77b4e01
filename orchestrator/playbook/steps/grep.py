"""grep: search an installed package's source in the target's venv (torch by default)."""

from __future__ import annotations

from orchestrator.remote import payload_api
from orchestrator.runs.model import Finding
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome

SHOWN = 20  # matches kept in the record and shown on the console


ENGINE_WORDS = {"rg": "ripgrep", "python": "the stdlib engine"}


class GrepStep(Step):
    kind = "grep"
    summary = "search installed package source (orch grep-torch as a step)"
    shorthand = "pattern"
    params = {
        "pattern": Param((str,), required=True, doc="a regular expression, or a name with mode: def"),
        "package": Param((str,), default="torch", doc="the installed package to search (orch grep-pkg)"),
        "fixed": Param((bool,), default=False, doc="pattern is a plain string"),
        "word": Param((bool,), default=False, doc="match whole words only (grep -w)"),
        "ignore_case": Param((bool,), default=False, doc="ignore case (grep -i)"),
        "context": Param((int,), default=0, doc="lines of context around each hit (grep -C)"),
        "mode": Param((str,), default="grep", choices=("grep", "def"),
                      doc="grep: lines matching pattern; def: where the name pattern is defined"),
        "show": Param((bool,), default=False, doc="mode def: keep each definition's body"),
        "max_hits": Param((int,), default=200, doc="stop after this many hits"),
        "expect": Param((str,), default="any", choices=("any", "present", "absent"),
                        doc="fail the step when the pattern is (not) found"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        flags = [f for f, on in (("-F", params["fixed"]), ("-w", params["word"]),
                                 ("-i", params["ignore_case"]), ("--def", params["mode"] == "def"),
                                 ("--show", params["show"])) if on]
        command = "grep-torch" if params["package"] == "torch" else f"grep-pkg {params['package']}"
        return [f"orch {command} {' '.join(flags + [repr(params['pattern'])])} "
                f"(source_search payload with {ctx.python()}; expect {params['expect']})"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        result = payload_api.search(
            ctx.target, params["pattern"], package=params["package"], fixed=params["fixed"],
            word=params["word"], ignore_case=params["ignore_case"], context=params["context"],
            mode=params["mode"], show=params["show"], max_hits=params["max_hits"])
        matches = result.get("matches", [])
        for match in matches[:SHOWN]:
            where = f"{match.get('path')}:{match.get('line')}"
            text = match.get("text") if match.get("event") == "hit" else \
                f"{match.get('kind', 'def')} {match.get('qualname', '')}"
            ctx.output(f"{where}: {str(text).strip()}")
        if len(matches) > SHOWN:
            ctx.output(f"... and {len(matches) - SHOWN} more")
        evidence = [f"{m.get('path')}:{m.get('line')}: {str(m.get('text') or m.get('qualname') or '').strip()}"
                    for m in matches[:SHOWN]]
        version = result.get("version")
        engine = result.get("engine")
        data = {"count": len(matches), "truncated": bool(result.get("truncated")),
                "version": version, "engine": engine, "engine_reason": result.get("engine_reason"), "site_packages": result.get("site_packages"),
                "matches": [{k: m.get(k) for k in ("path", "line", "text", "qualname", "kind")
                             if m.get(k) is not None} for m in matches[:SHOWN]]}
        if version and params["package"] == "torch" and ctx.info is not None:
            ctx.info.torch_version = version
            ctx.recorder.save_targets()
        message = (f"{len(matches)} match{'es' if len(matches) != 1 else ''} for "
                   f"{params['pattern']!r} in {params['package']} {version or ''}").strip()
        if engine:
            message += (f" (searched with {ENGINE_WORDS.get(engine, engine)}: "
                        f"{result.get('engine_reason', '?')})")
        finding = Finding(target=ctx.target.name, signature=f"grep:{params['pattern']}",
                          message=message, evidence=evidence)
        if params["expect"] == "present" and not matches:
            raise StepFailed(f"{params['pattern']!r} not found in {params['package']}", data=data,
                             findings=[finding])
        if params["expect"] == "absent" and matches:
            raise StepFailed(f"{params['pattern']!r} found in {params['package']} "
                             f"({len(matches)} matches)", data=data,
                             findings=[finding])
        return StepOutcome(message=message, data=data, findings=[finding] if matches else [])
