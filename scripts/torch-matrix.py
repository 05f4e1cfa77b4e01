#!/usr/bin/env python3
"""The fx-tls release matrix: orch's patcher against the sources of every torch release.

For each release it gets the wheel's ``torch/**/*.py`` and its dist-info into a cache
(~/.cache/orch-test/torch-sources/<version>/site), then, on a hard-link copy of that tree,
runs the fx_patch payload: status, diff, apply (source-only: such a tree has no compiled
parts, so it cannot be imported), compiles every changed file, scans the patched sources
for any module-global read or write of the flag left, checks status says patched and a
second apply changes nothing, reverts and compares every byte with the wheel's RECORD.
Releases 2.14.x must say fixed-upstream and change nothing. Then the same for the fx-threads
patch set, one column per shared state (the flag: upstream from 2.14 on; FX's node-meta
state: a module global everywhere), with no module-global use of a patched name left.

Getting the sources: the wheels are 0.5-0.9 GB CUDA builds. By default only the needed
members are read from the registry with HTTP range requests (the zip central directory at
the end of the wheel, then the blocks holding the .py members: 2-5% of the wheel).
``--fetch pip`` uses ``pip download --no-deps`` instead (one wheel at a time, deleted once
extracted). docs/design/torch-releases.md has the measured cost of both.

Usage:
    scripts/torch-matrix.py                      # every release, a table; exit 1 on failure
    scripts/torch-matrix.py 2.4.1 2.14.1 --json  # some releases, one JSON object per line
    scripts/torch-matrix.py --fetch-only         # fill the cache, check nothing
"""

from __future__ import annotations

import argparse
import ast
import base64
import csv
import fcntl
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from orchestrator.payloads import payload_source  # noqa: E402  (as shipped into a container)

# The latest patch release of each minor that has the global flag, and the two that do not.
RELEASES = {
    "2.1.2": "vulnerable", "2.2.2": "vulnerable", "2.3.1": "vulnerable",
    "2.4.1": "vulnerable", "2.5.1": "vulnerable", "2.6.0": "vulnerable",
    "2.7.1": "vulnerable", "2.8.0": "vulnerable", "2.9.1": "vulnerable",
    "2.10.0": "vulnerable", "2.11.0": "vulnerable", "2.12.1": "vulnerable",
    "2.13.0": "vulnerable", "2.14.0": "fixed-upstream", "2.14.1": "fixed-upstream",
}
CACHE = Path(os.path.expanduser("~/.cache/orch-test/torch-sources"))
INDEX = "https://pypi.org/pypi/torch/json"
FLAG = "_is_fx_tracing_flag"
SYMBOLIC_TRACE = "torch/fx/_symbolic_trace.py"
# The patched _symbolic_trace.py keeps a property of this name on its module class.
MODULE_CLASS = "_ThreadLocalFxTracingFlagModule"
BLOCK = 4 << 20  # bytes per range request; the .py members sit together in the wheel
USER_AGENT = "orch-torch-matrix (+range reads of wheel members)"


def wanted_member(name: str) -> bool:
    top = name.split("/", 1)[0]
    if top.startswith("torch-") and top.endswith(".dist-info"):
        return name.endswith(("/METADATA", "/RECORD", "/top_level.txt"))
    return top == "torch" and name.endswith(".py")


# --- getting a release's sources -------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def registry_releases() -> dict:
    with urllib.request.urlopen(urllib.request.Request(INDEX, headers={"User-Agent": USER_AGENT}),
                                timeout=120) as response:
        return json.load(response)["releases"]


def wheel_file(version: str) -> dict:
    """The registry's entry for one linux x86_64 CPython wheel of the release (any python
    version: the .py members are the same)."""
    files = registry_releases().get(version, [])
    wheels = [f for f in files if f["filename"].endswith(".whl") and "x86_64" in f["filename"]
              and "manylinux" in f["filename"]]
    if not wheels:
        raise SystemExit("torch %s: no linux x86_64 wheel on the registry" % version)
    wheels.sort(key=lambda f: ("cp311" not in f["filename"], f["filename"]))
    # A mirror of the registry may answer with URLs relative to the index.
    return dict(wheels[0], url=urllib.parse.urljoin(INDEX, wheels[0]["url"]))


