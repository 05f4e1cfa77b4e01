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
# An if, not `[ ] && kill`: under set -e a failing kill (the prefetch has ended, its group is
# gone) would end the trap, and the script, with status 1 after a green suite.
stop_prefetch() {
    if [ -n "$prefetch" ]; then kill -- -"$prefetch" 2>/dev/null || true; fi
}
trap stop_prefetch EXIT

# The whole suite runs as two pytest sessions side by side. The tests of the sandbox (marked
# `sandbox`: they share its hosts and containers) run here, on the terminal, on
# ORCH_SANDBOX_WORKERS pytest-xdist workers (default 2; 1: one session), a test file at a time
# each: the first with the machine's sandbox, every other in a network and mount namespace of
# its own with a sandbox of its own (scripts/own-sandbox-namespace.sh; state in STATE_DIR-N).
# Everything else (unit tests, real torch, real trainers) runs beside them on
# ORCH_TEST_WORKERS workers (default 2; 0: the whole suite in one session), its output kept
# in a file and printed when it ends. With -k, -m or a test path: one session, as asked.
workers=${ORCH_TEST_WORKERS:-2}
# A script's background job starts with SIGINT ignored (POSIX), as does a script started that
# way, and python then installs no Ctrl-C handler: the tests of Ctrl-C need the one a
# terminal's command has, so each session starts with the usual dispositions.
usual_signals() {
    .venv/bin/python -c 'import os, signal, sys
for number in (signal.SIGINT, signal.SIGQUIT):
    signal.signal(number, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$@"
}
# pytest-xdist's options for the sandbox's workers: worker 1 uses the machine's sandbox,
# worker N its own in STATE_DIR-N (execnet starts each worker with the `python=` it is given)
sandbox_options=()
sandbox_count=${ORCH_SANDBOX_WORKERS:-2}
if [ "$sandbox_count" -gt 1 ]; then
    sandbox_options=(--dist=loadfile --tx=popen//python=.venv/bin/python)
    for n in $(seq 2 "$sandbox_count"); do
        sandbox_options+=("--tx=popen//python=bash scripts/own-sandbox-namespace.sh ${ORCH_SANDBOX_DIR:-/var/lib/orch-sandbox}-$n .venv/bin/python")
    done
fi
# How busy the machine's CPUs were during the suite (all of them, from /proc/stat): near
# 100 % the suite is CPU-bound and more workers will not make it faster.
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8, $5+$6}' /proc/stat; }
ticks_before=$(cpu_ticks)
started=$(date +%s)
status=0
if [ "$whole" = 0 ] || [ "$workers" = 0 ]; then
    usual_signals .venv/bin/python -m pytest "$@" || status=$?
else
    side="${TMPDIR:-/tmp}/orch-test-parallel.log"
    echo "test: the tests beside the sandbox run on $workers workers (log: $side)"
    usual_signals .venv/bin/python -m pytest -n "$workers" -m "not sandbox" "$@" >"$side" 2>&1 &
    beside=$!
    usual_signals .venv/bin/python -m pytest -m sandbox "${sandbox_options[@]}" "$@" || status=$?
    echo "test: the sandbox's tests took $(( $(date +%s) - started )) s (pytest exit code $status)"
    wait "$beside" || status=$(( status ? status : $? ))
    echo "test: ---------------- the tests beside the sandbox ----------------"
    cat "$side"
fi
echo "test: the suite took $(( $(date +%s) - started )) s (pytest exit code $status)"
echo "$ticks_before $(cpu_ticks)" | awk '$3 > $1 {printf "test: the CPUs were busy %.0f %% of that time\n", 100 * (1 - ($4 - $2) / ($3 - $1))}'

if [ -n "$prefetch" ]; then grep '^prefetch: ' "$log" || true; fi
exit "$status"