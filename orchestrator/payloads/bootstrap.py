"""Payload: a venv with pinned packages, idempotent (stdlib only).

Run with the BASE interpreter (the venv may not exist yet) as `PYTHON - ARGS_JSON`:
  {"action": "check" | "install" | "list", "venv": "~/venv", "hash": "...", "packages": [...],
   "index_url": null, "extra_index_urls": [], "find_links": null, "no_index": false,
   "pip_args": [], "force": false, "dir": "/var/tmp/orch/wheelhouse"}
check    {"up_to_date": bool, "freeze": [...]} from the marker VENV/.orch-bootstrap.json
install  creates the venv when missing, runs pip (each output line a "pip" event), records
         `pip freeze` and the marker; does nothing and says so when the marker matches.
list     the files of a wheelhouse directory with their sizes (what needs no upload).
"""

import json
import os
import subprocess
import sys
import time

MARKER = ".orch-bootstrap.json"


def emit(event, **fields):
    fields["event"] = event
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def fail(message, **fields):
    emit("error", message=message, **fields)
    sys.exit(1)


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
    emit("result", up_to_date=fresh, venv=venv,
         freeze=freeze(venv_python(venv)) if fresh else [])


def install(args, venv):
    python = venv_python(venv)
    if up_to_date(args, venv):
        emit("result", changed=False, venv=venv, freeze=freeze(python),
             message="venv already matches what the playbook asks (marker %s)" % args["hash"][:12])
        return
    created = False
    if not works(python):
        emit("pip", line="creating venv %s with %s" % (venv, sys.executable))
        done = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if done.returncode != 0:
            fail("cannot create the venv %s: %s (Debian needs python3-venv)"
                 % (venv, (done.stderr or done.stdout).strip()[-500:]))
        created = True
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if args.get("no_index"):
        argv.append("--no-index")
    if args.get("index_url"):
        argv += ["--index-url", args["index_url"]]
    for url in args.get("extra_index_urls") or []:
        argv += ["--extra-index-url", url]
    if args.get("find_links"):
        argv += ["--find-links", args["find_links"]]
    argv += list(args.get("pip_args") or [])
    argv += list(args["packages"])
    emit("pip", line="$ " + " ".join(argv))
    started = time.time()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace")
    tail = []
    for line in process.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        emit("pip", line=line)
    code = process.wait()
    if code != 0:
        fail("pip install failed with exit code %d:\n%s" % (code, "\n".join("  | " + l for l in tail[-8:])))
    frozen = freeze(python)
    marker = {"hash": args["hash"], "packages": args["packages"], "installed_at": time.time(),
              "seconds": round(time.time() - started, 1), "freeze": frozen}
    with open(os.path.join(venv, MARKER + ".part"), "w") as handle:
        json.dump(marker, handle, indent=1)
    os.replace(os.path.join(venv, MARKER + ".part"), os.path.join(venv, MARKER))
    emit("result", changed=True, created=created, venv=venv, freeze=frozen,
         seconds=marker["seconds"])


def list_dir(args):
    folder = os.path.expanduser(args["dir"])
    files = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not name.endswith(".orch-part"):
                files[name] = os.path.getsize(path)
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
