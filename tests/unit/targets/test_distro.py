"""Which distribution a container without python is, and the command that installs python3.

The os-release texts are the distributions' own files, verbatim.
"""

from orchestrator.targets.distro import OsRelease, fix_commands

DEBIAN_12 = '''PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
'''
UBUNTU_2404 = '''PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
'''
ROCKY_9 = '''NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
'''
ALPINE = '''NAME="Alpine Linux"
ID=alpine
VERSION_ID=3.20.3
PRETTY_NAME="Alpine Linux v3.20"
'''


class FakeTarget:
    name = "sb1-202"


def test_debian_and_its_derivatives_use_apt():
    debian = OsRelease.parse(DEBIAN_12)
    assert (debian.id, debian.pretty_name) == ("debian", "Debian GNU/Linux 12 (bookworm)")
    assert debian.install_python()[-1][-1] == "python3"
    assert OsRelease.parse(UBUNTU_2404).install_python() == debian.install_python()
    assert fix_commands(FakeTarget(), debian) == [
        "orch exec sb1-202 -- apt-get update",
        "orch exec sb1-202 -- env DEBIAN_FRONTEND=noninteractive apt-get install -y "
        "--no-install-recommends python3"]


def test_other_families_get_their_own_package_manager():
    assert OsRelease.parse(ROCKY_9).install_python() == [["dnf", "install", "-y", "python3"]]
    assert OsRelease.parse(ALPINE).install_python() == [["apk", "add", "--no-cache", "python3"]]


def test_an_unknown_distribution_gets_no_made_up_command():
    release = OsRelease.parse('ID=plan9\nPRETTY_NAME="Plan 9"\n')
    assert release.install_python() is None and fix_commands(FakeTarget(), release) == []
    assert OsRelease.parse("").pretty_name == "an unknown Linux"
