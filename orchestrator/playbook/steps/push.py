"""push: files and rendered templates (jinja2) into the target, skipped when unchanged.

A changed file goes the way `orch cp` sends one (remote/transfer.py): staged here under its
final name with its mode, then one stream into the target, its sha256 computed on both
sides and compared before the file gets its final name there, so a transfer that changed
a byte fails the step and leaves the old file in place.

A src that a template renders (`src: "{{ trainer_file }}"`) must lead into the playbook's own
folder (its real path) unless the playbook itself wrote that path, in the step or in its
vars: a var's value comes from whoever runs the playbook (an MCP client's vars), and a push
of any file of the controller into the container is a way to read it."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tempfile
from typing import Optional

import jinja2

from orchestrator.config.jinja import ENV
from orchestrator.config.schema import is_template, quoted
from orchestrator.config.yamlsrc import Loc
from orchestrator.playbook.model import Playbook, StepSpec
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome
from orchestrator.remote import transfer

FILE_KEYS = ("src", "dest", "mode", "template")
# The file's sha256 and mode: a file with the right content but the wrong mode (0644 for
# a script pushed 0755, 0666 for a key pushed 0600) must be written again.
_SHA_SCRIPT = 'sha256sum -- "$1" 2>/dev/null && stat -c %a -- "$1" 2>/dev/null || true'


class PushStep(Step):
    kind = "push"
    summary = "copy files (or jinja2 templates, rendered) into the target"
    params = {
        "src": Param((str,), doc="a file beside the playbook, or in templates/"),
        "dest": Param((str,), doc="its path in the target"),
        "mode": Param((int, str), default="0644", doc="file mode, e.g. '0755'"),
        "template": Param((bool,), default=False, doc="render src with jinja2 first"),
        "files": Param((list,), default=[], items=(dict,), doc="several {src, dest, mode, template}"),
    }

    def check(self, params: dict, loc: Loc) -> None:
        has_single = "src" in params or "dest" in params
        if has_single and ("src" not in params or "dest" not in params):
            raise loc.error("push needs both src: and dest:")
        if not has_single and not params.get("files"):
            raise loc.error("push needs src: and dest:, or files: [{src, dest}]")
        for index, item in enumerate(params.get("files") or []):
            if not isinstance(item, dict):
                continue
            where = loc.child("files").child(index)
            for key in item:
                if key not in FILE_KEYS:
                    raise where.child(key).error(f"unknown key {key!r} in a push file "
                                                 f"(allowed: {', '.join(FILE_KEYS)})", key=True)
            for key in ("src", "dest"):
                if key not in item:
                    raise where.error(f"each push file needs {key}:")

    def check_loaded(self, playbook: Playbook, spec: StepSpec) -> None:
        check_sources(playbook.directory, spec.params, spec.params_loc)

    def _items(self, params: dict) -> list[dict]:
        items = list(params.get("files") or [])
        if params.get("src"):
            items.insert(0, {"src": params["src"], "dest": params["dest"], "mode": params["mode"],
                             "template": params["template"]})
        return [{"mode": params["mode"], "template": False, **item} for item in items]

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        return [f"put {'rendered ' if item['template'] else ''}{item['src']} -> "
                f"{item['dest']} (mode {_mode(item['mode']):o})" for item in self._items(params)]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        target = ctx.target
        changed, same = [], []
        literal = written_in_playbook(ctx.run.playbook, ctx.spec.params)
        for item in self._items(params):
            path = self._find(ctx, item["src"])
            if item["src"] not in literal:
                confine(path, ctx.run.playbook.directory, item["src"])
            data = self._content(ctx, path, item["template"])
            dest = target.expand(str(item["dest"]))
            mode = _mode(item["mode"])
            if self._remote_state(ctx, dest) == (hashlib.sha256(data).hexdigest(), mode):
                same.append(dest)
                continue
            parent = posixpath.dirname(dest)
            if parent:
                target.run(["mkdir", "-p", parent], timeout=ctx.remaining(30)).check(f"creating {parent}")
            _send(ctx, data, dest, mode)
            changed.append(dest)
        message = (f"{len(changed)} file(s) written" + (f", {len(same)} unchanged" if same else "")
                   if changed else f"{len(same)} file(s) already up to date")
        return StepOutcome(status="changed" if changed else "ok", message=message,
                           data={"changed": changed, "unchanged": same, "files": changed + same})

    @staticmethod
    def _find(ctx: StepContext, src: str) -> str:
        path, candidates = find_source(ctx.run.playbook.directory, src)
        if path is None:
            raise StepFailed(f"push: {src} not found (looked in {', '.join(candidates)})")
        return path

    @staticmethod
    def _content(ctx: StepContext, path: str, template: bool) -> bytes:
        with open(path, "rb") as handle:
            data = handle.read()
        if not template:
            return data
        try:
            return ENV.from_string(data.decode("utf-8")).render(ctx.variables).encode("utf-8")
        except jinja2.TemplateError as error:
            line = f":{error.lineno}" if getattr(error, "lineno", None) else ""
            raise StepFailed(f"{path}{line}: template error: {error}") from None

    @staticmethod
    def _remote_state(ctx: StepContext, dest: str) -> tuple[str, int | None]:
        """(sha256, mode) of dest in the target; ("", None) when it is missing."""
        result = ctx.target.run(["sh", "-c", _SHA_SCRIPT, "orch-sha", dest], timeout=ctx.remaining(60))
        lines = result.text.splitlines() if result.ok else []
        digest = lines[0].split(" ", 1)[0].strip() if lines else ""
        mode = lines[1].strip() if len(lines) > 1 else ""
        return digest, int(mode, 8) if re.fullmatch(r"[0-7]{1,4}", mode) else None


def _send(ctx: StepContext, data: bytes, dest: str, mode: int) -> None:
    """data as the file dest of the target with mode, through transfer.push (verified)."""
    with tempfile.TemporaryDirectory(prefix="orch-push-") as folder:
        staged = os.path.join(folder, posixpath.basename(dest) or "file")
        with open(staged, "wb") as handle:
            handle.write(data)
        os.chmod(staged, mode)
        # special: the mode is the playbook's own (a setuid helper pushed 4755 stays so)
        transfer.push(ctx.target, staged, dest, timeout=ctx.remaining(120), special=True)


def find_source(playbook_dir: str, src: str) -> tuple[Optional[str], list[str]]:
    """The file a push src names (beside the playbook, or in templates/), and where it looked."""
    src = os.path.expanduser(src)
    candidates = [src] if os.path.isabs(src) else [
        os.path.join(playbook_dir, src),
        os.path.join(playbook_dir, "..", "templates", src),
        os.path.join(os.getcwd(), "templates", src)]
    return next((c for c in candidates if os.path.isfile(c)), None), candidates


def written_in_playbook(playbook: Playbook, raw_params: dict) -> set:
    """Every plain string the playbook writes itself: its vars' values (its own and those of
    what it extends, before any -e or client var) and the step's literal srcs."""
    found: set = set()

    def gather(value) -> None:
        if isinstance(value, dict):
            for item in value.values():
                gather(item)
        elif isinstance(value, list):
            for item in value:
                gather(item)
        elif isinstance(value, str) and not is_template(value):
            found.add(value)
    gather(playbook.vars)
    gather(raw_params.get("src"))
    gather([item.get("src") for item in raw_params.get("files") or [] if isinstance(item, dict)])
    return found


