#!/usr/bin/env bash
# The fx-threads patch against one torch venv on a GPU machine: status, verify, the GPU probe
# (node meta of a compiled forward+backward, drafter threads compiling flex_attention side by
# side), apply, apply again, verify, the probe again, revert, status. Each step's output goes
# to RESULTS (default ./gpu-fx-threads), with a summary of exit codes at the end.
#
#   bash scripts/gpu-fx-threads-check.sh VENV [RESULTS]
#   e.g. bash scripts/gpu-fx-threads-check.sh /opt/torch/.venv      # torch 2.11.0+cu130
#
# VENV is the venv whose torch is checked (VENV/bin/python imports torch). orch runs with
# $ORCH_PYTHON (default python3; it needs orch importable: pip install -e . or PYTHONPATH).
# It PATCHES that torch (fx-threads) and reverts it at the end; revert's output says whether
# every file is again as the wheel's RECORD lists it. PROBE_DRAFTERS (default 3) and
# PROBE_STEPS (default 3) size the drafter probe, PROBE_SECONDS (default 200) bounds it (PROBE_DEVICE, default cuda, its device); TRIALS (default 5) the reproducers.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${1:?usage: $0 VENV [RESULTS]}
RESULTS=${2:-gpu-fx-threads}
ORCH_PYTHON=${ORCH_PYTHON:-python3}
TRIALS=${TRIALS:-5}
mkdir -p "$RESULTS"
export ORCH_DATA_DIR=${ORCH_DATA_DIR:-/tmp/orch-gpu-fx-threads-data}
INVENTORY="$RESULTS/inventory.yaml"
. scripts/local-gpu-inventory.sh
local_gpu_inventory "$INVENTORY" "$VENV"
orch() { "$ORCH_PYTHON" -m orchestrator -i "$INVENTORY" "$@"; }
probe() { "$VENV/bin/python" scripts/gpu_fx_threads_probe.py --device "${PROBE_DEVICE:-cuda}" --drafters "${PROBE_DRAFTERS:-3}" \
              --steps "${PROBE_STEPS:-3}" \
              --seconds "${PROBE_SECONDS:-200}"; }
: > "$RESULTS/summary.txt"
step() {  # step NAME EXPECTED CMD...: runs, keeps output, notes the exit code against EXPECTED
    local name=$1 expected=$2; shift 2
    echo "=== $name: $*" | tee -a "$RESULTS/steps.log"
    local started=$SECONDS
    "$@" > "$RESULTS/$name.out" 2>&1
    local code=$?
    tail -n 25 "$RESULTS/$name.out"
    local verdict=ok
    [ "$expected" = any ] || [ "$code" = "$expected" ] || verdict="UNEXPECTED (wanted $expected)"
    echo "=== $name: exit $code in $((SECONDS - started)) s: $verdict" | tee -a "$RESULTS/steps.log"
    printf '%-18s exit %-3s %s\n' "$name" "$code" "$verdict" >> "$RESULTS/summary.txt"
}

step versions 0 sh -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \"$VENV/bin/python\" -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'"
step status-before 1 orch patch fx-threads status            # a state is VULNERABLE: exit 1
step verify-before 1 orch verify fx-threads --trials "$TRIALS"   # node-meta: KeyError n/n
step probe-before 0 probe
step apply 0 orch patch fx-threads apply
step apply-again 0 orch patch fx-threads apply --json        # "changed": false
step status-after 0 orch patch fx-threads status
step verify-after 0 orch verify fx-threads --trials "$TRIALS"    # every state 0/n, controls n/n
step probe-after 0 probe
step revert 0 orch patch fx-threads revert
step status-final 1 orch patch fx-threads status --json
echo "--- graph meta before / after (must be equal) and drafter errors"
for when in before after; do
    "$ORCH_PYTHON" -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(sys.argv[2], r.get("node_meta_module"), json.dumps(r.get("graph_meta") or r.get("graph_meta_error")),
      "drafter errors:", len(r["drafters"]["errors"]), "hung:", r["drafters"]["hung"])' \
        "$RESULTS/probe-$when.out" "$when" 2>&1 | tee -a "$RESULTS/summary.txt"
done
cat "$RESULTS/summary.txt"
echo "results in $RESULTS"
