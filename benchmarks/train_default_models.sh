#!/usr/bin/env bash
# Re-fit the embedded default model set (models/default) from scratch, reproducibly (seed 0):
# every dataset `opcast collect replay` makes from ../shared/published (NeuSight, Vidur, 2509.22832),
# NVIDIA AIConfigurator's measured tables when aiconfigurator-core is installed
# (pip install 'opcast[aiconfigurator]'), Liger-Kernel's benchmark data (one-pass Triton norms
# against Hugging Face and torch native kernels, A100/H100) when OPCAST_LIGER or the second argument
# names a Liger-Kernel checkout or its benchmark/data/all_benchmark_data.csv, plus our own collected
# datasets in data/datasets, an H200's forward fp32 kernels timed by NeuSight's protocol
# (benchmarks/data/h200_torch/kernels/neusight_fp32: the fp32 groups' one Hopper GPU), and AMD aiter's tuned GEMM tables (measured bf16/fp8 GEMMs on MI355X) when
# OPCAST_AITER or the third argument names a ROCm/aiter checkout.
# Run from anywhere:  bash benchmarks/train_default_models.sh [PUBLISHED [LIGER [AITER]]]
#
# AIConfigurator holds ~1.1M converted rows (gemm bf16/fp8, prefill/decode attention, NCCL on nine
# GPUs) and ~1.2M block-scaled fp8 / nvfp4 GEMM rows (before de-duplication across frameworks); fitting all of them would take far more than the 10-minute budget on 2 cores, so the
# replay keeps at most AIC_ROWS (5,000) rows per (system, label) -- label = gemm bf16, gemm fp8, gemm fp8_block,
# gemm nvfp4, prefill bf16/fp8, decode bf16, or the collective -- by a uniform draw seeded 0 (benchmarks/modern_gpus.py
# --replay-to ... --cap-rows, the rule its leave-one-GPU-out table is scored with). TensorRT-LLM's fused MoE
# layers (labels moe bf16, moe bf16 mxfp4, moe fp8, moe fp8_block, moe nvfp4) keep at most AIC_MOE_ROWS each:
# at 700 instead of 2,000 their leave-one-GPU-out MAPE on H100/H200/B200 is 15.8 instead of 14.4 % (bf16/fp8) and
# 15.5 instead of 15.4 % (W4A16 MXFP4) (benchmarks/moe_kernels.py --cap-rows 700 / 2000), and the refit stays
# within its 10 minutes. vLLM's fused MoE rows are two kernel families (opcast.ops.MOE_IMPLS): its Marlin W4A16 MoE
# (impl marlin, group moe-fwd-half_marlin, label moe bf16 mxfp4 marlin: 2,268 balanced rows on L40S, RTX PRO 6000,
# H100, H200 and B200), which vLLM runs for MXFP4 experts where it has no faster kernel
# (opcast.predict.serve.engine.moe_impl), and the rest of its FusedMoE dispatch (impl vllm, groups
# moe-fwd-{half,fp8,fp8b,fp4}_vllm, one release per system and dtype, 0.24.0, on eight GPUs). AIC_MOE_IMPLS names
# the families fitted (default trtllm,vllm,marlin; modern_gpus.py --moe-impls), each vLLM label capped at
# AIC_VLLM_MOE_ROWS (default 700). The vllm family was left out of the default until the thirty-seventh session, when
# its four groups were estimated at 303 s of CPU (fourteenth session); with the 20,000-row fold bound the whole script
# took 8 min 27 s with them (fit 7 min 42 s, 2026-12-05, the 2-core machine alone), against 9 min 5 s without them in
# the same session beside small tests. A set without a family prices vLLM's layers as TensorRT-LLM's
# (opcast.predict.cost.learned), which on B200 is 2-4x vLLM's MXFP4 kernel. Leave-one-GPU-out on H100/H200/B200,
# vLLM's bf16 / MXFP4 / fp8 rows score 9.4 / 14.8 / 17.3 % at 700 (benchmarks/results/moe_kernels.md, "vLLM's fused
# MoE as impl vllm"); TensorRT-LLM's groups do not see them.
# The whole script took 9 min 46 s alone on the 2-core machine (2026-12-03, thirteenth session: replays 1 min 28 s,
# the fit 8 min 18 s); a rerun wrote every predictor file byte for byte the same (meta.json and collectives.json
# differ only in fit times, the timestamp and the hashes over them). Little margin: the same fit took 8 min 56 s in
# the run before, because groups of at most 100,000 rows x devices left every device out in turn with three candidate
# estimators each, and a tile-MLP fold costs ~10 s whatever its rows: the fused-MoE, fp4 GEMM, fp32 layernorm and
# softmax groups (5-8 GPUs) spent 43 % of the fit's fold CPU. Since the fourteenth session the bound is 20,000
# (FitConfig.all_devices_fold_rows): six of those groups draw four devices, the fit's CPU in its tasks fell from
# 1,194 to 1,022 s (-14 %; both measured beside other fits, load ~5), and side by side on the same machine (load 1.3-2.2,
# another helper's fits) the script took 9 min 20 s (fit 7 min 52 s) where the old bound took 11 min 26 s
# (fit 9 min 41 s). The other 25 groups wrote the same predictor files. Alone on the machine (2026-12-03, fourteenth
# session, load 0.7 at the start) the whole script took 9 min 03 s, the fit 7 min 42 s; three groups' choices moved
# with their folds (gemm-fwd-fp4 xgb -> tile-mlp, moe-fwd-fp8 and moe-fwd-fp8b xgb -> hier), and the goldens changed
# only in the model-set stamp. Still short of 7 minutes: the tile-MLP's folds remain 64 % of the fit's CPU.
# Fifteenth session (2026-12-03): Marlin's MoE family (one more group, ~19 s of fit CPU) and the vLLM moe tables read
# took the script to 10 min 12-14 s in two runs that shared the machine with other work; with AIConfigurator's replay
# split in two processes (--replay-part, 61 s instead of 97 s alone) the script took 8 min 41 s alone (replays
# 1 min 26 s, the fit 7 min 14 s; load 0.7 at the start), and every predictor file came out byte for byte as the run
# before (meta.json and collectives.json: fit times, timestamp, the dataset list).
# Seventeenth session (2026-12-03): AIC_ROWS 2,000 -> 5,000. The set as shipped is what a user of a catalog GPU gets on
# a shape it never saw, and at 2,000 rows per (system, label) of the ~36,000 AIConfigurator measures it was well behind
# the within-GPU table (fitted on 24,000). On the shapes none of the refits below saw (`python benchmarks/modern_gpus.py
# --data DIR/aiconfigurator.parquet --sections shipped --fit-rows 8000 --models SET`), gemm bf16 / gemm fp8 / prefill
# fp8 / decode bf16 score 6.8 / 4.7 / 4.0 / 8.6 % at 2,000 rows, 6.1 / 3.9 / 3.1 / 7.2 % at 5,000, 5.9 / 3.9 / 2.9 / 6.6 %
# at 6,000 and 5.7 / 3.7 / 2.8 / 7.0 % at 8,000. 6,000 took 10 min 11-12 s in two runs alone (fit 8 min 42-52 s, every
# predictor file byte for byte the same), 8,000 10 min 24 s: over the 10 minutes. 5,000 took 9 min 00 s alone (fit
# 7 min 45 s). Only the AIConfigurator groups' files changed; with the larger sample auto now picks xgb for
# gemm-fwd-fp8 and gemm-fwd-fp4 (tile-mlp before, for unseen GPUs) and the tile-MLP for attention-fwd-half's unseen
# GPUs (hier before).
# Twenty-fifth session (2026-12-04): the H200's 1,706 NeuSight-protocol fp32 rows joined the four fp32 groups (GEMM
# 124,963 -> 125,994 rows; GEMM's and layernorm's unseen-GPU choices hier / tile-mlp -> xgb); 8 min 14-23 s alone in
# two runs (Liger-Kernel ead96b6, aiter e404860). Eight other groups' files differ from the set before at float
# rounding only (the same rows, choices and held-out scores) and were byte for byte the same in both runs; the
# goldens changed only in the model-set stamp.
# Twenty-seventh session (2026-12-04): auto's candidates include the blend of xgb and the tile-MLP (for GPUs a group
# never measured, scored from its parts' folds), chosen for five groups; the refit took 7 min 39 s, small unit tests beside it (fits 6 min
# 32 s, the tile-MLP's final fits of the three groups that had xgb or hier before among them), 27 MB.
# Thirty-fourth session (2026-12-05): vLLM's own fp8 GEMM (opcast.ops.GEMM_IMPLS impl vllm, group gemm-fwd-fp8_vllm,
# label "gemm fp8 vllm" capped at AIC_ROWS like the others: 40,000 rows of 8 GPUs, 49 s of fit) joined the set; the
# refit took 6 min 54 s alone, and every other predictor file came out byte for byte as before (a GEMM's family at its
# default does not enter its id, opcast.ops.Param.id_neutral, so no draw moved).
# Thirty-seventh session (2026-12-05): vLLM's fused-MoE family (groups moe-fwd-{half,fp8,fp8b,fp4}_vllm) joined the
# default, and AIConfigurator's W4A8 MXFP4 rows (MXFP4 experts over MXFP8 activations) the fp8_block groups
# (moe-fwd-fp8b 4,900 -> 14,701 rows); 8 min 27 s alone (fit 7 min 42 s), where the same script without them took
# 9 min 5 s beside small tests. A rerun of the code before on this machine wrote every xgb file byte for byte as
# shipped and the tile-MLP files within 3e-6 of their weights (torch's float rounding here); with the new rows the
# TensorRT-LLM moe-fwd-half / moe-fwd-fp8 groups keep their row counts and feature ranges yet fit other trees (likely
# the rows' order, which xgb's seeded subsample follows; not traced): unseen-GPU MAPE 20.0 -> 20.7 / 18.9 -> 20.1 %,
# moe-fwd-fp8's unseen-GPU choice hier -> the blend.
# models/default was
# fitted with the Liger-Kernel data and an aiter checkout (OPCAST_LIGER and OPCAST_AITER set).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
published="${1:-$repo/../shared/published}"
aic_rows="${AIC_ROWS:-5000}"
aic_moe_rows="${AIC_MOE_ROWS:-700}"
aic_vllm_moe_rows="${AIC_VLLM_MOE_ROWS:-700}"
aic_moe_impls="${AIC_MOE_IMPLS:-trtllm,vllm,marlin}"
liger="${2:-${OPCAST_LIGER:-}}"
aiter="${3:-${OPCAST_AITER:-}}"
work="$(mktemp -d)"
aic_pids=()
trap 'for pid in ${aic_pids[@]+"${aic_pids[@]}"}; do kill "$pid" 2> /dev/null || true; done; rm -rf "$work"' EXIT
# AIConfigurator's replay (~100 s in one process) runs as two processes beside the others, its GEMM tables and the
# rest (~60 s each; modern_gpus.py --replay-part: together exactly the rows of one replay, in the same order)
if python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("aiconfigurator_core") is None)'; then
  for part in gemm rest; do
    python "$repo/benchmarks/modern_gpus.py" --replay-to "$work/published" --cap-rows "$aic_rows" \
      --cap-moe-rows "$aic_moe_rows" --cap-vllm-moe-rows "$aic_vllm_moe_rows" --moe-impls "$aic_moe_impls" \
      --replay-part "$part" &
    aic_pids+=("$!")
  done
