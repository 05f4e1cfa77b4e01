#!/usr/bin/env bash
# Issue 39's orch-level checks on one GPU: `orch verify compile-deadlock`, and `orch run` of
# the DFlash GPU playbook with its three drafters on ONE GPU, hung (the remedy off) and
# remedied, on a torch patched by the playbook (fx-threads), then reverted.
#
#   bash scripts/gpu-deadlock-runs.sh PART [VENV] [RESULTS]
#     PART hang     verify compile-deadlock, then the run with backward_in_thread=false and
#                   the compiles side by side: expect verdict hang, the cycle in its finding,
#                   the stacks in its record (about 4 minutes)
#     PART steady   the run remedied (compiles side by side, each backward on its thread),
#                   then the way it ran before (--serialize-compile, no remedy), warm cache:
#                   each one's tok/s (about 3 minutes)
#     PART repeat   REPEATS (default 2) more pairs of the two, alternating, then two runs of
#                   two drafters side by side without the remedy (about 5 minutes)
#     PART per-thread  the run with each drafter its own torch.compile (--compile-per-thread),
#                   unchanged (expect hang, its cycle and stacks) and remedied (about 3 minutes)
#   e.g. bash scripts/gpu-deadlock-runs.sh hang /opt/torch/.venv "$OUT"
#
# VENV's python holds a CUDA torch; orch runs from this tree (PYTHONPATH) in a venv made on
# top of VENV with orch's dependencies installed from the wheels in .whl/ (no index needed;
# made on a machine with one by pip download --only-binary=:all: --python-version 3.12 ...),
# pystack's wheel among them for the hang's stacks. RESULTS gets summary.txt and
# results.tar.gz: each command's output, each run's record (JSON) and Markdown report, and
# orch's data dir.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:?usage: $0 hang|steady|repeat|per-thread [VENV] [RESULTS]}
VENV=${2:-/opt/torch/.venv}
RESULTS=${3:-gpu-deadlock-runs}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
SCRATCH=$(mktemp -d /tmp/orch-gpu-runs-XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
# the run records in a scratch data dir, tarred into RESULTS at the end (few files come back)
export ORCH_DATA_DIR="$SCRATCH/data" PYTHONPATH="$PWD" ORCH_AGENT=off
: > "$RESULTS/summary.txt"
note() { echo "$*" | tee -a "$RESULTS/summary.txt"; }

# the controller's venv: VENV's packages (torch) seen, orch's dependencies added from .whl
"$VENV/bin/python" -m venv --system-site-packages "$SCRATCH/ctl"
"$SCRATCH/ctl/bin/pip" install -q --no-index --find-links .whl click pyyaml jinja2 rich paramiko \
    proxmoxer requests packaging prometheus-client > "$RESULTS/ctl-install.out" 2>&1
note "controller venv: exit $? ($(tail -n 1 "$RESULTS/ctl-install.out"))"
# pystack where `orch stacks` looks first (its pinned sha256 is checked before it is pushed)
mkdir -p ~/.cache/orch/tool-wheels && cp .whl/pystack-*.whl ~/.cache/orch/tool-wheels/ 2>/dev/null
INVENTORY="$RESULTS/inventory.yaml"
. scripts/local-gpu-inventory.sh
local_gpu_inventory "$INVENTORY" "$VENV"
orch() { "$SCRATCH/ctl/bin/python" -m orchestrator -i "$INVENTORY" "$@"; }
step() {  # step NAME CMD...: its output kept, its exit code and time noted
    local name=$1 started=$SECONDS; shift
    "$@" > "$RESULTS/$name.out" 2>&1
    local code=$?
    note "$name: exit $code in $((SECONDS - started)) s; $(grep -E '^verdict|verdict:|->' "$RESULTS/$name.out" | tail -n 2 | tr '\n' ' ' | cut -c1-600)"
}
report() {
    orch report last --md "$RESULTS/report-$1.md" > /dev/null 2>&1
    orch runs show last --json > "$RESULTS/record-$1.json" 2> /dev/null
}
note "versions: $("$VENV/bin/python" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))' 2>&1)"

# One GPU, three drafters: the playbook's `devices: cuda:0` puts all three on it.
SIDE_BY_SIDE=(-e 'extra_args=[]' -e steps=300 -e max_seconds=240)
case "$PART" in
hang)
    step verify-compile-deadlock orch verify compile-deadlock -t gpu --drafters 3 --hang-after 60 --json
    note "  $(tr -d '\n' < "$RESULTS/verify-compile-deadlock.out" | cut -c1-1200)"
    # The cycle needs one drafter's lazily compiled backward on the device thread while
    # another compiles its forward: a matter of timing. Up to HANG_TRIES runs, each with a
    # cold inductor cache of its own, until one hangs.
    for try in $(seq 1 "${HANG_TRIES:-3}"); do
        step "run-hung-$try" orch run playbooks/dflash-gpu.yaml -e 'extra_args=[]' -e steps=60 \
            -e max_seconds=200 -e verify_trials=1 -e backward_in_thread=false -e hang_after=45 \
            -e inductor_cache="$SCRATCH/cache-hung-$try"
        report "run-hung-$try"
        grep -q "verdict: hang" "$RESULTS/run-hung-$try.out" && break
    done
    ;;
