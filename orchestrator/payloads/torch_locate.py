"""Find an installed Python package (torch by default) without importing it.

Shipped alone into a container and run with the container's python; standard library
only, Python 3.8+.

Protocol
--------
Invocation: ``PYTHON - ARGS_JSON`` with this file on stdin, or ``PYTHON torch_locate.py
ARGS_JSON``. ARGS_JSON is one argv element holding a JSON object; unknown keys are an
error.

Args::

    {"package": "torch"}      # an import name ("torch", "yaml") or a distribution
                              # name ("torch", "PyYAML"); default "torch"

Output: JSON lines on stdout. The last line is the result (exit code 0)::

    {"event": "result", "package": "torch", "import_name": "torch",
     "distribution": "torch", "version": "2.13.0+cpu",
     "site_packages": "/root/venv/lib/python3.11/site-packages",
     "package_dir": ".../site-packages/torch",
     "dist_info": ".../site-packages/torch-2.13.0+cpu.dist-info",
     "python": "/root/venv/bin/python", "python_version": "3.11.2"}

``version``, ``distribution`` and ``dist_info`` are null when no dist-info directory
belongs to the package. On failure the last line is (exit code 1)::

    {"event": "error", "message": "<a sentence a user can act on>", "kind": "..."}

with kind "bad-args", "not-installed" or "internal".

The package is looked up on sys.path minus the entry Python puts first for the script
(the current directory with ``-``): a ``torch`` folder in the working directory is not
the installed torch.
"""

import json
import os
import platform
import re
import sys
from importlib.machinery import PathFinder

# --- protocol (same copy in every payload) ---------------------------------------------

REQUIRED = object()


class PayloadError(Exception):
    """An expected failure: reported as an error event, never as a traceback."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


def emit(event, **fields):
    line = dict(event=event)
    line.update(fields)
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def _type_ok(value, expected):
    # JSON true/false are bools, and bool is an int subclass: keep them apart.
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)


def parse_args(argv, spec):
    """Validate the single JSON argv element against spec {name: (type, default)}."""
    if len(argv) != 1:
        raise PayloadError("expected exactly one argument: a JSON object of options", "bad-args")
    try:
        given = json.loads(argv[0])
    except ValueError as exc:
        raise PayloadError("the argument is not valid JSON: %s" % exc, "bad-args") from None
    if not isinstance(given, dict):
        raise PayloadError("the argument must be a JSON object", "bad-args")
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise PayloadError("unknown option(s): %s; known: %s"
                           % (", ".join(unknown), ", ".join(sorted(spec))), "bad-args")
    args = {}
    for name, (expected, default) in spec.items():
        if name not in given:
            if default is REQUIRED:
                raise PayloadError("missing required option %r" % name, "bad-args")
            args[name] = default
            continue
        value = given[name]
        if value is not None and not _type_ok(value, expected):
            raise PayloadError("option %r must be of type %s, got %r"
                               % (name, expected.__name__, value), "bad-args")
        args[name] = default if value is None else value
    return args


def run_main(argv, spec, run):
    """Parse args, run, and print the final result or error line; returns the exit code."""
    try:
        result = run(parse_args(argv[1:], spec))
    except PayloadError as exc:
        emit("error", message=str(exc), kind=exc.kind)
        return 1
    except Exception as exc:  # unexpected: still one error line, with the exception text
        emit("error", message="unexpected %s: %s" % (type(exc).__name__, exc), kind="internal")
        return 1
    emit("result", **result)
    return 0

# --- end protocol -------------------------------------------------------------------------

# --- locate (same copy in every payload that needs it) -----------------------------------


def normalize_dist_name(name):
    """PEP 503 normalisation: 'PyYAML', 'pyyaml' and 'py_yaml' compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def search_path():
    """sys.path without the script's own entry (cwd for ``python -``), unless isolated."""
    entries = list(sys.path)
    isolated = sys.flags.isolated or getattr(sys.flags, "safe_path", False)
    if entries and not isolated:
        entries = entries[1:]
    return [entry or os.getcwd() for entry in entries if os.path.isdir(entry or ".")]


def read_metadata(dist_info):
    """Name and Version headers of a dist-info METADATA file ({} when unreadable)."""
    headers = {}
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep and key in ("Name", "Version"):
                    headers[key] = value.strip()
    except OSError:
        pass
    return headers


def read_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\r\n") for line in f]
    except OSError:
        return []


def dist_infos_in(directory):
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if n.endswith(".dist-info")]


def top_level_names(dist_info):
    """Import names a distribution installs: top_level.txt, else RECORD's first parts."""
    names = [n.strip() for n in read_lines(os.path.join(dist_info, "top_level.txt")) if n.strip()]
    if names:
        return names
    found = []
    for row in read_lines(os.path.join(dist_info, "RECORD")):
        path = row.split(",", 1)[0]
        match = re.match(r"^([A-Za-z_]\w*)(?:\.py|/__init__\.py)$", path)
        if match and match.group(1) not in found:
            found.append(match.group(1))
    return found


def owning_dist_info(site_packages, import_name, requested):
    """The dist-info in site_packages that installed import_name, or None."""
    candidates = dist_infos_in(site_packages)
    for dist_info in candidates:
        name = read_metadata(dist_info).get("Name", "")
        if normalize_dist_name(name) == normalize_dist_name(requested):
            return dist_info
    for dist_info in candidates:
        if import_name in top_level_names(dist_info):
            return dist_info
    return None


def find_import_spec(import_name, paths):
    # PathFinder reads the file system only: unlike importlib.import_module it never runs
    # the package's __init__ and never consults meta-path hooks that could run code.
    return PathFinder.find_spec(import_name, paths)


def spec_location(spec):
    """(package_dir, site_packages) for a top-level module or package spec."""
    if spec.submodule_search_locations:
        package_dir = list(spec.submodule_search_locations)[0]
    else:
        package_dir = spec.origin
    return package_dir, os.path.dirname(package_dir)


def locate(package):
    """Where `package` is installed, as a dict; raises PayloadError when it is not."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", package):
        raise PayloadError("package name %r is not a valid name" % package, "bad-args")
    paths = search_path()
    import_name = package
    spec = find_import_spec(package, paths) if package.isidentifier() else None
    dist_info = None
    if spec is None:
        # Not an import name: maybe a distribution name ("PyYAML" installs "yaml").
        for directory in paths:
            for candidate in dist_infos_in(directory):
                name = read_metadata(candidate).get("Name", "")
                if normalize_dist_name(name) != normalize_dist_name(package):
                    continue
                for top in top_level_names(candidate):
                    spec = find_import_spec(top, [directory])
                    if spec is not None:
                        import_name, dist_info = top, candidate
                        break
                if spec is not None:
                    break
            if spec is not None:
                break
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise PayloadError(
            "package %r is not installed for %s (searched %d sys.path entries); install it "
            "in this environment or point orch at the venv that has it"
            % (package, sys.executable, len(paths)), "not-installed")
    package_dir, site_packages = spec_location(spec)
    if dist_info is None:
        dist_info = owning_dist_info(site_packages, import_name, package)
    metadata = read_metadata(dist_info) if dist_info else {}
    return {
        "package": package,
        "import_name": import_name,
        "distribution": metadata.get("Name"),
        "version": metadata.get("Version"),
        "site_packages": site_packages,
        "package_dir": package_dir,
        "dist_info": dist_info,
        "python": sys.executable,
        "python_version": platform.python_version(),
    }

# --- end locate ---------------------------------------------------------------------------


ARG_SPEC = {"package": (str, "torch")}


def run(args):
    return locate(args["package"])


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
