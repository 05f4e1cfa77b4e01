"""Which wheel fits a target's python (remote/wheels.py, with packaging's tags), and the
bootstrap payload's `platform` and `unpack` actions run here for real: a real pystack wheel
unpacked into its own folder, once; a wheel that would write outside it, or is not the one
pushed, refused with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import zipfile

import pytest

from orchestrator.ground.errors import PayloadError
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.payload_api import bootstrap
from orchestrator.remote.wheels import Platform, file_sha256, fitting_wheel
from tests.support.pystackenv import pystack_wheelhouse

HERE = Platform("cpython", (3, 11), "x86_64", "glibc", (2, 36))
NAME = "pystack-1.7.2-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"


def here() -> Target:
    return Target("dev", LocalTransport("here"))


@pytest.mark.parametrize("name, fits", [
    (NAME, True),
    ("pystack-1.4.1-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl", False),  # machine
    ("pystack-1.7.2-cp312-cp312-manylinux_2_17_x86_64.whl", False),                      # python
    ("pystack-1.7.2-cp311-cp311-manylinux_2_39_x86_64.whl", False),                      # newer glibc
    ("pystack-1.7.2-cp311-cp311-musllinux_1_1_x86_64.whl", False),                       # C library
    ("pystack-1.7.2-cp38-abi3-manylinux1_x86_64.whl", True),                             # stable ABI
    ("pystack-1.7.2-py3-none-any.whl", True),
])
def test_a_wheel_fits_by_its_tags(tmp_path, name, fits):
    (tmp_path / name).write_bytes(b"")
    found, misfits = fitting_wheel(str(tmp_path), "pystack", HERE)
    assert (found == str(tmp_path / name)) is fits
    assert bool(misfits) is not fits and (fits or name in misfits[0])


def test_musl_and_other_pythons():
    alpine = Platform("cpython", (3, 12), "aarch64", "musl", (1, 2))
    assert "musllinux_1_1_aarch64" in alpine.platforms() and "manylinux2014_aarch64" not in alpine.platforms()
    assert Platform("pypy", (3, 10), "x86_64", "glibc", (2, 36)).tags() == set()
    assert Platform.from_facts({"implementation": "cpython", "python": "3.11", "machine": "x86_64",
                                "libc": "glibc", "libc_version": "2.36"}) == HERE


def test_the_newest_fitting_wheel_is_chosen(tmp_path):
    for name in ("pystack-1.4.1-cp311-cp311-manylinux2014_x86_64.whl", NAME, "other-9.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    assert fitting_wheel(str(tmp_path), "pystack", HERE)[0] == str(tmp_path / NAME)
    assert fitting_wheel(str(tmp_path / "missing"), "pystack", HERE) == (None, [])


def test_the_platform_action_describes_this_python():
    facts = bootstrap(here(), "platform", python=sys.executable)
    assert Platform.from_facts(facts).version == sys.version_info[:2]
    assert facts["implementation"] == "cpython" and facts["machine"] and facts["libc"] == "glibc"


@pytest.fixture()
def pushed(tmp_path):
    """The real pystack wheel in a wheelhouse folder root owns (as orch pushes it)."""
    house = tmp_path / "wheelhouse"
    house.mkdir(mode=0o700)
    source = os.path.join(pystack_wheelhouse(), NAME)
    shutil.copy(source, house / NAME)
    return str(house / NAME)


def test_a_real_wheel_is_unpacked_once_into_its_own_folder(pushed, tmp_path):
    dest = tmp_path / "tools" / NAME[:-4]
    args = dict(python=sys.executable, wheel=pushed, sha256=file_sha256(pushed), dest=str(dest))
    assert bootstrap(here(), "unpack", **args)["changed"] is True
    assert (dest / "pystack" / "__main__.py").is_file() and (dest / "pystack.libs").is_dir()
    assert json.loads((dest / ".orch-unpacked.json").read_text())["wheel"] == NAME
    assert stat.S_IMODE(os.stat(dest.parent).st_mode) == 0o700
    assert bootstrap(here(), "unpack", **args)["changed"] is False
    unpacked = bootstrap(here(), "platform", python=sys.executable, tools=str(dest.parent))["unpacked"]
    assert unpacked == {NAME[:-4]: {"wheel": NAME, "sha256": args["sha256"]}}
    assert [p for p in os.listdir(dest.parent) if p.endswith(".part")] == []


def test_a_wheel_that_is_not_the_one_pushed_is_refused(pushed, tmp_path):
    with pytest.raises(PayloadError, match="is not the wheel orch pushed"):
        bootstrap(here(), "unpack", python=sys.executable, wheel=pushed, sha256="0" * 64,
                  dest=str(tmp_path / "tools" / "x"))
    assert not (tmp_path / "tools" / "x").exists()


@pytest.mark.parametrize("member, link", [("../escaped.py", False), ("/abs.py", False),
                                          ("pkg/link", True)])
def test_a_member_outside_its_folder_or_a_link_is_refused(tmp_path, member, link):
    house = tmp_path / "wheelhouse"
    house.mkdir(mode=0o700)
    wheel = house / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
        info = zipfile.ZipInfo(member)
        if link:
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "/etc/passwd" if link else "x = 1")
    dest = tmp_path / "tools" / "evil"
    with pytest.raises(PayloadError, match="outside its folder|not a plain file"):
        bootstrap(here(), "unpack", python=sys.executable, wheel=str(wheel),
                  sha256=file_sha256(str(wheel)), dest=str(dest))
    assert not dest.exists() and not (tmp_path / "tools" / "escaped.py").exists()
    assert [p for p in os.listdir(tmp_path / "tools")] == []
