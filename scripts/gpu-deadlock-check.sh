#!/usr/bin/env bash
# Issue 39 on one GPU, in about 150 s: the compile deadlock of threads on one GPU, its stacks
# as orch takes them, its remedy, and what the remedy costs in steady-state throughput.
#
#   bash scripts/gpu-deadlock-check.sh [VENV] [RESULTS]
#   e.g. bash scripts/gpu-deadlock-check.sh /opt/torch/.venv "$OUT"      # torch 2.11.0+cu130
#
# 1. probe-unchanged: scripts/gpu_fx_threads_probe.py, 3 threads on cuda:0, cold inductor
#    cache; at STACKS_AT s (default 40) its stacks are taken the way `orch stacks --pid`
#    takes them (scripts/stacks_of_pid.py: pystack --locals, the explain_frames payload,
#    the wait graph): expect "DEADLOCK: ..." (stacks.txt, stacks.json); then it is killed.
# 2. probe-remedied: the same with --backward-in-thread: expect all three done (~13 s).
# 3. steady-remedied / steady-serialized: the stand-in trainer, 3 drafters on cuda:0, with
#    --backward-in-thread, then (warm cache) without it but with --serialize-compile (the
#    way it ran before): each drafter's done tok_s and the total, excluding the compile.
#
# Needs only VENV's python with torch (no orch install, no click/yaml/paramiko/jinja2/
# packaging: orch runs from this source tree with PYTHONPATH) and pystack: VENV's own, else
# a pystack 1.7.2 wheel for VENV's python in .whl/ here (or PYSTACK_WHEEL=PATH), e.g. made
# on a machine with an index by
#   pip download --only-binary=:all: --no-deps --implementation cp --python-version 3.12 \
#       --abi abi3 --platform manylinux2014_x86_64 -d .whl pystack==1.7.2
# It reads the probe with ptrace: run as root. Writes everything under RESULTS (default
# ./gpu-deadlock), summary.txt last.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/opt/torch/.venv}
RESULTS=${2:-gpu-deadlock}
PY="$VENV/bin/python"
STACKS_AT=${STACKS_AT:-40}
DEVICE=${DEVICE:-cuda}     # cpu: only to try the plumbing (no device thread there: no cycle)
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WHEEL=${PYSTACK_WHEEL:-$(ls .whl/pystack-1.7.2-*.whl 2>/dev/null | head -n 1)}
SCRATCH=$(mktemp -d /tmp/orch-gpu-deadlock-XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
STARTED=$SECONDS
: > "$RESULTS/summary.txt"
note() { echo "$*" | tee -a "$RESULTS/summary.txt"; }

"$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")' > "$RESULTS/versions.out" 2>&1
note "versions: $(tr '\n' ' ' < "$RESULTS/versions.out")"
note "pystack: $("$PY" -c 'import pystack' 2>/dev/null && echo "$VENV's own" || echo "${WHEEL:-NONE (stacks will fail)}")"

# 1. unchanged: 3 threads, cold cache; stacks at STACKS_AT s, then killed
TORCHINDUCTOR_CACHE_DIR="$SCRATCH/cache-unchanged" "$PY" scripts/gpu_fx_threads_probe.py --device "$DEVICE" \
    --drafters 3 --steps 3 --no-graph-meta --seconds $((STACKS_AT + 30)) \
    > "$RESULTS/probe-unchanged.out" 2>&1 &
PROBE=$!
sleep "$STACKS_AT"
if kill -0 "$PROBE" 2>/dev/null; then
    timeout 45 "$PY" scripts/stacks_of_pid.py "$PROBE" --venv "$VENV" ${WHEEL:+--pystack-wheel "$WHEEL"} \
        --json "$RESULTS/stacks.json" > "$RESULTS/stacks.txt" 2>&1
    note "stacks at ${STACKS_AT} s: exit $? (1: a deadlock or a lock wait); first line: $(head -n 1 "$RESULTS/stacks.txt")"
    kill -9 "$PROBE" 2>/dev/null
    note "probe-unchanged: still running at ${STACKS_AT} s (hung), killed"
else
    note "probe-unchanged: ended before ${STACKS_AT} s: $(tail -n 1 "$RESULTS/probe-unchanged.out" | cut -c1-400)"
fi
wait "$PROBE" 2>/dev/null

# 2. remedied: each thread's backward on the thread itself
TORCHINDUCTOR_CACHE_DIR="$SCRATCH/cache-remedied" timeout 45 "$PY" scripts/gpu_fx_threads_probe.py --device "$DEVICE" \
    --drafters 3 --steps 3 --no-graph-meta --seconds 35 --backward-in-thread > "$RESULTS/probe-remedied.out" 2>&1
note "probe-remedied: exit $?: $("$PY" -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["drafters"]
print("hung", r["hung"], "errors", len(r["errors"]), "seconds", r["seconds"], "wall", r.get("wall_seconds"))' \
    "$RESULTS/probe-remedied.out" 2>&1 | tail -n 1)"

# 3. steady state on one GPU, with the remedy (cold cache) and without it, serialized (the
#    same cache, warm): each bounded by the trainer's watchdog (--max-seconds), whose summary
#    still gives the drafters' rates past their first step
steady() {  # steady NAME SECONDS FLAG
    if [ "$2" -lt 12 ]; then note "$1: skipped (the 150 s are spent)"; return; fi
    TORCHINDUCTOR_CACHE_DIR="$SCRATCH/cache-steady" timeout $(($2 + 10)) "$PY" playbooks/files/train_drafters.py \
        --devices "$DEVICE:0,$DEVICE:0,$DEVICE:0" --batch 8 --seq 2048 --d-model 512 --layers 4 --heads 8 \
        --steps 120 --log-every 40 --max-seconds "$2" "$3" > "$RESULTS/$1.out" 2>&1
    note "$1 ($3, ${2} s at most): exit $?: $(grep -E '^drafter=[0-9] (compiled|done)|^summary' "$RESULTS/$1.out" | tr '\n' ' ')"
}
left=$((145 - (SECONDS - STARTED)))
first=$(( left - 20 < 40 ? left - 20 : 40 ))
steady steady-remedied "$first" --backward-in-thread
steady steady-serialized $((145 - (SECONDS - STARTED) - 2)) --serialize-compile

note "total: $((SECONDS - STARTED)) s; results in $RESULTS"
