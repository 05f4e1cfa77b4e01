"""bootstrap: a venv with pinned packages; idempotent through a marker holding the hash
of what was asked (a second run does nothing and says so).

For hosts without internet, `wheelhouse:` names a folder on the controller: orch fills it
with `pip download` (once) and pushes the wheels the container lacks, then installs with
--no-index from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from orchestrator.errors import OrchError
from orchestrator.payloads import run_payload
from orchestrator.steps.base import Param, Step, StepContext, StepFailed, StepOutcome

REMOTE_WHEELHOUSE = "/var/tmp/orch/wheelhouse"
DOWNLOAD_MARKER = ".orch-wheelhouse.json"


class BootstrapStep(Step):
    kind = "bootstrap"
    summary = "a venv with pinned packages (pip output streamed, pip freeze recorded)"
    params = {
        "venv": Param((str,), doc="where the venv lives (default: the inventory's venv)"),
        "python": Param((str,), default="python3", doc="the interpreter that creates the venv"),
        "packages": Param((list,), required=True, items=(str,), doc="pip requirements, pinned"),
        "index_url": Param((str,), doc="pip --index-url (e.g. the CUDA wheel index of torch)"),
        "extra_index_urls": Param((list,), default=[], items=(str,)),
        "wheelhouse": Param((str,), doc="a folder of wheels on the controller, pushed in"),
        "download": Param((bool,), default=True, doc="fill the wheelhouse with pip download"),
        "remote_wheelhouse": Param((str,), default=REMOTE_WHEELHOUSE),
        "pip_args": Param((list,), default=[], items=(str,)),
        "force": Param((bool,), default=False, doc="reinstall even when the marker matches"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        venv = params["venv"] or ctx.target.venv
        lines = []
        if params["wheelhouse"]:
            lines.append(f"controller: pip download {' '.join(params['packages'])} -d "
                         f"{params['wheelhouse']} (once); push missing wheels to "
                         f"{params['remote_wheelhouse']}")
        lines.append(f"{params['python']} -m venv {venv} (unless the marker matches)")
        lines.append(f"{venv}/bin/python -m pip install {' '.join(self._pip_options(params))}"
                     f"{' ' if self._pip_options(params) else ''}{' '.join(params['packages'])}")
        lines.append(f"{venv}/bin/python -m pip freeze --all")
        return lines

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        target = ctx.target
        venv = params["venv"] or target.venv
        if not venv:
            raise StepFailed(f"no venv for {target.name}: set venv: in the bootstrap step or "
                             "in the inventory")
        venv = target.expand(venv)
        wheels = {}
        local_dir = None
        if params["wheelhouse"]:
            local_dir = self._local_wheelhouse(ctx, params)
            wheels = {name: os.path.getsize(os.path.join(local_dir, name))
                      for name in sorted(os.listdir(local_dir))
                      if name.endswith((".whl", ".tar.gz", ".zip"))}
        digest = self._hash(params, wheels)
        base = {"venv": venv, "hash": digest, "packages": params["packages"],
                "force": params["force"]}
        checked = run_payload(target, "bootstrap", {**base, "action": "check"},
                              python=params["python"], timeout=ctx.remaining(300))
        if checked.get("up_to_date"):
            return self._done(ctx, venv, checked, changed=False, digest=digest)
        args = {**base, "action": "install", "index_url": params["index_url"],
                "extra_index_urls": params["extra_index_urls"], "pip_args": params["pip_args"]}
        if local_dir:
            self._push_wheels(ctx, local_dir, wheels, params["remote_wheelhouse"])
            args["find_links"] = params["remote_wheelhouse"]
            args["no_index"] = not params["index_url"] and not params["extra_index_urls"]

        def on_event(event: dict) -> None:
            if event.get("event") == "pip":
                ctx.output(event.get("line", ""))

        result = run_payload(target, "bootstrap", args, python=params["python"],
                             timeout=ctx.remaining(3600), on_event=on_event)
        return self._done(ctx, venv, result, changed=bool(result.get("changed")), digest=digest)

    def _done(self, ctx: StepContext, venv: str, result: dict, changed: bool, digest: str) -> StepOutcome:
        freeze = result.get("freeze") or []
        ctx.target.venv = venv  # later steps (grep, patch, launch) use this venv
        info = ctx.info
        if info is not None:
            info.pip_freeze = freeze
            ctx.runner.save_targets()
        torch = next((line.split("==", 1)[1] for line in freeze if line.lower().startswith("torch==")), None)
        if changed:
            message = f"installed into {venv} ({result.get('seconds', '?')} s)"
        else:
            message = f"nothing to do: {venv} already matches (marker {digest[:12]})"
        return StepOutcome(status="changed" if changed else "ok", message=message,
                           data={"changed": changed, "venv": venv, "hash": digest,
                                 "freeze": freeze, "torch": torch})

    @staticmethod
    def _pip_options(params: dict) -> list[str]:
        options = []
        if params["index_url"]:
            options += ["--index-url", params["index_url"]]
        for url in params["extra_index_urls"]:
            options += ["--extra-index-url", url]
        if params["wheelhouse"]:
            options += ["--find-links", params["remote_wheelhouse"]]
            if not params["index_url"] and not params["extra_index_urls"]:
                options.append("--no-index")
        return options + list(params["pip_args"])

    @staticmethod
    def _hash(params: dict, wheels: dict) -> str:
        asked = {"python": params["python"], "packages": params["packages"],
                 "index_url": params["index_url"], "extra_index_urls": params["extra_index_urls"],
                 "pip_args": params["pip_args"], "wheels": wheels}
        return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()

    def _local_wheelhouse(self, ctx: StepContext, params: dict) -> str:
        folder = os.path.expanduser(params["wheelhouse"])
        if not os.path.isabs(folder):
            folder = os.path.join(ctx.runner.playbook.directory, folder)
        os.makedirs(folder, exist_ok=True)
        asked = json.dumps({"packages": params["packages"], "index_url": params["index_url"],
                            "extra_index_urls": params["extra_index_urls"]}, sort_keys=True)
        marker = os.path.join(folder, DOWNLOAD_MARKER)
        try:
            with open(marker) as handle:
                if handle.read() == asked:
                    return folder
        except OSError:
            pass
        if not params["download"]:
            return folder
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                "--only-binary=:all:", "-d", folder]
        if params["index_url"]:
            argv += ["--index-url", params["index_url"]]
        for url in params["extra_index_urls"]:
            argv += ["--extra-index-url", url]
        argv += list(params["packages"])
        ctx.progress(f"filling the wheelhouse {folder} (pip download)")
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            ctx.output("controller: " + line.rstrip("\n"))
        if process.wait() != 0:
            raise StepFailed(f"pip download into {folder} failed (exit {process.returncode})")
        with open(marker, "w") as handle:
            handle.write(asked)
        return folder

    def _push_wheels(self, ctx: StepContext, local_dir: str, wheels: dict, remote_dir: str) -> None:
        target = ctx.target
        present = run_payload(target, "bootstrap", {"action": "list", "dir": remote_dir},
                              python="python3", timeout=60).get("files", {})
        missing = [name for name, size in wheels.items() if present.get(name) != size]
        if not missing:
            ctx.progress(f"all {len(wheels)} wheels already in {remote_dir}")
            return
        target.run(["mkdir", "-p", remote_dir], timeout=30).check(f"creating {remote_dir}")
        for number, name in enumerate(missing, 1):
            size = wheels[name]
            ctx.progress(f"pushing wheel {number}/{len(missing)}: {name} ({size / 1e6:.1f} MB)")
            with open(os.path.join(local_dir, name), "rb") as handle:
                data = handle.read()
            try:
                target.put(f"{remote_dir}/{name}", data, mode=0o644,
                           timeout=ctx.remaining(120 + size / 5e6))
            except OrchError as error:
                raise StepFailed(f"pushing {name} to {target.name} failed: {error}") from None
