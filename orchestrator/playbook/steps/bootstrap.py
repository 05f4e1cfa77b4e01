"""bootstrap: a venv with pinned packages; idempotent through a marker holding the hash
of what was asked (a second run does nothing and says so).

For hosts without internet, `wheelhouse:` names a folder on the controller: orch fills it
with `pip download` (once) and pushes the wheels the container lacks, then installs with
--no-index from there.

A bare container (a distribution's python3 and nothing else, no network) works too: when
its python has no ensurepip (Debian without python3-venv), orch pushes pip's own wheel
and the payload creates the venv --without-pip and lets pip install itself from it. When
python3 itself is missing, the step fails with the distribution's install command, or
runs it with `install_python: true` (the container must reach its package sources).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
from typing import Callable

from orchestrator.targets import distro

from orchestrator.remote import payload_api
from orchestrator.remote.wheels import push_wheels
from orchestrator.ground.errors import OrchError, PayloadError
from orchestrator.payloads._statedir import STATE_DIR
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome

REMOTE_WHEELHOUSE = f"{STATE_DIR}/wheelhouse"
DOWNLOAD_MARKER = ".orch-wheelhouse.json"
PIP_WHEEL_CACHE = "~/.cache/orch/pip-wheels"


class BootstrapStep(Step):
    kind = "bootstrap"
    summary = "a venv with pinned packages (pip's output in the run's folder, pip freeze recorded)"
    params = {
        "venv": Param((str,), doc="where the venv lives (default: the inventory's venv)"),
        "python": Param((str,), default="python3", doc="the interpreter that creates the venv"),
        "packages": Param((list,), required=True, items=(str,), doc="pip requirements, pinned",
                          plain_items="pip's options go in pip_args (the playbook's own); "
                                      "packages are requirements only"),
        "index_url": Param((str,), doc="pip --index-url (e.g. the CUDA wheel index of torch)"),
        "extra_index_urls": Param((list,), default=[], items=(str,),
                                   doc="more pip --extra-index-url URLs (credentials never in an argv)"),
        "wheelhouse": Param((str,), doc="a folder of wheels on the controller, pushed in"),
        "download": Param((bool,), default=True, doc="fill the wheelhouse with pip download"),
        "remote_wheelhouse": Param((str,), doc=f"where wheels go in the target (default: "
                                               f"{REMOTE_WHEELHOUSE}, root's own folder)"),
        "pip_args": Param((list,), default=[], items=(str,), doc="more arguments for pip install"),
        "force": Param((bool,), default=False, doc="reinstall even when the marker matches"),
        "install_python": Param((bool,), default=False,
                                doc="python3 missing: run the distribution's package manager "
                                    "(the container must reach its package sources)"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        venv = params["venv"] or ctx.target.venv
        lines = []
        if params["wheelhouse"]:
            lines.append(f"controller: pip download {' '.join(params['packages'])} -d "
                         f"{params['wheelhouse']} (once); push missing wheels to "
                         f"{params['remote_wheelhouse'] or REMOTE_WHEELHOUSE}")
        lines.append(f"{params['python']} -m venv {venv} (unless the marker matches; without "
                     "ensurepip: --without-pip, then pip from its own pushed wheel)")
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
        checked = self._check(ctx, params, base)
        if checked.get("up_to_date"):
            return self._done(ctx, venv, checked, changed=False, digest=digest)
        args = {**base, "index_url": params["index_url"],
                "extra_index_urls": params["extra_index_urls"], "pip_args": params["pip_args"]}
        remote_dir = remote_wheelhouse(target, params)
        if local_dir:
            args["wheels"] = self._push_wheels(ctx, local_dir, list(wheels), remote_dir)
            args["find_links"] = remote_dir
            args["no_index"] = not params["index_url"] and not params["extra_index_urls"]
        if not checked.get("ensurepip") and not checked.get("venv_pip"):
            args["pip_wheel"], args["pip_wheel_sha256"] = self._push_pip_wheel(
                ctx, params, local_dir, checked.get("python_version"), remote_dir)

        phases = PipPhases(ctx.progress)

        def on_event(event: dict) -> None:
            if event.get("event") == "pip":
                line = str(event.get("line", ""))
                phases.feed(line)
                ctx.output(line)

        result = payload_api.bootstrap(target, "install", python=params["python"],
                                       timeout=ctx.remaining(3600), on_event=on_event, **args)
        return self._done(ctx, venv, result, changed=bool(result.get("changed")), digest=digest)

    def _done(self, ctx: StepContext, venv: str, result: dict, changed: bool, digest: str) -> StepOutcome:
        freeze = result.get("freeze") or []
        ctx.target.venv = venv  # later steps (grep, patch, launch) use this venv
        info = ctx.info
        if info is not None:
            info.pip_freeze = freeze
            ctx.recorder.save_targets()
        torch = next((line.split("==", 1)[1] for line in freeze if line.lower().startswith("torch==")), None)
        did = result.get("did") or []
        if changed and did:
            # the container's own time for it: the console adds the whole step's after it
            message = "; ".join(did) + f" (in the container: {result.get('seconds', '?')} s)"
        elif changed:
            message = f"installed into {venv} (in the container: {result.get('seconds', '?')} s)"
        else:
            message = f"nothing to do: {venv} already matches (marker {digest[:12]})"
        return StepOutcome(status="changed" if changed else "ok", message=message,
                           data={"changed": changed, "venv": venv, "hash": digest,
                                 "freeze": freeze, "torch": torch, "did": did})

    def _check(self, ctx: StepContext, params: dict, base: dict) -> dict:
        """The check payload's answer; a missing python3 is reported with the distribution's
        install command (or installed, with install_python)."""
        target, python = ctx.target, params["python"]

        def check() -> dict:
            return payload_api.bootstrap(target, "check", python=python,
                                         timeout=ctx.remaining(300), **base)
        try:
            return check()
        except PayloadError:
            raise
        except OrchError:
            if not distro.python_missing(target, python):
                raise
        try:
            distro.require_python(target, python, install=params["install_python"],
                                  output=ctx.output)
        except OrchError as error:
            raise StepFailed(str(error)) from None
        ctx.progress(f"installed {python} in {target.name} with its package manager")
        return check()

    def _push_pip_wheel(self, ctx: StepContext, params: dict, local_dir: str | None,
                        python_version: str | None, remote_dir: str) -> tuple[str, str]:
        """Push pip's own wheel (the container's python has no ensurepip); returns its path
        in the container and its sha256 (the payload checks it before running it)."""
        path, source = self._pip_wheel(ctx, local_dir, python_version)
        name = os.path.basename(path)
        ctx.progress(f"{params['python']} in {ctx.target.name} has no ensurepip: pushing pip's "
                     f"wheel {name} ({source})")
        digests = self._push_wheels(ctx, os.path.dirname(path), [name], remote_dir)
        return f"{remote_dir}/{name}", digests[name]

    def _pip_wheel(self, ctx: StepContext, local_dir: str | None,
                   python_version: str | None) -> tuple[str, str]:
        """A pip wheel for the container's python: from the wheelhouse, the cache, PyPI
        (pip download for that python version, cached), or this machine's own bundled one."""
        if local_dir:
            found = sorted(glob.glob(os.path.join(local_dir, "pip-*.whl")))
            if found:
                return found[-1], "from the wheelhouse"
        short = ".".join((python_version or "").split(".")[:2])
        cache = os.path.join(os.path.expanduser(PIP_WHEEL_CACHE), f"py{short or 'any'}")
        found = sorted(glob.glob(os.path.join(cache, "pip-*.whl")))
        if found:
            return found[-1], f"cached in {cache}"
        os.makedirs(cache, exist_ok=True)
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                "--only-binary=:all:", "--no-deps", "-d", cache, "--", "pip"]
        if short:
            argv[4:4] = ["--python-version", short]
        ctx.progress(f"downloading pip's wheel for python {short or '?'} into {cache}")
        done = subprocess.run(argv, capture_output=True, text=True)
        found = sorted(glob.glob(os.path.join(cache, "pip-*.whl")))
        if done.returncode == 0 and found:
            return found[-1], f"downloaded into {cache}"
        bundled = sorted(glob.glob("/usr/share/python-wheels/pip-*.whl") + glob.glob(
            os.path.join(os.path.dirname(subprocess.__file__), "ensurepip", "_bundled",
                         "pip-*.whl")))
        if bundled:
            return bundled[-1], "this machine's bundled wheel (pip download failed)"
        raise StepFailed("the container's python has no ensurepip and orch found no pip wheel "
                         f"to push: pip download failed ({(done.stderr or '').strip()[-300:]}); "
                         "put a pip-*.whl into the wheelhouse")

    @staticmethod
    def _pip_options(params: dict) -> list[str]:
        options = []
        if params["index_url"]:
            options += ["--index-url", masked_url(params["index_url"])]
        for url in params["extra_index_urls"]:
            options += ["--extra-index-url", masked_url(url)]
        if params["wheelhouse"]:
            options += ["--find-links", params["remote_wheelhouse"] or REMOTE_WHEELHOUSE]
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
            folder = os.path.join(ctx.run.playbook.directory, folder)
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
        if not params["download"] or not params["packages"]:
            return folder   # nothing to download (pip refuses a download of nothing)
        # `--`: what follows is requirements only, whatever they say (a requirement such as
        # "--no-binary=:all:" would make pip build an sdist, i.e. run its code, here)
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                "--only-binary=:all:", "-d", folder, "--", *params["packages"]]
        ctx.progress(f"filling the wheelhouse {folder} (pip download)")
        env = {**os.environ, **index_env(params["index_url"], params["extra_index_urls"])}
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=env)
        for line in process.stdout:
            ctx.output("controller: " + line.rstrip("\n"))
        if process.wait() != 0:
            raise StepFailed(f"pip download into {folder} failed (exit {process.returncode})")
        with open(marker, "w") as handle:
            handle.write(asked)
        return folder

    def _push_wheels(self, ctx: StepContext, local_dir: str, names: list, remote_dir: str) -> dict:
        """Push the wheels the container lacks (remote/wheels.py); {name: sha256} of them all."""
        try:
            return push_wheels(ctx.target, local_dir, names, remote_dir, ctx.progress, ctx.remaining)
        except PayloadError:
            raise
        except OrchError as error:
            raise StepFailed(str(error)) from None


