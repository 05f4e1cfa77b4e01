"""Payload: a venv with pinned packages, idempotent (stdlib only).

Run with the BASE interpreter (the venv may not exist yet) as `PYTHON - ARGS_JSON`:
  {"action": "check" | "install" | "list", "venv": "~/venv", "hash": "...", "packages": [...],
   "index_url": null, "extra_index_urls": [], "find_links": null, "no_index": false,
   "pip_args": [], "force": false, "dir": "/var/lib/orch/wheelhouse", "sizes": {NAME: SIZE},
   "wheels": {NAME: SHA256}, "pip_wheel": "/var/lib/orch/wheelhouse/pip-25.3-py3-none-any.whl",
   "pip_wheel_sha256": "..."}
(orch ships them on stdin: an index URL may hold credentials, which reach pip through
PIP_INDEX_URL / PIP_EXTRA_INDEX_URL, never its argv.)
check    {"up_to_date": bool, "freeze": [...], "ensurepip": bool, "venv_pip": bool,
         "python_version": "3.11.2"} from the marker VENV/.orch-bootstrap.json
install  creates the venv when missing, runs pip (each output line a "pip" event), records
         `pip freeze` and the marker; does nothing and says so when the marker matches.
         Without ensurepip (Debian's python3 without python3-venv) the venv is created
         --without-pip and pip installs itself from the pushed `pip_wheel` (pip's own wheel
         runs as `python pip.whl/pip install --no-index pip.whl`). The result's "did"
         lists each thing it did, in words.
         Each pushed wheel (`wheels`, `pip_wheel`) is checked against its sha256 before pip
         reads it.
list     makes the wheelhouse folder root's own (0700, see _statedir) or refuses an unsafe
         one; returns its files with their sizes, and the sha256 of those whose size is in
         `sizes` (what needs no upload).
"""

import hashlib
import importlib.util
import json
import os
import stat
import subprocess
import sys
import time

from _protocol import *  # orch: inlined when shipped
from _statedir import *  # orch: inlined when shipped

