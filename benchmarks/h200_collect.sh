#!/usr/bin/env bash
# Collect opcast's first-party dataset on one CUDA GPU in about BUDGET_S seconds (default 360):
# every op kind in bf16 and fp16 (with the exact shapes of common archs), fp8 GEMMs where the
# GPU has them, and a slice of fp32 on CUDA cores; then print the dataset summary.
#
#   benchmarks/h200_collect.sh [OUT_DIR] [BUDGET_S]        # OUT_DIR defaults to $OUT/h200 or runs/h200
#   DEVICE=cpu benchmarks/h200_collect.sh /tmp/try 12       # the same script on a CPU, tiny budget
#
# Re-running continues where the last run stopped (points already in OUT_DIR are skipped).
set -euo pipefail
out=${1:-${OUT:-runs}/h200}
budget=${2:-360}
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
opcast() { "$py" -m opcast "$@"; }

archs=(--arch llama3-8b --arch llama2-13b --arch llama3-70b --arch gpt3-2.7b --arch mixtral-8x7b)
# Only a CUDA device can have fp8: elsewhere the answer is 0 without the seconds of importing torch.
has_fp8=0
if [[ "$device" == cuda* ]]; then
  has_fp8=$("$py" - "$device" <<'PY'
import sys, torch
print(int(torch.cuda.is_available() and torch.cuda.get_device_capability(sys.argv[1]) >= (8, 9)))
PY
)
fi
# Shares of the budget: 70 % bf16+fp16, 15 % fp8 GEMM (or fp16/bf16 when absent), 15 % fp32.
half_s=$(( budget * 70 / 100 ))
fp8_s=$(( budget * 15 / 100 ))
fp32_s=$(( budget - half_s - fp8_s ))
if [ "$has_fp8" != 1 ]; then half_s=$(( half_s + fp8_s )); fi

echo "== opcast collect on $device: ${budget}s into $out (fp8: $has_fp8)"
opcast collect bench --device "$device" --dtype bf16 --dtype fp16 "${archs[@]}" --budget-s "$half_s" --out "$out"
if [ "$has_fp8" = 1 ]; then
  opcast collect bench --device "$device" --op gemm --dtype fp8 "${archs[@]}" --budget-s "$fp8_s" --out "$out"
fi
opcast collect bench --device "$device" --dtype fp32 --budget-s "$fp32_s" --out "$out"
opcast collect info "$out"
