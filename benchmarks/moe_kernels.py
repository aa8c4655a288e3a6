"""Whole MoE layers: opcast's price of a block's routed experts against AIConfigurator's measured rows (issue 17).

    python benchmarks/moe_kernels.py [--data FILE] [--systems H100-SXM,H200,B200] [--models DIR]
        [--cap-rows 2000] [--seed 0] [--no-logo] [--json FILE]

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

Scored: the bf16 and fp8 rows of ``--systems`` (bf16 with the experts' weights in bf16, or W4A16 MXFP4:
``weights`` mxfp4, gpt-oss's checkpoint format) (every release's newest measurement of a configuration:
TensorRT-LLM 1.3.0rc20, and rc23 where it re-measured), two prices of each:

- ``grouped``: what opcast prices a fused layer as where no moe model covers it, the ``moe`` kernel's parts
  through ``--models`` (default: the embedded set; whether or not it has a moe model), i.e. the grouped GEMMs
  (read at 4.25 bits for MXFP4 weights), activation and copies of
  :func:`opcast.archs.routed_expert_ops` for ``ceil(tokens / ep)`` tokens routed by each rank;
- ``learned``: the ``moe`` kind learned (xgb, seed ``--seed``) from at most ``--cap-rows`` rows per (GPU,
  label: dtype, and the weights' storage where weight-only) of every other GPU's replayed rows
  (leave-one-GPU-out; the default refit's cap is ``AIC_MOE_ROWS`` of ``benchmarks/train_default_models.sh``).

Per system, dtype, weights, gating and num_tokens band (:data:`BANDS`): MAPE and the signed median error (median of
prediction / measurement - 1).
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
PARAMS = ("tokens", "hidden", "inter", "experts", "topk", "ep", "gated", "fn", "weights")


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


def learned_logo_s(pool: pd.DataFrame, test: pd.DataFrame, cap_rows: int, seed: int) -> np.ndarray:
    """Each test row's ``moe`` time from a model fitted on the capped rows of every other GPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import modern_gpus  # type: ignore[import-not-found]

    from opcast.hardware import get_device
    from opcast.train.fit import FitConfig, _predict_fitted, fit_frame

    cfg = FitConfig(estimator="xgb", folds=0, ops=("moe",), seed=seed, n_jobs=1)
    devices = {str(d): get_device(str(d)) for d in pd.unique(pool["device"])}
    out = np.full(len(test), np.nan)
    capped = modern_gpus.cap(pool[pool["dtype"].isin(pd.unique(test["dtype"]))], cap_rows, seed)
    for dev, idx in test.groupby("device").indices.items():
        train = capped[capped["device"] != dev].reset_index(drop=True)
        fitted, _, _ = fit_frame(train, devices, cfg)
        out[idx] = _predict_fitted(fitted, test.iloc[idx].reset_index(drop=True), devices[str(dev)])
        print(f"left out {dev}: fitted on {len(train)} rows of {train['device'].nunique()} GPUs", file=sys.stderr)
    return out


def score(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    rows = []
    keys = ["device", "dtype", "weights", "gated"]
    for key, g in df.groupby(keys):
        for lo, hi in BANDS:
            b = g[(g["tokens"] >= lo) & (g["tokens"] <= hi)]
            if b.empty:
                continue
            rec: dict[str, object] = dict(zip(keys, key, strict=True))
            rec["tokens"] = f"{lo}-{hi}" if hi < 1 << 40 else f">{lo - 1}"
            rec["rows"] = len(b)
            for label, col in cols.items():
                ratio = b[col] / b["time_s_median"]
                rec[f"{label} signed %"] = round(100 * float(np.median(ratio - 1)), 1)
                rec[f"{label} MAPE %"] = round(100 * float(np.mean(np.abs(ratio - 1))), 1)
            rows.append(rec)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=None, help="a replay of aiconfigurator-core (default: replay now)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="catalog names of the scored GPUs")
    ap.add_argument("--models", default=None, help="model set of the grouped price (default: the embedded one)")
    ap.add_argument("--cap-rows", type=int, default=2000, help="training rows per (GPU, dtype) of the learned kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-logo", action="store_true", help="score today's grouped price only")
    ap.add_argument("--json", type=Path, default=None, help="write the scored rows here")
    args = ap.parse_args(argv)
    pool = load_rows(args.data)
    test = pool[pool["device"].isin(args.systems.split(",")) & pool["dtype"].isin(DTYPES)].reset_index(drop=True)
    if test.empty:
        raise SystemExit(f"no moe bf16/fp8 rows of {args.systems} in the replay")
    test = test.assign(grouped_s=grouped_s(test, args.models))
    cols = {"grouped": "grouped_s"}
    if not args.no_logo:
        test = test.assign(learned_s=learned_logo_s(pool, test, args.cap_rows, args.seed))
        cols["learned"] = "learned_s"
    table = score(test, cols)
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_columns", 30):
        print(table.to_string(index=False))
    if args.json is not None:
        keep = ["device", "dtype", *PARAMS, "time_s_median", *cols.values()]
        args.json.write_text(json.dumps(test[keep].to_dict(orient="records")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