def confine(path: str, playbook_dir: str, src: str) -> None:
    """A rendered src's file must be inside the playbook's folder (real paths: no link out)."""
    folder = os.path.realpath(playbook_dir)
    if not os.path.realpath(path).startswith(folder.rstrip("/") + "/"):
        raise StepFailed(f"push: src {quoted(src, 80)} comes from a variable and leads out of "
                         f"the playbook's folder ({folder}): a file elsewhere is pushed only "
                         "when the playbook writes its path itself")


def check_sources(playbook_dir: str, params: dict, loc: Loc) -> None:
    """Load time (validate, --dry-run): every literal src must exist, as the run will look for
    it; a templated src is checked once rendered, at run time."""
    items = [(params.get("src"), loc.child("src"))] + [
        (item.get("src"), loc.child("files").child(index).child("src"))
        for index, item in enumerate(params.get("files") or []) if isinstance(item, dict)]
    for src, where in items:
        if isinstance(src, str) and not is_template(src):
            path, candidates = find_source(playbook_dir, src)
            if path is None:
                raise where.error(f"push: {src} not found (looked in {', '.join(candidates)})")


def _mode(value) -> int:
    """'0755' (a string, as documented) is octal; so is YAML's 0755. A bare 755 is too big to
    be a mode in decimal, so its digits are read as octal, the way a user means it."""
    if isinstance(value, int):
        return int(str(value), 8) if value > 0o777 else value
    return int(str(value), 8)
