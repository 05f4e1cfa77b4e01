#!/usr/bin/env bash
# Sets up and runs the whole test suite: unit tests, real torch, and integration tests against
# the sandbox (real sshd + real LXC containers). Needs root for the sandbox. Extra arguments
# go to pytest (e.g. scripts/test.sh -k grep -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/orch sandbox up
export ORCH_REQUIRE_SANDBOX=1
exec .venv/bin/python -m pytest "$@"