class PipPhases:
    """pip's phases, read from its output and told once each as the step's progress: pip
    prints a line or more per package (hundreds for torch and its CUDA libraries), which the
    console summarises; these few say what it is doing."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress = progress
        self.collected = 0

    def feed(self, line: str) -> None:
        if line.startswith(("Collecting ", "Processing ")):
            self.collected += 1
            if self.collected == 1:
                self.progress("pip: collecting the packages and their dependencies")
        elif line.startswith("Installing collected packages:"):
            names = [name for name in line.split(":", 1)[1].split(",") if name.strip()]
            self.progress(f"pip: installing {len(names)} packages")


def remote_wheelhouse(target, params: dict) -> str:
    """The wheelhouse in the target: the step's remote_wheelhouse, else root's own folder
    (the bootstrap payload's list action makes and checks it)."""
    return params["remote_wheelhouse"] or f"{target.state_dir()}/wheelhouse"


def index_env(index_url: str | None, extra_index_urls: list) -> dict:
    """pip's index options as its environment variables: an index URL may hold credentials
    (https://user:token@host/simple), and an argv is visible to every account in `ps`."""
    env = {}
    if index_url:
        env["PIP_INDEX_URL"] = index_url
    if extra_index_urls:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(extra_index_urls)
    return env


def masked_url(url: str) -> str:
    """The URL with any user:password replaced, for plans and messages."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rsplit('@', 1)[1]}{slash}{path}"
