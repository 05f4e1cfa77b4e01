#!/usr/bin/env bash
# Repeats the GPU validation of docs/benchmarks/gpu-validation.md on a machine with an NVIDIA GPU whose
# python already holds a CUDA torch: orch's local transport, that machine as host and
# "container". Each step's output, JSON and the run records go to RESULTS (default
# ./gpu-validation), with each run's Markdown and HTML report (the monitor's GPU series, the
# baseline and why), plus a tarball of orch's data dir.
#
#   bash benchmarks/gpu_validation.sh [RESULTS]
#
# Needs orch importable (pip install -e . or PYTHONPATH) and python3 with torch+CUDA.
# It PATCHES that torch (fx-tls) and reverts it at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:-gpu-validation}
mkdir -p "$RESULTS"
export ORCH_DATA_DIR=${ORCH_DATA_DIR:-/tmp/orch-gpu-data}
PYTHON=${PYTHON:-python3}
VENV=$($PYTHON -c 'import sys; print(sys.prefix)')
INVENTORY="$RESULTS/inventory.yaml"
. scripts/local-gpu-inventory.sh
local_gpu_inventory "$INVENTORY" "$VENV"
orch() { $PYTHON -m orchestrator -i "$INVENTORY" "$@"; }
report() {  # report NAME: the last run's Markdown and HTML reports (GPU series, baseline and why)
    orch report last --md "$RESULTS/report-$1.md" --html "$RESULTS/report-$1.html" >/dev/null 2>&1
}
step() {  # step NAME CMD...: runs, keeps output and exit code
    local name=$1; shift
    echo "=== $name: $*" | tee -a "$RESULTS/steps.log"
    local started=$SECONDS
    "$@" > "$RESULTS/$name.out" 2>&1
    local code=$?
    tail -n 25 "$RESULTS/$name.out"
    echo "=== $name: exit $code in $((SECONDS - started)) s" | tee -a "$RESULTS/steps.log"
}

step versions sh -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; $PYTHON -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'"
step grep orch grep-torch --def is_fx_symbolic_tracing --show
step status-before orch patch fx-tls status --json
# Drafters compiling side by side (extra_args=[]) is the user's layout; the playbook's
# default serialises each drafter's first compiled step (--serialize-compile).
step run-unpatched orch run playbooks/dflash-gpu.yaml -e patch=false -e 'extra_args=[]' -e steps=300
report run-unpatched
step run-unpatched-serialized orch run playbooks/dflash-gpu.yaml -e patch=false
report run-unpatched-serialized
step apply orch patch fx-tls apply --json
step verify orch verify fx-race --trials 5 --json
step run-patched orch run playbooks/dflash-gpu.yaml -e 'extra_args=[]' -e steps=300
report run-patched
step run-patched-serialized orch run playbooks/dflash-gpu.yaml
report run-patched-serialized
step run-uncompiled orch run playbooks/dflash-gpu.yaml -e 'extra_args=[--uncompiled]' -e steps=100
report run-uncompiled
# A hang in the first compile on a patched torch (compile threads deadlocking on a shared GPU,
# seen 1 run in 3 with two drafters on one H200): HANG_TRIES runs of two drafters side by side.
for try in $(seq 1 "${HANG_TRIES:-3}"); do
    step "run-patched-2drafters-$try" orch run playbooks/dflash-gpu.yaml -e drafters=2 -e 'extra_args=[]' -e steps=300
    report "run-patched-2drafters-$try"
done
step runs orch runs list --json
step revert orch patch fx-tls revert --json
tar -czf "$RESULTS/orch-data.tar.gz" -C "$(dirname "$ORCH_DATA_DIR")" "$(basename "$ORCH_DATA_DIR")"
echo "results in $RESULTS"
