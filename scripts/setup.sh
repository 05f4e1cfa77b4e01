#!/usr/bin/env bash
# Sets orch up on a fresh Debian 12 machine: the system packages the sandbox needs (when run
# as root with apt), and .venv with orch, its test extras and the sandbox (sandbox/, its own
# distribution: the orch package does not carry it). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    packages=$(grep -v '^[[:space:]]*\(#\|$\)' .ci/apt-packages.txt)
    wanted=$(echo $packages | wc -w)
    # shellcheck disable=SC2086
    installed=$(dpkg-query -W -f='${db:Status-Status}\n' $packages 2>/dev/null | grep -c '^installed$' || true)
    if [ "$installed" -eq "$wanted" ]; then
        echo "setup: system packages already installed"
    else
        echo "setup: installing system packages: $(echo $packages)"
        apt-get update -qq
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
    fi
    # npm, for the MCP Inspector test (`orch mcp`). Not in apt-packages.txt: a machine with
    # NodeSource's nodejs has npm inside it, and that package conflicts with Debian's npm.
    if ! command -v npm >/dev/null; then
        echo "setup: installing nodejs and npm (the MCP Inspector test)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
echo "setup: installing orch and the sandbox into .venv"
# One pip call for both: the sandbox's requirement on orch is met by this clone's orch.
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]' -e ./sandbox
echo "setup: done. Try: .venv/bin/orch --help"
