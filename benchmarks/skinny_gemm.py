"""Skinny (decode-size) bf16 GEMMs: a model set against AIConfigurator's measured rows (issue 20).

    python benchmarks/skinny_gemm.py --data FILE [--models DIR] [--systems H100-SXM,A100-SXM4-80GB,H200]
        [--max-m 256] [--train-cap 2000] [--seed 0] [--json FILE]

``--data`` is an uncapped replay of ``aiconfigurator-core`` (``python benchmarks/modern_gpus.py
--replay-to DIR``, or ``opcast collect replay aiconfigurator``). Every measured bf16 GEMM row of the
named systems with ``m <= --max-m`` is priced with the learned models (``--models DIR``, else the
embedded default) through :func:`opcast.predict.cost.load_kernel_cost`, with the physical bounds on
(what opcast reports) and off (what the models say), and scored per system and m bin
(:data:`M_BINS`): signed median error (median of prediction / measurement - 1) and MAPE.

Which rows were training rows: the default models' AIConfigurator sample is the
``--cap-rows 2000`` draw of ``benchmarks/modern_gpus.py`` (``cap``: a seeded per-row hash, so it is
recomputed here from the same rows); ``--train-cap`` and ``--seed`` name that draw, and each bin
says how many of its rows it held (``train_rows``) and scores the others apart (``held``).

Further tables: the projections of Llama-70B at TP8 and Llama-3-8B / Llama-2-7B at TP1
(:data:`PROJECTIONS`, (n, k) as ``Linear(k, n)``) that the data hold, by m, with the share of memory
bandwidth measured and predicted; one decoder layer of Llama-70B at TP8 (the sum of its projections
the grid holds: o, gate_up and down; qkv's n = 1280 is not on AIConfigurator's grid), measured vs
predicted by m; and, per system, whether the predicted time is monotone in m where the measured one
is (consecutive m of one (n, k)).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

M_BINS = ((1, 1), (2, 8), (9, 32), (33, 64), (65, 128), (129, 256), (257, 1024), (1025, 1 << 40))
"""m bins of the tables (inclusive): one token, decode batches, then prefill-sized."""
SYSTEMS = ("H100-SXM", "A100-SXM4-80GB", "H200")
PROJECTIONS = {
    "70B-tp8 qkv": (1280, 8192),  # (64 + 2 * 8) heads x 128 / 8 (Llama-2/3-70B config.json)
    "70B-tp8 o": (8192, 1024),
    "70B-tp8 gate_up": (7168, 8192),  # 2 x 28672 / 8
    "70B-tp8 down": (8192, 3584),
    "8B qkv": (6144, 4096),  # (32 + 2 * 8) x 128 (Llama-3-8B config.json)
    "8B o": (4096, 4096),
    "8B gate_up": (28672, 4096),
    "8B down": (4096, 14336),
    "7B qkv": (12288, 4096),  # Llama-2-7B: 32 heads, MHA, intermediate 11008
    "7B gate_up": (22016, 4096),
    "7B down": (4096, 11008),
}
"""(n, k) of the serving benchmark's and the common small models' projections."""


def load_rows(path: Path, systems: tuple[str, ...], max_m: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every bf16 forward GEMM row of ``systems``, those with m <= ``max_m``), with the columns the cap reads."""
    from opcast.errors import OpcastError

    columns = ["op", "dtype", "direction", "device", "m", "n", "k", "time_s_median", "point_id", "source_file"]
    try:
        frame = pd.read_parquet(path, columns=columns)
    except (OSError, ValueError, KeyError) as err:
        raise OpcastError(f"{path}: not a replayed dataset parquet ({str(err).splitlines()[0][:120]})") from None
    frame = frame[(frame["op"] == "gemm") & (frame["dtype"] == "bf16") & (frame["direction"] == "fwd")]
    frame = frame[frame["device"].isin(systems)]
    frame = frame.assign(label="gemm bf16", time_s=frame["time_s_median"].astype(float))
    return frame.reset_index(drop=True), frame[frame["m"] <= max_m].reset_index(drop=True)


def training_mask(all_rows: pd.DataFrame, rows: pd.DataFrame, n: int, seed: int) -> np.ndarray:
    """Which of ``rows`` the capped draw (``modern_gpus.cap``) of ``all_rows`` keeps."""
    kept = _modern_gpus().cap(all_rows, n, seed)
    keys = set(zip(kept["device"], kept["point_id"]))
    return np.array([(d, p) in keys for d, p in zip(rows["device"], rows["point_id"])], dtype=bool)


