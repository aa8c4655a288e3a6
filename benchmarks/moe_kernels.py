"""Whole MoE layers: opcast's price of a block's routed experts against AIConfigurator's measured rows (issue 17).

    python benchmarks/moe_kernels.py [--data FILE] [--systems H100-SXM,H200,B200] [--models DIR]
        [--impls trtllm,vllm,marlin] [--dtypes bf16,fp8] [--cap-rows 2000] [--cap-vllm-rows N] [--seed 0] [--no-logo]
        [--json FILE]

AIConfigurator's ``moe/trtllm/<version>/moe_perf.parquet`` rows each time one forward of TensorRT-LLM's
fused MoE module on one rank of ``moe_tp_size x moe_ep_size`` (ai-dynamo/aiconfigurator
``collector/trtllm/collect_moe.py``: ``create_moe(...).forward(hidden_states, router_logits)`` in a CUDA graph,
mean of 6 replays): the top-k routing over the given logits, for fp8 the activation quantisation, the token
permutation, the two grouped GEMMs with the activation between them (SwiGLU, or Relu2 and one up projection
for ``moe_torch_flow_nongated``) and the finalize (un-permute, top-k weighted sum). Not timed: the router GEMM
and any all-reduce or all-to-all. The rank holds ``num_experts / moe_ep_size`` experts of
``inter_size / moe_tp_size`` and sees all ``num_tokens`` tokens. The replay
(:mod:`opcast.collect.replay.aiconfigurator`) turns each balanced row into an ``moe`` kernel (``--data``: a
replay written by ``python benchmarks/modern_gpus.py --replay-to DIR``; default: replayed here, ~1 min).

vLLM's ``moe/vllm/<version>/moe_perf.parquet`` rows time vLLM's own ``FusedMoE`` layer the same way
(collector/vllm/collect_moe.py), with the kernel vLLM dispatches to on that GPU and dtype; they replay as the
``moe`` kind's ``impl`` vllm (one vLLM release per system and dtype, 0.24.0), TensorRT-LLM's as ``impl`` trtllm,
and the rows of vLLM's Marlin W4A16 MoE (a ``marlin`` kernel source: gpt-oss's MXFP4 experts on L40S and RTX PRO
6000, compressed-tensors MXFP4 on H100, H200 and B200) as ``impl`` marlin (score them with ``--impls marlin
--systems L40S,RTX-PRO-6000,H100-SXM,H200,B200``).

Scored: the bf16 and fp8 rows (``--dtypes``; fp8_block adds DeepSeek's block-scaled fp8 and MXFP4 experts over MXFP8
activations) of ``--systems`` and ``--impls`` (bf16 with the experts' weights in bf16, or W4A16
MXFP4: ``weights`` mxfp4, gpt-oss's checkpoint format) (TensorRT-LLM: every release's newest measurement of a
configuration, 1.3.0rc20, and rc23 where it re-measured), two prices of each:

- ``grouped``: what opcast prices a fused layer as where no moe model covers it, the ``moe`` kernel's parts
  through ``--models`` (default: the embedded set; whether or not it has a moe model), i.e. the grouped GEMMs
  (read at 4.25 bits for MXFP4 weights), activation and copies of
  :func:`opcast.archs.routed_expert_ops` for ``ceil(tokens / ep)`` tokens routed by each rank;
- ``learned``: the ``moe`` kind learned (xgb, seed ``--seed``) from at most ``--cap-rows`` rows per (GPU,
  label: dtype, the weights' storage where weight-only, and the kernel family) of every other GPU's replayed rows,
  each family its own predictor group as the refit fits them (``--cap-vllm-rows`` for vLLM's labels; default
  ``--cap-rows``; leave-one-GPU-out; the default refit's caps are ``AIC_MOE_ROWS`` and ``AIC_VLLM_MOE_ROWS`` of
  ``benchmarks/train_default_models.sh``).

- ``as trtllm``, for vLLM's and Marlin's rows: the layer priced as TensorRT-LLM's fused MoE by ``--models`` (what a
  set without the family's group answers, and what opcast priced them as before it knew families).

Each fold fits the scored families' groups only (a family's group sees its own rows alone, so the others' would not
change it).

Per kernel family, system, dtype, weights, gating and num_tokens band (:data:`BANDS`): MAPE and the signed median
error (median of prediction / measurement - 1); then each family, dtype and weights pooled over the systems.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

BANDS = ((1, 16), (17, 256), (257, 4096), (4097, 1 << 40))
"""num_tokens bands (inclusive): decode batches, small and large prefill chunks, whole prompts."""
SYSTEMS = ("H100-SXM", "H200", "B200")
DTYPES = ("bf16", "fp8")
"""The dtypes scored by default (``--dtypes``)."""
MOE_DTYPES = ("bf16", "fp8", "fp8_block", "nvfp4")
"""Every dtype the replay gives a fused MoE layer (fp8_block: DeepSeek's block-scaled fp8, and MXFP4 experts over
MXFP8 activations with weights mxfp4)."""
IMPLS = ("trtllm", "vllm", "marlin")
PARAMS = ("tokens", "hidden", "inter", "experts", "topk", "ep", "gated", "fn", "weights", "impl")


def load_rows(path: Path | None) -> pd.DataFrame:
    """Every replayed ``moe`` row (of ``path``, else of the installed aiconfigurator-core's moe tables)."""
    import opcast
    from opcast.collect.replay import aiconfigurator
    from opcast.collect.replay.common import normalise
    from opcast.schema import write_parquet
    from opcast.train.fit import load_training_frame

    if path is None:
        result = aiconfigurator.replay(None, tables=[aiconfigurator.MOE_TABLE])
        rows, _ = normalise(
            result, source="aiconfigurator", run_id="replay-aiconfigurator-moe", opcast_version=opcast.__version__
        )
        path = write_parquet(rows, Path(tempfile.mkdtemp(prefix="opcast-moe-")) / "aiconfigurator.parquet")
    frame = load_training_frame([path])
    frame = frame[frame["op"] == "moe"].reset_index(drop=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import modern_gpus  # type: ignore[import-not-found]

    return frame.assign(label=modern_gpus.labels(frame))


def grouped_s(rows: pd.DataFrame, models: str | None) -> np.ndarray:
    """opcast's price of each row's ``moe`` kernel as its grouped GEMMs, activation and copies through ``models``
    (the embedded set by default), whether or not the set has a model of the fused kernel."""
    from opcast.hardware import get_device
    from opcast.predict.cost import kernel, load_kernel_cost

    cost = load_kernel_cost(models)
    out = np.full(len(rows), np.nan)
    for dev, idx in rows.groupby("device").indices.items():
        sub = rows.iloc[idx]
        params = sub[list(PARAMS)].to_dict("records")
        kernels = [kernel("moe", p, d) for p, d in zip(params, sub["dtype"])]
        out[idx] = cost.parts_time_s(kernels, get_device(str(dev)))
    return out


def as_trtllm_s(rows: pd.DataFrame, models: str | None) -> np.ndarray:
    """Each row's ``moe`` kernel priced as TensorRT-LLM's fused MoE (``impl`` trtllm) through ``models``."""
    from opcast.hardware import get_device
    from opcast.predict.cost import kernel, load_kernel_cost

    cost = load_kernel_cost(models)
    out = np.full(len(rows), np.nan)
    for dev, idx in rows.groupby("device").indices.items():
        sub = rows.iloc[idx]
        device = get_device(str(dev))
        params = sub[list(PARAMS)].to_dict("records")
        kernels = [kernel("moe", {**p, "impl": "trtllm"}, d) for p, d in zip(params, sub["dtype"])]
        out[idx] = [cost.time_s(k, device)[0] for k in kernels]
    return out


def learned_logo_s(
    pool: pd.DataFrame, test: pd.DataFrame, cap_rows: int, seed: int, vllm_cap_rows: int | None = None
) -> np.ndarray:
    """Each test row's ``moe`` time from a model fitted on the capped rows of every other GPU (vLLM's labels at
    ``vllm_cap_rows`` where given)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import modern_gpus  # type: ignore[import-not-found]

    from opcast.hardware import get_device
    from opcast.train.fit import FitConfig, _predict_fitted, fit_frame

    cfg = FitConfig(estimator="xgb", folds=0, ops=("moe",), seed=seed, n_jobs=1)
    devices = {str(d): get_device(str(d)) for d in pd.unique(pool["device"])}
    out = np.full(len(test), np.nan)
    pool = pool[pool["dtype"].isin(pd.unique(test["dtype"]))]
    vllm = pool["label"].isin(modern_gpus.VLLM_CAPPED)
    capped = pd.concat(
        [
            modern_gpus.cap(pool[~vllm], cap_rows, seed),
            modern_gpus.cap(pool[vllm], cap_rows if vllm_cap_rows is None else vllm_cap_rows, seed),
        ]
    )
    for dev, idx in test.groupby("device").indices.items():
        train = capped[capped["device"] != dev].reset_index(drop=True)
        fitted, _, _ = fit_frame(train, devices, cfg)
        out[idx] = _predict_fitted(fitted, test.iloc[idx].reset_index(drop=True), devices[str(dev)], devices)
        print(f"left out {dev}: fitted on {len(train)} rows of {train['device'].nunique()} GPUs", file=sys.stderr)
    return out


def _errors(rec: dict[str, object], rows: pd.DataFrame, cols: dict[str, str]) -> dict[str, object]:
    """``rec`` with the row count and each price's signed median error and MAPE over ``rows``."""
    rec["rows"] = len(rows)
    for label, col in cols.items():
        ratio = rows[col] / rows["time_s_median"]
        rec[f"{label} signed %"] = round(100 * float(np.median(ratio - 1)), 1)
        rec[f"{label} MAPE %"] = round(100 * float(np.mean(np.abs(ratio - 1))), 1)
    return rec


def score(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    rows = []
    keys = ["impl", "device", "dtype", "weights", "gated"]
    for key, g in df.groupby(keys):
        for lo, hi in BANDS:
            b = g[(g["tokens"] >= lo) & (g["tokens"] <= hi)]
            if b.empty:
                continue
            rec: dict[str, object] = dict(zip(keys, key, strict=True))
            rec["tokens"] = f"{lo}-{hi}" if hi < 1 << 40 else f">{lo - 1}"
            rows.append(_errors(rec, b, cols))
    return pd.DataFrame(rows)


def pooled(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    """MAPE and signed median error of each kernel family, dtype and weights over every scored system."""
    rows = []
    keys = ["impl", "dtype", "weights"]
    for key, g in df.groupby(keys):
        rec: dict[str, object] = dict(zip(keys, key, strict=True))
        rec["systems"] = ",".join(sorted(map(str, pd.unique(g["device"]))))
        rows.append(_errors(rec, g, cols))
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=None, help="a replay of aiconfigurator-core (default: replay now)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="catalog names of the scored GPUs")
    ap.add_argument("--models", default=None, help="model set of the grouped price (default: the embedded one)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="kernel families scored (moe impl)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="the layers' dtypes scored, e.g. fp8_block")
    ap.add_argument("--cap-rows", type=int, default=2000, help="training rows per (GPU, label) of the learned kind")
    ap.add_argument("--cap-vllm-rows", type=int, default=None, help="the cap of vLLM's labels (default: --cap-rows)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-logo", action="store_true", help="score today's grouped price only")
    ap.add_argument("--json", type=Path, default=None, help="write the scored rows here")
    args = ap.parse_args(argv)
    impls, dtypes = args.impls.split(","), args.dtypes.split(",")
    caps = [c for c in (args.cap_rows, args.cap_vllm_rows) if c is not None]  # 0 is refused, not read as no cap
    if min(caps) < 1 or not set(impls) <= set(IMPLS) or not set(dtypes) <= set(MOE_DTYPES):
        print(
            f"moe_kernels: caps must be >= 1, --impls of {','.join(IMPLS)} and --dtypes of {','.join(MOE_DTYPES)}",
            file=sys.stderr,
        )
        return 2
    pool = load_rows(args.data)
    pool = pool.assign(impl=pool["impl"].fillna("trtllm")) if "impl" in pool else pool.assign(impl="trtllm")
    wanted = pool["device"].isin(args.systems.split(",")) & pool["dtype"].isin(dtypes) & pool["impl"].isin(impls)
    test = pool[wanted].reset_index(drop=True)
    if test.empty:
        print(f"moe_kernels: no moe {args.dtypes} rows of {args.systems} ({args.impls}) in the replay", file=sys.stderr)
        return 2
    test = test.assign(grouped_s=grouped_s(test, args.models))
    cols = {"grouped": "grouped_s"}
    if set(impls) - {"trtllm"}:
        test = test.assign(as_trtllm_s=as_trtllm_s(test, args.models))
        cols["as trtllm"] = "as_trtllm_s"
    if not args.no_logo:
        fit_pool = pool[pool["impl"].isin(impls)]
        test = test.assign(learned_s=learned_logo_s(fit_pool, test, args.cap_rows, args.seed, args.cap_vllm_rows))
        cols["learned"] = "learned_s"
    table = score(test, cols)
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_columns", 30):
        print(table.to_string(index=False))
        print()
        print(pooled(test, cols).to_string(index=False))
    if args.json is not None:
        keep = ["device", "dtype", *PARAMS, "time_s_median", *cols.values()]
        args.json.write_text(json.dumps(test[keep].to_dict(orient="records")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
