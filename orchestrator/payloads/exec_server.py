"""Payload: a persistent command server inside the container (stdlib only).

Started once as `PYTHON -u -c SOURCE` over one `pct exec` channel, it reads one JSON
request per line on stdin and answers one JSON line per request on stdout:
  request  {"id": 1, "argv": [...], "stdin": base64 | null, "timeout": seconds | null, "env": {}}
  response {"id": 1, "exit_code": 0, "stdout": base64, "stderr": base64, "duration": s}
           {"id": 1, "error": "...", "kind": "not-found" | "timeout" | "bad-request"}
Commands are argv lists run without a shell. The server saves a new SSH channel, a new
`pct exec` and a new interpreter per command: about 1-3 ms instead of 10-20 ms.
"""

import base64
import json
import os
import subprocess
import sys
import time


def handle(request):
    argv = request["argv"]
    stdin = request.get("stdin")
    env = dict(os.environ)
    env.update(request.get("env") or {})
    started = time.time()
    try:
        done = subprocess.run(argv, input=base64.b64decode(stdin) if stdin is not None else None,
                              stdin=None if stdin is not None else subprocess.DEVNULL,
                              capture_output=True, timeout=request.get("timeout"), env=env)
    except FileNotFoundError:
        return {"error": "%s: command not found" % argv[0], "kind": "not-found"}
    except PermissionError:
        return {"error": "%s: permission denied" % argv[0], "kind": "not-found"}
    except subprocess.TimeoutExpired as expired:
        return {"error": "timed out after %s s" % expired.timeout, "kind": "timeout"}
    code = done.returncode if done.returncode >= 0 else 128 - done.returncode
    return {"exit_code": code, "duration": time.time() - started,
            "stdout": base64.b64encode(done.stdout).decode("ascii"),
            "stderr": base64.b64encode(done.stderr).decode("ascii")}


def main():
    out = sys.stdout
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = handle(request)
        except (ValueError, KeyError, TypeError) as error:
            request, reply = {}, {"error": "bad request: %s" % error, "kind": "bad-request"}
        reply["id"] = request.get("id") if isinstance(request, dict) else None
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
