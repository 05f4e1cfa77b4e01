#!/usr/bin/env bash
# Sets up and runs the whole test suite: unit tests, real torch, and integration tests against
# the sandbox (real sshd + real LXC containers). Needs root for the sandbox. Extra arguments
# go to pytest (e.g. scripts/test.sh -k grep -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/orch sandbox up
export ORCH_REQUIRE_SANDBOX=1

# The whole suite (no -k, -m or test path given): its big venvs are built in the background
# from the start (tests/prefetch.py), beside the unit tests. ORCH_TEST_PREFETCH=0: not.
whole=1
for arg in "$@"; do
    case "$arg" in -k|-m|-k*|-m*|tests*|./tests*) whole=0 ;; esac
done
prefetch=
if [ "$whole" = 1 ] && [ "${ORCH_TEST_PREFETCH:-1}" != 0 ]; then
    log="${TMPDIR:-/tmp}/orch-test-prefetch.log"
    echo "test: building the cached venvs in the background (log: $log)"
    # its own process group, so that stopping it stops the pip it may be running too
    setsid .venv/bin/python -m tests.prefetch >"$log" 2>&1 &
    prefetch=$!
fi
trap '[ -n "$prefetch" ] && kill -- -"$prefetch" 2>/dev/null; true' EXIT

# Workers (pytest-xdist): the sandbox's tests run one after another on one of them, the rest
# (unit tests, real torch, real trainers) on the others. ORCH_TEST_WORKERS=0: no workers.
workers=${ORCH_TEST_WORKERS:-3}
started=$(date +%s)
status=0
if [ "$workers" = 0 ]; then
    .venv/bin/python -m pytest "$@" || status=$?
else
    .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@" || status=$?
fi
echo "test: the suite took $(( $(date +%s) - started )) s (pytest exit code $status)"
[ -n "$prefetch" ] && grep '^prefetch: ' "$log" || true
exit "$status"