def _modern_gpus():
    import importlib.util

    spec = importlib.util.spec_from_file_location("modern_gpus_for_skinny", Path(__file__).with_name("modern_gpus.py"))
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def price(rows: pd.DataFrame, models: str | None, bounds: bool) -> tuple[np.ndarray, list[str]]:
    """Predicted seconds of every row and the source that answered, per device."""
    import dataclasses

    from opcast.hardware import get_device
    from opcast.predict.cost import load_kernel_cost, validated_kernel

    cost = dataclasses.replace(load_kernel_cost(models), physical_bounds=bounds)
    pred = np.full(len(rows), np.nan)
    src = [""] * len(rows)
    for dev_name in pd.unique(rows["device"]):
        pos = np.flatnonzero((rows["device"] == dev_name).to_numpy())
        sub = rows.iloc[pos]
        ks = [
            validated_kernel("gemm", {"b": 1, "m": int(m), "n": int(n), "k": int(k)}, "bf16", "fwd")
            for m, n, k in zip(sub["m"], sub["n"], sub["k"])
        ]
        table = cost.lookup(list(dict.fromkeys(ks)), get_device(dev_name))
        for i, kk in zip(pos, ks):
            pred[i], src[i] = table[kk]
    return pred, src


def _score(ratio: np.ndarray) -> dict[str, float]:
    if len(ratio) == 0:
        return {"signed_median_pct": np.nan, "mape_pct": np.nan}
    return {
        "signed_median_pct": round(100 * float(np.median(ratio - 1)), 1),
        "mape_pct": round(100 * float(np.mean(np.abs(ratio - 1))), 1),
    }


def bin_name(lo: int, hi: int) -> str:
    """The printed name of the m bin [lo, hi]."""
    return f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 1 << 39 else f">={lo}")


def m_bin(m: pd.Series) -> pd.Series:
    """The :data:`M_BINS` name of each m."""
    out = pd.Series("", index=m.index, dtype=object)
    for lo, hi in M_BINS:
        out[(m >= lo) & (m <= hi)] = bin_name(lo, hi)
    return out


def bin_table(rows: pd.DataFrame, preds: dict[str, np.ndarray], train: np.ndarray) -> pd.DataFrame:
    """Per system and m bin: rows, training rows, and each prediction's signed median / MAPE (all and held-out)."""
    out = []
    bins = m_bin(rows["m"])
    t = rows["time_s"].to_numpy()
    order = {bin_name(lo, hi): i for i, (lo, hi) in enumerate(M_BINS)}
    for (dev, b), idx in rows.groupby([rows["device"], bins]).groups.items():
        pos = rows.index.get_indexer(idx)
        rec = {"system": dev, "m": b, "_o": order[b], "rows": len(pos), "train_rows": int(train[pos].sum())}
        for name, p in preds.items():
            r = p[pos] / t[pos]
            s_all, s_held = _score(r), _score(r[~train[pos]])
            rec[f"{name} signed %"] = s_all["signed_median_pct"]
            rec[f"{name} MAPE %"] = s_all["mape_pct"]
            rec[f"{name} held signed %"] = s_held["signed_median_pct"]
            rec[f"{name} held MAPE %"] = s_held["mape_pct"]
        out.append(rec)
    return pd.DataFrame(out).sort_values(["system", "_o"]).drop(columns="_o").reset_index(drop=True)


