"""Shared by the payloads that find an installed package without importing it.

Inlined when shipped, like _protocol.py.
"""

import os
import re
import sys
from importlib.machinery import PathFinder

from _protocol import *  # orch: inlined when shipped


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
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", package):   # no "torch\n"
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
                tops = top_level_names(candidate)
                if package in tops:
                    # the distribution's own package is gone (deleted by hand, a
                    # half-finished uninstall): its other top-level names (torch's
                    # functorch, torchgen) are not it
                    raise PayloadError(
                        "package %r is not installed for %s: %s is there, but the package's "
                        "folder is gone (a broken install); reinstall it"
                        % (package, sys.executable, os.path.basename(candidate)), "not-installed")
                for top in tops:
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
        "python_version": "%d.%d.%d" % sys.version_info[:3],
    }
