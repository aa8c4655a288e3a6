#!/usr/bin/env bash
# opcast's checks on one CUDA GPU in about 6 minutes: the GPU tests, four validate runs (a real training
# step against the prediction, per phase and op group) and a bounded collect. The results feed
# benchmarks/h200_measured.py (copy val/*.json to benchmarks/data/h200_torch/validate and the collect to
# benchmarks/data/h200_torch/kernels, or point the script at another GPU's copy).
#
#   benchmarks/gpu_check.sh [OUT_DIR] [COLLECT_BUDGET_S]     # OUT_DIR defaults to $OUT or runs/gpu-check
#
# Needs opcast installed with its dependencies (xgboost or xgboost-cpu: without either the embedded models
# are refused and every kernel is priced by the roofline, which validate's notes then say).
set -u
out=${1:-${OUT:-runs}/gpu-check}
budget=${2:-150}
py=${PYTHON:-python3}
mkdir -p "$out/val"
t0=$(date +%s)
log() { echo "== $(( $(date +%s) - t0 ))s $*"; }

log "environment"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
"$py" -c "import torch, opcast; print('torch', torch.__version__, torch.cuda.get_device_name(0))"

log "GPU tests"
timeout 120 "$py" -m pytest -p no:cacheprovider -m gpu -rs tests/integration/test_collect_cuda.py \
  tests/integration/test_validate.py > "$out/gpu_tests.txt" 2>&1
echo "rc=$?" >> "$out/gpu_tests.txt"
tail -3 "$out/gpu_tests.txt"

validate() {  # name timeout_s args...
  local name=$1 limit=$2
  shift 2
  log "validate $name"
  timeout "$limit" "$py" -m opcast validate --device cuda --precision bf16 --json "$@" \
    > "$out/val/$name.json" 2> "$out/val/$name.err" || tail -2 "$out/val/$name.err"
}
validate l3-8b-4L 90 --arch llama3-8b --layers 4 --batch 2 --seq 2048 --profile
validate l3-8b-4L-s8k 90 --arch llama3-8b --layers 4 --batch 1 --seq 8192 --profile
validate l2-7b-4L 90 --arch llama2-7b --layers 4 --batch 4 --seq 4096 --profile
validate gpt2 60 --arch gpt2-124m --batch 8 --seq 1024 --profile

log "collect (${budget} s)"
timeout $(( budget + 60 )) bash "$(dirname "$0")/h200_collect.sh" "$out/collect" "$budget" > "$out/collect.txt" 2>&1
echo "rc=$?" >> "$out/collect.txt"
tail -2 "$out/collect.txt"
log "done: $out"