def projection_table(rows: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    """Measured and predicted times and bandwidth share of :data:`PROJECTIONS` by system and m."""
    from opcast.hardware import get_device

    out = []
    for name, (n, k) in PROJECTIONS.items():
        sel = (rows["n"] == n) & (rows["k"] == k)
        for idx in rows[sel].sort_values(["device", "m"]).index:
            r = rows.loc[idx]
            bw = get_device(r["device"]).mem_bw_bytes_per_s
            bytes_ = 2 * (r["m"] * r["k"] + r["k"] * r["n"] + r["m"] * r["n"])
            out.append(
                {
                    "proj": name,
                    "system": r["device"],
                    "m": int(r["m"]),
                    "measured_us": round(1e6 * r["time_s"], 2),
                    "predicted_us": round(1e6 * pred[idx], 2),
                    "err %": round(100 * (pred[idx] / r["time_s"] - 1), 1),
                    "measured bw %": round(100 * bytes_ / bw / r["time_s"], 1),
                    "predicted bw %": round(100 * bytes_ / bw / pred[idx], 1),
                }
            )
    return pd.DataFrame(out)


LAYER_70B_TP8 = ("70B-tp8 o", "70B-tp8 gate_up", "70B-tp8 down")
"""The projections of one Llama-70B TP8 decoder layer on AIConfigurator's (n, k) grid."""


def layer_table(proj: pd.DataFrame, names: tuple[str, ...] = LAYER_70B_TP8) -> pd.DataFrame:
    """Per system and m (where every projection of ``names`` was measured): the summed measured and
    predicted microseconds of those projections and the error."""
    sub = proj[proj["proj"].isin(names)]
    whole = sub.groupby(["system", "m"])["proj"].transform("nunique") == len(names)
    g = sub[whole].groupby(["system", "m"])[["measured_us", "predicted_us"]].sum().round(2).reset_index()
    g["err %"] = (100 * (g["predicted_us"] / g["measured_us"] - 1)).round(1)
    return g


def monotone_table(rows: pd.DataFrame, pred: np.ndarray, slack: float = 0.03) -> pd.DataFrame:
    """Per system: of the consecutive m steps (same n, k) where the measured time does not fall by more
    than ``slack``, how many predicted steps fall by more than ``slack`` (a non-monotone model where the
    data are monotone)."""
    out = []
    frame = rows.assign(pred=pred).sort_values(["device", "n", "k", "m"])
    for dev, sub in frame.groupby("device"):
        same = (sub["n"].to_numpy()[1:] == sub["n"].to_numpy()[:-1]) & (
            sub["k"].to_numpy()[1:] == sub["k"].to_numpy()[:-1]
        )
        t, p = sub["time_s"].to_numpy(), sub["pred"].to_numpy()
        meas_ok = t[1:] >= (1 - slack) * t[:-1]
        pred_drop = p[1:] < (1 - slack) * p[:-1]
        steps = same & meas_ok
        out.append(
            {
                "system": dev,
                "steps": int(steps.sum()),
                "predicted drops": int((steps & pred_drop).sum()),
                "measured drops": int((same & ~meas_ok).sum()),
            }
        )
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="An uncapped replayed aiconfigurator.parquet.")
    ap.add_argument("--models", default=None, help="A model set folder (default: the embedded models/default).")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--max-m", type=int, default=256)
    ap.add_argument("--train-cap", type=int, default=2000, help="The replay cap the model set was fitted with.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from opcast.errors import OpcastError
    from opcast.hardware import get_device

    if not args.data.is_file():
        print(f"skinny_gemm: {args.data} does not exist; give a replayed aiconfigurator.parquet", file=sys.stderr)
        return 2
    if args.max_m < 1 or args.train_cap < 1:
        print("skinny_gemm: --max-m and --train-cap must be >= 1", file=sys.stderr)
        return 2
    try:
        systems = tuple(get_device(s).name for s in args.systems.split(","))
        all_rows, rows = load_rows(args.data, systems, args.max_m)
        if rows.empty:
            raise OpcastError(f"no bf16 GEMM rows of {', '.join(systems)} with m <= {args.max_m} in {args.data}")
        train = training_mask(all_rows, rows, args.train_cap, args.seed)
        preds, sources = {}, {}
        for bounds in (True, False):
            name = "bounds" if bounds else "raw"
            preds[name], src = price(rows, args.models, bounds)
            sources[name] = pd.Series(src).value_counts().to_dict()
    except OpcastError as err:
        print(f"skinny_gemm: {err}", file=sys.stderr)
        return 2
    proj = projection_table(rows, preds["bounds"])
    tables = {
        "by system and m bin": bin_table(rows, preds, train),
        "projections (bounds on)": proj,
        "one Llama-70B TP8 layer: o + gate_up + down (bounds on)": layer_table(proj),
        "monotone in m (bounds on)": monotone_table(rows, preds["bounds"]),
    }
    pd.set_option("display.width", 250, "display.max_rows", 500, "display.max_columns", 40)
    print(f"# skinny bf16 GEMMs: {args.models or 'models/default'} vs {args.data} (m <= {args.max_m})")
    print(f"rows: {len(rows)}, of which in the training draw: {int(train.sum())}; sources: {sources}")
    for title, table in tables.items():
        print(f"\n## {title}\n")
        print(table.to_string(index=False))
    if args.json:
        payload = {k: json.loads(v.to_json(orient="records")) for k, v in tables.items()}
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
