#!/usr/bin/env bash
# Sets up and runs the whole test suite: unit tests, real torch, and integration tests against
# the sandbox (real sshd + real LXC containers). Needs root for the sandbox. Extra arguments
# go to pytest (e.g. scripts/test.sh -k grep -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/orch sandbox up
export ORCH_REQUIRE_SANDBOX=1
# Workers (pytest-xdist): the sandbox's tests run one after another on one of them, the rest
# (unit tests, real torch, real trainers) on the others. ORCH_TEST_WORKERS=0: no workers.
workers=${ORCH_TEST_WORKERS:-3}
if [ "$workers" = 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
