# Sourced by the GPU scripts (benchmarks/gpu_validation.sh, scripts/gpu-fx-threads-check.sh):
# the inventory of this machine as orch's local host, with its GPU 0 in container "gpu".
#
#   local_gpu_inventory FILE VENV   # writes FILE; VENV is the container's venv

local_gpu_inventory() {
    cat > "$1" <<YAML
hosts:
  gpu-host: {transport: local}
containers:
  gpu: {host: gpu-host, venv: "$2", gpus: [0]}
default_target: gpu
YAML
}
