"""orch cp into a container on a real Debian 11 root (glibc 2.31, Python 3.9: what Ubuntu
20.04 and Debian 11 fleets run), where chmod(dir_fd=..., follow_symlinks=False) cannot
work: glibc before 2.32 has no fchmodat(AT_SYMLINK_NOFOLLOW), and CPython says so with an
exception. The receiver sets folder modes with fchmod on each folder's own descriptor,
so a copy that merges into a folder there completes, modes and all.

A sandbox of its own (host sbo1, its own state directory); the root is built once by
mmdebstrap from the machine's apt mirrors (bullseye's suites, renamed from the machine's
bookworm ones) and cached under ~/.cache/orch/sandbox-roots (about 45 s the first time).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

import orch_sandbox as sb
from orchestrator.targets.fleet import Fleet

pytestmark = pytest.mark.sandbox

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]
CT = "sbo1-200"
CHMOD_BY_NAME = ("import os\nos.mkdir('/tmp/d')\nfd = os.open('/tmp', os.O_RDONLY)\n"
                 "try:\n    os.chmod('d', 0o750, dir_fd=fd, follow_symlinks=False)\n"
                 "    print('ok')\nexcept (NotImplementedError, ValueError) as error:\n"
                 "    print(type(error).__name__, error)\n")


@pytest.fixture(scope="module")
def old_root(sandbox, tmp_path_factory):
    state = tmp_path_factory.mktemp("old-root") / "state"
    handle = sb.up(1, 1, 0, prefix="sbo", state_dir=state, real_root=(200,),
                   distribution="debian-11")
    fleet = Fleet.from_path(str(handle.inventory_path))
    yield handle, fleet
    fleet.close()
    sb.down(purge=True, state_dir=state, prefix="sbo")


def in_container(fleet, *argv):
    return fleet.targets([CT])[0].run(list(argv), timeout=60)


def test_the_root_is_debian_11_whose_glibc_cannot_chmod_by_name_without_following(old_root):
    _, fleet = old_root
    assert 'VERSION_ID="11"' in in_container(fleet, "cat", "/etc/os-release").text
    facts = in_container(fleet, "python3", "-c", "import platform; print(platform.libc_ver()[1], "
                                                  "platform.python_version())").text.split()
    assert facts[0] == "2.31" and facts[1].startswith("3.9."), facts
    said = in_container(fleet, "python3", "-c", CHMOD_BY_NAME).text.strip()
    assert said != "ok" and "follow_symlinks" in said, said    # the suspicion, measured


def test_a_tree_pushed_and_merged_there_gets_its_folders_modes(old_root, tmp_path):
    handle, fleet = old_root
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (tree / "sub" / "run.sh").chmod(0o751)
    (tree / "sub" / "deeper").chmod(0o700)
    (tree / "sub").chmod(0o750)

    def cp(*args):
        return subprocess.run([*ORCH, "-i", str(handle.inventory_path), "--no-agent", "cp", *args],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    first = cp("-r", str(tree), f"{CT}:/root/")
    assert first.returncode == 0, first.stderr
    assert in_container(fleet, "chmod", "0711", "/root/tree").ok   # theirs now: a merge keeps it
    (tree / "sub" / "new.txt").write_text("second\n")
    (tree / "sub" / "more").mkdir()
    (tree / "sub" / "more").chmod(0o705)
    merged = cp("-r", str(tree), f"{CT}:/root/")
    assert merged.returncode == 0, merged.stderr                # 38c2ac6: failed after the renames
    modes = in_container(fleet, "stat", "-c", "%a %n", "/root/tree", "/root/tree/sub",
                         "/root/tree/sub/deeper", "/root/tree/sub/more",
                         "/root/tree/sub/run.sh").text.split("\n")
    assert modes[:5] == ["711 /root/tree", "750 /root/tree/sub", "700 /root/tree/sub/deeper",
                         "705 /root/tree/sub/more", "751 /root/tree/sub/run.sh"]
    assert in_container(fleet, "cat", "/root/tree/sub/new.txt").text == "second\n"
    left = in_container(fleet, "find", "/root/tree", "-name", ".orch-cp-*").text
    assert left == ""
    assert stat.S_IMODE(os.stat(tree / "sub").st_mode) == 0o750
