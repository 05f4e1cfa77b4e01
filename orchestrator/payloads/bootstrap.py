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
platform what this python is, for the controller's choice of a wheel with a native
         extension: {"implementation": "cpython", "python": "3.11", "machine": "x86_64",
         "libc": "glibc", "libc_version": "2.36"}; with "tools": the wheels already
         unpacked in that folder's subfolders ({"unpacked": {FOLDER: {"wheel", "sha256"}}}),
         so a second run pushes and unpacks nothing.
unpack   a pushed wheel ("wheel": path in the wheelhouse, "sha256") unpacked into its own
         folder "dest" (0700, under STATE_DIR), for `python -c ... sys.path.insert(0, DEST)`:
         a tool orch runs without installing it into the user's venv. The wheel is checked
         against its sha256 first; members are written only below DEST (no absolute names,
         no `..`, no links), at most MAX_UNPACKED bytes; the folder is filled under a
         temporary name and renamed into place, so a half-unpacked one is never used.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
import zipfile

from _protocol import *  # orch: inlined when shipped
from _statedir import *  # orch: inlined when shipped

MARKER = ".orch-bootstrap.json"
UNPACKED = ".orch-unpacked.json"      # in an unpacked wheel's folder: which wheel, its sha256
MAX_UNPACKED = 1 << 30                # bytes one unpacked wheel may hold
MAX_MEMBERS = 20000


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
            "--disable-pip-version-check", "--", wheel]
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
    argv += ["--"] + list(args["packages"])   # requirements only: none is read as an option
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


def libc():
    """The C library this python runs on and its version: glibc from confstr, musl from its
    loader's own words (`ld-musl-ARCH.so.1` prints "Version 1.2.4" on stderr)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return name, version
    except (AttributeError, OSError, ValueError):
        pass
    loader = "/lib/ld-musl-%s.so.1" % machine()
    if os.path.exists(loader):
        try:
            words = subprocess.run([loader], capture_output=True, text=True, timeout=30).stderr
        except (OSError, subprocess.TimeoutExpired):
            words = ""
        for line in words.splitlines():
            if line.startswith("Version "):
                return "musl", line.split()[1]
        return "musl", ""
    return "", ""


def machine():
    """The machine this python is built for (a 32-bit python on a 64-bit kernel says i686)."""
    return sysconfig.get_platform().split("-", 1)[-1]


def describe_platform(args):
    name, version = libc()
    emit("result", implementation=sys.implementation.name, python="%d.%d" % sys.version_info[:2],
         machine=machine(), libc=name, libc_version=version,
         unpacked=unpacked_in(os.path.expanduser(args["tools"])) if args.get("tools") else {})


def unpacked_in(tools):
    """{folder name: marker} of the unpacked wheels in TOOLS; none when the folder is not
    there or is not one root alone controls (unpack then says why)."""
    try:
        if payload_folder(tools, create=False) is None:
            return {}
    except UnsafePath:
        return {}
    found = {}
    for name in sorted(os.listdir(tools))[:200]:
        marker = read_unpacked(os.path.join(tools, name))
        if marker and not os.path.islink(os.path.join(tools, name)):
            found[name] = marker
    return found


def read_unpacked(dest):
    try:
        with open(os.path.join(dest, UNPACKED)) as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def member_path(name, dest):
    """Where a wheel's member goes below dest, or None for a member not unpacked (the
    .data folder's scripts and headers). Refuses a name that would leave dest."""
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or ".." in parts or "" in parts[:-1]:
        fail("the wheel's member %r would be written outside its folder: not unpacking" % name,
             kind="bad-wheel")
    if parts[0].endswith(".data"):
        if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
            return None
        parts = parts[2:]
    return os.path.join(dest, *parts) if parts[-1] else None


def unpack(args):
    wheel, dest = args["wheel"], os.path.expanduser(args["dest"])
    checked_folder(os.path.dirname(wheel), create=False)
    verify_wheel(wheel, args.get("sha256"))
    parent = os.path.dirname(dest)
    try:
        payload_folder(parent, create=True)
    except UnsafePath as error:
        fail("unsafe folder for orch's tools: %s" % error, kind="unsafe-path")
    found = read_unpacked(dest)
    if found and found.get("sha256") == args["sha256"]:
        emit("result", dest=dest, changed=False)
        return
    work = os.path.join(parent, ".%s.%s.part" % (os.path.basename(dest), os.urandom(6).hex()))
    os.mkdir(work, 0o700)
    try:
        extract(wheel, work)
        with open(os.path.join(work, UNPACKED), "w") as handle:
            json.dump({"wheel": os.path.basename(wheel), "sha256": args["sha256"]}, handle)
        if os.path.lexists(dest):
            old = work + ".old"
            os.rename(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit("result", dest=dest, changed=True)


def extract(wheel, folder):
    total = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = archive.infolist()
            if len(members) > MAX_MEMBERS:
                fail("%s has %d members, more than orch unpacks (%d)" % (wheel, len(members), MAX_MEMBERS),
                     kind="bad-wheel")
            for member in members:
                kind = stat.S_IFMT(member.external_attr >> 16)
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                    fail("the wheel's member %r is not a plain file: not unpacking" % member.filename,
                         kind="bad-wheel")
                path = member_path(member.filename, folder)
                if path is None or member.is_dir():
                    continue
                total += member.file_size
                if total > MAX_UNPACKED:
                    fail("%s unpacks to more than %d bytes: not unpacking" % (wheel, MAX_UNPACKED),
                         kind="bad-wheel")
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                mode = 0o755 if (member.external_attr >> 16) & 0o111 else 0o644
                with archive.open(member) as source, open(path, "xb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                os.chmod(path, mode)
    except (zipfile.BadZipFile, OSError) as error:
        fail("%s cannot be unpacked: %s" % (wheel, error), kind="bad-wheel")


def main():
    args = json.loads(sys.argv[1])
    action = args.get("action")
    if action == "list":
        list_dir(args)
        return
    if action == "platform":
        describe_platform(args)
        return
    if action == "unpack":
        unpack(args)
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