steady)
    # the reproducer again, on the torch the playbook patches (the runs below patch it too)
    step apply orch patch fx-threads apply -t gpu --json
    step verify-compile-deadlock-patched orch verify compile-deadlock -t gpu --drafters 3 --hang-after 60 --json
    note "  $(tr -d '\n' < "$RESULTS/verify-compile-deadlock-patched.out" | cut -c1-1200)"
    step run-remedied orch run playbooks/dflash-gpu.yaml "${SIDE_BY_SIDE[@]}"
    report run-remedied
    step run-serialized orch run playbooks/dflash-gpu.yaml -e 'extra_args=[--serialize-compile]' \
        -e backward_in_thread=false -e steps=300 -e max_seconds=240
    report run-serialized
    ;;
repeat)
    # the remedy's cost again, alternating (REPEATS pairs), then two drafters side by side
    # without the remedy (a hang was seen once in three such runs before the remedy existed)
    for n in $(seq 1 "${REPEATS:-2}"); do
        step "run-remedied-$n" orch run playbooks/dflash-gpu.yaml "${SIDE_BY_SIDE[@]}"
        report "run-remedied-$n"
        step "run-serialized-$n" orch run playbooks/dflash-gpu.yaml -e 'extra_args=[--serialize-compile]' \
            -e backward_in_thread=false -e steps=300 -e max_seconds=240
        report "run-serialized-$n"
    done
    for try in 1 2; do
        step "run-two-$try" orch run playbooks/dflash-gpu.yaml -e drafters=2 -e 'extra_args=[]' -e steps=60 \
            -e max_seconds=200 -e verify_trials=1 -e backward_in_thread=false -e hang_after=45 \
            -e inductor_cache="$SCRATCH/cache-two-$try"
        report "run-two-$try"
    done
    ;;
per-thread)
    # each drafter its own torch.compile (--compile-per-thread): unchanged, then remedied
    step run-hung orch run playbooks/dflash-gpu.yaml -e 'extra_args=[--compile-per-thread]' \
        -e steps=60 -e max_seconds=200 -e verify_trials=1 -e backward_in_thread=false \
        -e hang_after=45 -e inductor_cache="$SCRATCH/cache-hung"
    report run-hung
    orch explain last > "$RESULTS/explain-run-hung.out" 2>&1
    note "explain: exit $?: $(grep -m 3 -E 'DEADLOCK|cycle|remedy' "$RESULTS/explain-run-hung.out" | tr '\n' ' ' | cut -c1-700)"
    step run-remedied orch run playbooks/dflash-gpu.yaml -e 'extra_args=[--compile-per-thread]' \
        -e steps=300 -e max_seconds=200 -e verify_trials=1 -e inductor_cache="$SCRATCH/cache-remedied"
    report run-remedied
    ;;
*) note "unknown part $PART"; exit 2 ;;
esac
step revert orch patch fx-threads revert -t gpu --json
step runs orch runs list --json
note "done in $SECONDS s"
# Few files come back from some machines: everything but the summary in one tarball
mv "$RESULTS/summary.txt" "$SCRATCH/summary.txt"
cp -r "$SCRATCH/data" "$RESULTS/data"
tar -czf "$SCRATCH/results.tar.gz" -C "$RESULTS" . && rm -rf "${RESULTS:?}"/*
mv "$SCRATCH/results.tar.gz" "$SCRATCH/summary.txt" "$RESULTS/"