class RangeReader(io.RawIOBase):
    """A read-only, seekable view of a remote file that fetches BLOCK-sized ranges on demand
    (kept in memory while in use), enough for zipfile to read the central directory and
    the members asked for."""

    def __init__(self, url: str, size: int):
        super().__init__()
        self.url, self.size, self.position = url, size, 0
        self.blocks: dict[int, bytes] = {}
        self.requests = 0
        self.fetched = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def block(self, index: int) -> bytes:
        if index not in self.blocks:
            if len(self.blocks) > 8:  # members are read in offset order: old blocks are done
                self.blocks.pop(min(self.blocks))
            start = index * BLOCK
            end = min(start + BLOCK, self.size) - 1
            request = urllib.request.Request(self.url, headers={
                "Range": "bytes=%d-%d" % (start, end), "User-Agent": USER_AGENT})
            for attempt in range(4):
                try:
                    with urllib.request.urlopen(request, timeout=120) as response:
                        if response.status != 206:
                            raise OSError("the registry ignored the range request (HTTP %d)"
                                          % response.status)
                        data = response.read()
                    break
                except OSError:
                    if attempt == 3:
                        raise
                    time.sleep(2 ** attempt)
            if len(data) != end - start + 1:
                raise OSError("short range read at %d: %d bytes" % (start, len(data)))
            self.requests += 1
            self.fetched += len(data)
            self.blocks[index] = data
        return self.blocks[index]

    def readinto(self, buffer):
        if self.position >= self.size:
            return 0
        count = min(len(buffer), self.size - self.position)
        done = 0
        while done < count:
            index, within = divmod(self.position, BLOCK)
            piece = self.block(index)[within:within + count - done]
            buffer[done:done + len(piece)] = piece
            done += len(piece)
            self.position += len(piece)
        return done


def extract_members(archive: zipfile.ZipFile, destination: Path) -> int:
    members = sorted((info for info in archive.infolist() if wanted_member(info.filename)),
                     key=lambda info: info.header_offset)
    for info in members:
        archive.extract(info, destination)  # zipfile checks every member's CRC
    return len(members)


def fetch_by_ranges(version: str, destination: Path) -> dict:
    entry = wheel_file(version)
    reader = RangeReader(entry["url"], entry["size"])
    with zipfile.ZipFile(io.BufferedReader(reader, buffer_size=1 << 16)) as archive:
        count = extract_members(archive, destination)
    return {"wheel": entry["filename"], "wheel_bytes": entry["size"], "members": count,
            "requests": reader.requests, "bytes_fetched": reader.fetched}


def fetch_by_pip(version: str, destination: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="torch-wheel-") as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "--disable-pip-version-check", "--only-binary", ":all:",
                        "-d", download, "torch==%s" % version], check=True)
        (wheel,) = Path(download).glob("torch-*.whl")
        size = wheel.stat().st_size
        with zipfile.ZipFile(wheel) as archive:
            count = extract_members(archive, destination)
    return {"wheel": wheel.name, "wheel_bytes": size, "members": count,
            "bytes_fetched": size}