MARKER = ".orch-bootstrap.json"


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def read_marker(venv):
    try:
        with open(os.path.join(venv, MARKER)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def works(python):
    try:
        return subprocess.run([python, "-c", "pass"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def has_ensurepip():
    """Whether `python -m venv` can put pip into a venv (Debian ships ensurepip in
    python3-venv; a minimal root has python3 without it)."""
    try:
        return importlib.util.find_spec("ensurepip") is not None
    except (ImportError, ValueError):
        return False


def has_pip(python):
    try:
        done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def make_venv(venv, without_pip):
    argv = [sys.executable, "-m", "venv"] + (["--without-pip"] if without_pip else []) + [venv]
    emit("pip", line="$ " + " ".join(argv))
    return subprocess.run(argv, capture_output=True, text=True)


def install_pip_from_wheel(python, wheel):
    """pip's wheel is importable as a zip: it installs itself, offline."""
    if not os.path.isfile(wheel):
        fail("the pip wheel %s is not in the container" % wheel)
    argv = [python, os.path.join(wheel, "pip"), "install", "--no-index", "--no-input",
            "--disable-pip-version-check", wheel]
    emit("pip", line="$ " + " ".join(argv))
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in done.stdout.splitlines():
        emit("pip", line=line)
    if done.returncode != 0:
        fail("installing pip from %s failed with exit code %d:\n%s"
             % (wheel, done.returncode, "\n".join("  | " + l for l in done.stdout.splitlines()[-8:])))


def create_venv(args, venv, did):
    """A venv at `venv` with pip in it, with ensurepip when the python has it, else from
    the pushed pip wheel."""
    python = venv_python(venv)
    wheel = args.get("pip_wheel")
    if not has_ensurepip() and wheel:
        done = make_venv(venv, without_pip=True)
        if done.returncode != 0:
            fail("cannot create the venv %s: %s" % (venv, (done.stderr or done.stdout).strip()[-500:]))
        did.append("created the venv %s with %s --without-pip (this python has no ensurepip)"
                   % (venv, sys.executable))
        return
    done = make_venv(venv, without_pip=False)
    if done.returncode == 0:
        did.append("created the venv %s with %s -m venv" % (venv, sys.executable))
        return
    reason = (done.stderr or done.stdout).strip()[-500:]
    if not wheel:
        fail("cannot create the venv %s: %s (Debian needs python3-venv; or give orch a "
             "wheelhouse so it can push pip's wheel)" % (venv, reason))
    done = make_venv(venv, without_pip=True)
    if done.returncode != 0 or not works(python):
        fail("cannot create the venv %s even --without-pip: %s"
             % (venv, (done.stderr or done.stdout).strip()[-500:]))
    did.append("created the venv %s with %s --without-pip (-m venv failed: %s)"
               % (venv, sys.executable, reason.splitlines()[0] if reason else "?"))


def ensure_pip(args, python, did):
    if has_pip(python):
        return
    wheel = args.get("pip_wheel")
    if not wheel:
        fail("the venv's python %s has no pip and orch pushed no pip wheel" % python)
    install_pip_from_wheel(python, wheel)
    version = pip_version(python)
    did.append("installed pip %s into the venv from the pushed wheel %s (offline)"
               % (version or "?", wheel))


def pip_version(python):
    done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
    words = done.stdout.split()
    return words[1] if done.returncode == 0 and len(words) > 1 else None


def freeze(python):
    done = subprocess.run([python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return []
    return [line for line in done.stdout.splitlines() if line.strip()]


def up_to_date(args, venv):
    marker = read_marker(venv)
    return (not args.get("force") and marker is not None and marker.get("hash") == args["hash"]
            and works(venv_python(venv)))


def check(args, venv):
    fresh = up_to_date(args, venv)
    python = venv_python(venv)
    emit("result", up_to_date=fresh, venv=venv,
         freeze=freeze(python) if fresh else [], ensurepip=has_ensurepip(),
         venv_pip=fresh or (works(python) and has_pip(python)),
         python_version="%d.%d.%d" % sys.version_info[:3])


def install(args, venv):
    python = venv_python(venv)
    if up_to_date(args, venv):
        emit("result", changed=False, venv=venv, freeze=freeze(python),
             message="venv already matches what the playbook asks (marker %s)" % args["hash"][:12])
        return
    verify_pushed(args)
    created = False
    did = []
    if not works(python):
        emit("pip", line="creating venv %s with %s" % (venv, sys.executable))
        create_venv(args, venv, did)
        created = True
    ensure_pip(args, python, did)
    started = time.time()
    if args["packages"] or args.get("pip_args"):
        pip_install(args, python, did)
    else:   # `packages: []`: a venv and nothing else (pip refuses an install of nothing)
        did.append("no packages asked: the venv only")
    frozen = freeze(python)
    marker = {"hash": args["hash"], "packages": args["packages"], "installed_at": time.time(),
              "seconds": round(time.time() - started, 1), "freeze": frozen}
    with open(os.path.join(venv, MARKER + ".part"), "w") as handle:
        json.dump(marker, handle, indent=1)
    os.replace(os.path.join(venv, MARKER + ".part"), os.path.join(venv, MARKER))
    emit("result", changed=True, created=created, venv=venv, freeze=frozen,
         seconds=marker["seconds"], did=did)


def pip_install(args, python, did):
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if args.get("no_index"):
        argv.append("--no-index")
    if args.get("find_links"):
        argv += ["--find-links", args["find_links"]]
    argv += list(args.get("pip_args") or [])
    argv += list(args["packages"])
    emit("pip", line="$ " + " ".join(argv))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace",
                               env=pip_env(args))
    tail = []
    for line in process.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        emit("pip", line=line)
    code = process.wait()
    if code != 0:
        fail("pip install failed with exit code %d:\n%s" % (code, "\n".join("  | " + l for l in tail[-8:])))
    where = ("the pushed wheelhouse %s (--no-index)" % args["find_links"]
             if args.get("no_index") and args.get("find_links") else "the package index")
    did.append("installed %s from %s" % (" ".join(args["packages"]), where))


def pip_env(args):
    """pip's environment: ours plus the index URLs, which may hold credentials and so never
    go into an argv (`ps` shows every argv to every account)."""
    env = dict(os.environ)
    if args.get("index_url"):
        env["PIP_INDEX_URL"] = args["index_url"]
    if args.get("extra_index_urls"):
        env["PIP_EXTRA_INDEX_URL"] = " ".join(args["extra_index_urls"])
    return env


def checked_folder(folder, create):
    """A wheelhouse root can trust (see _statedir), made 0700 when create."""
    try:
        return payload_folder(folder, create)
    except UnsafePath as error:
        fail("unsafe wheelhouse: %s" % error, kind="unsafe-path")


def sha256_of(path):
    """The file's sha256, read without following a link; None when it is not a plain file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_wheel(path, expected):
    if not expected:
        fail("no sha256 for %s: orch checks every pushed wheel before pip reads it" % path,
             kind="bad-args")
    found = sha256_of(path)
    if found != expected:
        fail("%s is not the wheel orch pushed (sha256 %s, expected %s): not installing"
             % (path, found or "unreadable", expected), kind="bad-wheel")


def verify_pushed(args):
    """Before anything runs: the wheelhouse is still a folder only root can change, and each
    wheel orch pushed there is the one it pushed."""
    if args.get("find_links"):
        if checked_folder(args["find_links"], create=False) is None:
            fail("the wheelhouse %s is not in the container" % args["find_links"])
        for name, digest in sorted((args.get("wheels") or {}).items()):
            verify_wheel(os.path.join(args["find_links"], name), digest)
    if args.get("pip_wheel"):
        checked_folder(os.path.dirname(args["pip_wheel"]), create=False)
        verify_wheel(args["pip_wheel"], args.get("pip_wheel_sha256"))


def list_dir(args):
    folder = os.path.expanduser(args["dir"])
    checked_folder(folder, create=True)
    sizes = args.get("sizes") or {}
    files = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or os.path.islink(path) or ".orch-put-" in name:
            continue
        size = os.path.getsize(path)
        files[name] = {"size": size}
        if sizes.get(name) == size:
            files[name]["sha256"] = sha256_of(path)
    emit("result", dir=folder, files=files)


def main():
    args = json.loads(sys.argv[1])
    action = args.get("action")
    if action == "list":
        list_dir(args)
        return
    venv = os.path.abspath(os.path.expanduser(args["venv"]))
    if action == "check":
        check(args, venv)
    elif action == "install":
        install(args, venv)
    else:
        fail("unknown action %r" % (action,))


if __name__ == "__main__":
    main()
