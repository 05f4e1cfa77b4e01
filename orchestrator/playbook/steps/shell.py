"""shell: one command as an argv list (never a shell string), its output streamed."""

from __future__ import annotations

import shlex

from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome, line_callback

KEEP = 64 * 1024  # bytes of stdout/stderr kept for `register`


class ShellStep(Step):
    kind = "shell"
    summary = "run an argv list in the target (no shell in between)"
    shorthand = "argv"
    params = {
        "argv": Param((list,), required=True, items=(str, int, float, list),
                      doc="the command and its arguments, e.g. [nvidia-smi, -L]; a list var "
                          "inside it is spliced in"),
        "env": Param((dict,), default={}, doc="variables for the command (env K=V words: visible to "
                                                "ps on the host, no secrets)"),
        "cwd": Param((str,), doc="run in this directory (env -C)"),
        "ok_codes": Param((list,), default=[0], items=(int,), doc="exit codes that count as success"),
        "quiet": Param((bool,), default=False, doc="do not print the output"),
    }

    def _argv(self, ctx: StepContext, params: dict) -> list[str]:
        argv = [str(part) for part in flatten(params["argv"])]
        if not argv:
            raise StepFailed("shell: the argv list is empty")
        if params["cwd"]:
            argv = ["env", "-C", params["cwd"], *argv]
        return argv

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        env = " ".join(f"{k}=..." for k in params["env"])
        return [(env + " " if env else "") + shlex.join(self._argv(ctx, params))]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        # A leading ~ as a shell would expand it (there is no shell in between).
        argv = [ctx.target.expand(a) if a == "~" or a.startswith("~/") else a
                for a in self._argv(ctx, params)]
        quiet = params["quiet"]
        result = ctx.target.run(argv, timeout=ctx.remaining(None),
                                env={str(k): str(v) for k, v in params["env"].items()},
                                on_stdout=None if quiet else line_callback(ctx, "stdout"),
                                on_stderr=None if quiet else line_callback(ctx, "stderr"))
        data = {"rc": result.exit_code, "stdout": result.stdout[-KEEP:].decode("utf-8", "replace"),
                "stderr": result.stderr[-KEEP:].decode("utf-8", "replace"),
                "duration_s": round(result.duration, 3)}
        data["stdout_lines"] = data["stdout"].splitlines()
        if result.exit_code not in params["ok_codes"]:
            tail = " | ".join(result.stderr_tail(3))
            raise StepFailed(f"{result.display()} exited {result.exit_code}" + (f": {tail}" if tail else ""),
                             data=data)
        return StepOutcome(status="changed", message=f"exit {result.exit_code} in {result.duration:.1f} s",
                           data=data)


def flatten(items) -> list:
    """A rendered `{{ some_list }}` inside an argv is spliced in, not nested."""
    flat = []
    for item in items:
        if isinstance(item, (list, tuple)):
            flat.extend(flatten(item))
        elif item is not None:
            flat.append(item)
    return flat