def release_site(version: str, method: str = "range", cache: Path = CACHE) -> tuple[Path, dict]:
    """The cached source tree of one release (fetched on first use), and how it was got.
    Under a lock per release: two test workers that ask at once fetch it once."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".lock-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _release_site(version, method, cache)


def _release_site(version: str, method: str, cache: Path) -> tuple[Path, dict]:
    home = cache / version
    site, info_file = home / "site", home / "fetched.json"
    if info_file.exists():
        return site, dict(json.loads(info_file.read_text()), cached=True)
    shutil.rmtree(home, ignore_errors=True)
    partial = cache / (".partial-" + version)
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    fetch = fetch_by_pip if method == "pip" else fetch_by_ranges
    info = fetch(version, partial / "site")
    info.update(method=method, seconds=round(time.monotonic() - started, 1))
    (partial / "fetched.json").write_text(json.dumps(info, indent=2) + "\n")
    partial.rename(home)  # only a complete tree is ever in the cache
    return site, dict(info, cached=False)


# --- checking one release --------------------------------------------------------------------


def run_fx_patch(python: str, site: Path, action: str, record_dir: Path,
                 patch_set: str = "fx-tls") -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site),
           "PYTHONDONTWRITEBYTECODE": "1", "ORCH_FX_PATCH_SOURCE_TREE": "1"}
    proc = subprocess.run([python, "-", json.dumps({"action": action, "orch_version": "matrix",
                                                    "patch_set": patch_set,
                                                    "record_dir": str(record_dir)})],
                          input=payload_source("fx_patch"), capture_output=True, env=env, timeout=600)
    lines = proc.stdout.decode().strip().splitlines()
    last = json.loads(lines[-1]) if lines else {"event": "error", "message": proc.stderr.decode()}
    if last.get("event") != "result":
        raise CheckFailed("%s: %s" % (action, last.get("message")))
    return last


class CheckFailed(Exception):
    pass


def dist_record(site: Path) -> dict:
    (record,) = site.glob("torch-*.dist-info/RECORD")
    with open(record, newline="") as f:
        return {row[0]: row[1] for row in csv.reader(f) if len(row) > 1 and row[1]}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def tree_digest(site: Path) -> dict:
    return {str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(site.rglob("*")) if p.is_file()}


def global_flag_uses(relpath: str, source: bytes) -> list[str]:
    """Every place a patched file still reads or writes the module-global flag: the bare
    name outside the module class's property, `global` of it, or the attribute on the
    _symbolic_trace module (which after the patch is only for code outside torch)."""
    tree = ast.parse(source)
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == MODULE_CLASS:
            allowed.update(ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if node in allowed:
            continue
        if isinstance(node, ast.Name) and node.id == FLAG:
            found.append("%s:%d: the name %s" % (relpath, node.lineno, FLAG))
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and FLAG in node.names:
            found.append("%s:%d: global %s" % (relpath, node.lineno, FLAG))
        elif isinstance(node, ast.Attribute) and node.attr == FLAG:
            found.append("%s:%d: attribute .%s" % (relpath, node.lineno, FLAG))
    return found


def check_release(version: str, site: Path, python: str) -> dict:
    expected = RELEASES.get(version, "vulnerable")
    with tempfile.TemporaryDirectory(prefix="torch-matrix-") as work:
        copy = Path(work) / "site"
        # Hard links: fx_patch replaces files by rename, so the cache is never written.
        subprocess.run(["cp", "-al", str(site), str(copy)], check=True)
        record_dir = Path(work) / "record"
        before = tree_digest(copy)
        status = run_fx_patch(python, copy, "status", record_dir)
        out = {"version": version, "status": status["status"],
               "torch_version": status["torch_version"]}
        if status["status"] != expected:
            raise CheckFailed("status says %s (%s), expected %s"
                              % (status["status"], status["message"], expected))
        diff = run_fx_patch(python, copy, "diff", record_dir)
        applied = run_fx_patch(python, copy, "apply", record_dir)
        if expected == "fixed-upstream":
            if diff["diff"] or applied["changed"] or tree_digest(copy) != before:
                raise CheckFailed("fixed-upstream, yet diff/apply changed something")
            return dict(out, files=[])
        changed = [f["path"] for f in applied["files"]]
        out["files"] = changed
        out["diff_lines"] = len(diff["diff"].splitlines())
        for relpath in changed:
            source = (copy / relpath).read_bytes()
            compile(source, relpath, "exec", dont_inherit=True)
        # Every file of the patched tree that still names the flag, checked by its AST.
        leftovers = []
        for path in sorted((copy / "torch").rglob("*.py")):
            source = path.read_bytes()
            if FLAG.encode() in source:
                leftovers += global_flag_uses(str(path.relative_to(copy)), source)
        if leftovers:
            raise CheckFailed("module-global uses of the flag left after apply: "
                              + "; ".join(leftovers))
        again = run_fx_patch(python, copy, "status", record_dir)
        if again["status"] != "patched":
            raise CheckFailed("after apply, status says %s" % again["status"])
        if run_fx_patch(python, copy, "apply", record_dir)["changed"]:
            raise CheckFailed("a second apply changed something")
        reverted = run_fx_patch(python, copy, "revert", record_dir)
        record = dist_record(copy)
        for relpath in changed:
            if record_hash((copy / relpath).read_bytes()) != record.get(relpath):
                raise CheckFailed("after revert %s differs from the wheel's RECORD" % relpath)
        if tree_digest(copy) != before or reverted["status"] != "vulnerable":
            raise CheckFailed("revert did not give back the tree as it was")
        return out


# fx-threads: every shared state, one column each. The flag is upstream from 2.14 on; the
# node-meta state of torch/fx/traceback.py and the trace-time patching (_Patcher, with the
# module-global CURRENT_PATCHER from 2.5 on) are process-wide in every release (2.14.1 too).
NODE_META_NAMES = ("current_meta", "current_replay_node", "should_preserve_node_meta",
                   "_should_preserve_node_meta")
NODE_META_MODULE_CLASS = "_ThreadLocalNodeMetaModule"
PATCHER_MODULE_CLASS = "_ThreadLocalPatcherModule"
TRACEBACK = "torch/fx/traceback.py"


def expected_states(version: str) -> dict:
    flag = "upstream" if RELEASES.get(version) == "fixed-upstream" else "vulnerable"
    return {"fx-tracing-flag": flag, "node-meta": "vulnerable", "trace-patching": "vulnerable"}


def node_meta_global_uses(relpath: str, source: bytes) -> list[str]:
    """Module-global uses of the node-meta names left in a patched file: `global NAME`, a
    bare NAME in traceback.py outside its module class, `<...>traceback.NAME` elsewhere,
    `from torch.fx.traceback import NAME`."""
    tree = ast.parse(source)
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in (NODE_META_MODULE_CLASS,
                                                            PATCHER_MODULE_CLASS):
            allowed.update(ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if node in allowed:
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & set(NODE_META_NAMES):
            found.append("%s:%d: global %s" % (relpath, node.lineno, ", ".join(node.names)))
        elif relpath == TRACEBACK and isinstance(node, ast.Name) and node.id in NODE_META_NAMES:
            found.append("%s:%d: the name %s" % (relpath, node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in NODE_META_NAMES and \
                isinstance(node.value, (ast.Name, ast.Attribute)) and \
                ast.unparse(node.value).endswith("traceback"):
            found.append("%s:%d: attribute .%s" % (relpath, node.lineno, node.attr))
        elif relpath == SYMBOLIC_TRACE and (
                isinstance(node, ast.Name) and node.id == "CURRENT_PATCHER" or
                isinstance(node, ast.Global) and "CURRENT_PATCHER" in node.names):
            found.append("%s:%d: module-global CURRENT_PATCHER" % (relpath, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.fx.traceback" and \
                set(a.name for a in node.names) & set(NODE_META_NAMES):
            found.append("%s:%d: imported by name" % (relpath, node.lineno))
    return found


def check_threads(version: str, site: Path, python: str) -> dict:
    """fx-threads on one release's sources: one status row per shared state as expected,
    apply rewrites every use (no module-global use of a patched name left, every file
    compiles), status patched, a second apply changes nothing, revert gives back every
    byte of the wheel's RECORD."""
    expected = expected_states(version)
    with tempfile.TemporaryDirectory(prefix="torch-matrix-") as work:
        copy = Path(work) / "site"
        subprocess.run(["cp", "-al", str(site), str(copy)], check=True)
        record_dir = Path(work) / "record"
        before = tree_digest(copy)
        status = run_fx_patch(python, copy, "status", record_dir, "fx-threads")
        rows = {r["state"]: r for r in status["states"]}
        states = {key: row["status"] for key, row in rows.items()}
        out = {"version": version, "states": states,
               "where": {key: row["where"] for key, row in rows.items()},
               "names": {key: row["why"] for key, row in rows.items()}}
        if states != expected:
            raise CheckFailed("fx-threads status rows %s, expected %s (%s)"
                              % (states, expected, status["message"]))
        applied = run_fx_patch(python, copy, "apply", record_dir, "fx-threads")
        changed = [f["path"] for f in applied["files"]]
        out["files"] = changed
        leftovers = []
        for relpath in changed:
            source = (copy / relpath).read_bytes()
            compile(source, relpath, "exec", dont_inherit=True)
            leftovers += node_meta_global_uses(relpath, source)
            if relpath == SYMBOLIC_TRACE and source.count(b"new_fn = _orch_thread_guard(") != 2:
                leftovers.append("%s: _Patcher.patch/patch_method are not both guarded" % relpath)
            if FLAG.encode() in source:
                leftovers += global_flag_uses(relpath, source)
        if leftovers:
            raise CheckFailed("module-global uses left after apply: " + "; ".join(leftovers))
        after = {r["state"]: r["status"] for r in applied["states"]}
        if set(after.values()) - {"patched", "upstream"}:
            raise CheckFailed("after apply, the rows say %s" % after)
        if run_fx_patch(python, copy, "apply", record_dir, "fx-threads")["changed"]:
            raise CheckFailed("a second fx-threads apply changed something")
        run_fx_patch(python, copy, "revert", record_dir, "fx-threads")
        record = dist_record(copy)
        for relpath in changed:
            if record_hash((copy / relpath).read_bytes()) != record.get(relpath):
                raise CheckFailed("after revert %s differs from the wheel's RECORD" % relpath)
        if tree_digest(copy) != before:
            raise CheckFailed("fx-threads revert did not give back the tree as it was")
        return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("versions", nargs="*", help="releases (default: all of the matrix)")
    parser.add_argument("--fetch", choices=("range", "pip"), default="range",
                        help="how to get a release's sources the first time (default range)")
    parser.add_argument("--fetch-only", action="store_true", help="fill the cache only")
    parser.add_argument("--cache", type=Path, default=CACHE,
                        help="where the release trees are kept (default %(default)s)")
    parser.add_argument("--python", default=sys.executable,
                        help="the python that runs the payload (default this one)")
    parser.add_argument("--json", action="store_true", help="one JSON object per release")
    args = parser.parse_args(argv)
    failures = 0
    for version in args.versions or list(RELEASES):
        started = time.monotonic()
        site, fetched = release_site(version, args.fetch, args.cache)
        row = {"version": version, "fetch": fetched}
        if not args.fetch_only:
            try:
                row.update(check_release(version, site, args.python), ok=True)
                row["fx_threads"] = check_threads(version, site, args.python)
            except CheckFailed as exc:
                row.update(ok=False, problem=str(exc))
                failures += 1
        row["seconds"] = round(time.monotonic() - started, 1)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            how = "cached" if fetched["cached"] else "fetched %.0f MB in %ss" % (
                fetched["bytes_fetched"] / 1e6, fetched["seconds"])
            verdict = ("ok: fx-tls %s, %d file(s); fx-threads %s, %d file(s)"
                       % (row["status"], len(row["files"]),
                          " ".join("%s=%s" % kv for kv in row["fx_threads"]["states"].items()),
                          len(row["fx_threads"]["files"])) if row.get("ok")
                       else "FAILED: %s" % row.get("problem", "not checked"))
            print("%-7s %-28s %s" % (version, how, verdict if not args.fetch_only else ""),
                  flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