else
  echo "aiconfigurator-core not installed: fitting without NVIDIA's AIConfigurator tables (pip install 'opcast[aiconfigurator]')" >&2
fi
for source in neusight vidur estimate-train-time; do
  opcast collect replay "$source" "$published/$source" --out "$work/published" --json > /dev/null
done
if [ -n "$liger" ]; then
  opcast collect replay liger "$liger" --out "$work/published" --json > /dev/null
else
  echo "OPCAST_LIGER not set: fitting without Liger-Kernel's benchmark data (fused norms on A100/H100)" >&2
fi
if [ -n "$aiter" ]; then
  opcast collect replay aiter "$aiter" --out "$work/published" --json > /dev/null
else
  echo "OPCAST_AITER not set: fitting without AMD aiter's tuned GEMM tables (bf16/fp8 GEMMs on MI355X)" >&2
fi
for pid in ${aic_pids[@]+"${aic_pids[@]}"}; do
  wait "$pid"  # its exit status: a failed replay stops the script (set -e)
done
cd "$repo"  # so that meta.json records repo-relative paths
ours=()
[ -d data/datasets ] && ours=(data/datasets)  # our own collected datasets, where this checkout has them
# First-party fp32 kernels of a Hopper GPU, timed by NeuSight's protocol so they join its rows in the fp32 groups
# (collect bench --timing neusight on an H200, forward rows; benchmarks/hopper_fp32.py says what they change)
ours+=(benchmarks/data/h200_torch/kernels/neusight_fp32)
time opcast train fit "$work/published" ${ours[@]+"${ours[@]}"} --out models --name default --seed 0 --jobs 2
