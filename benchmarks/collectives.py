"""Held-out error of the learned per-cluster collective laws (opcast.train.collectives) on
published NCCL measurements: arXiv 2509.22832's Perlmutter and Vista files, Vidur's Azure
network profiles and, with ``aiconfigurator-core`` installed (``pip install 'opcast[aiconfigurator]'``),
NVIDIA AIConfigurator's nccl-tests tables of nine single nodes (DGX A100/H100/H200/B200/B300,
GB200/GB300 NVL72 trays, the L40S and RTX PRO 6000 PCIe servers).

    python benchmarks/collectives.py [PUBLISHED] [--out benchmarks/results/collectives.md] [--no-aiconfigurator]

PUBLISHED defaults to ../shared/published (estimate-train-time/ and vidur/ inside). Splits: every
third message size of each topology held out (``sizes``); the topologies — fit on runs of at most
4 nodes and score the larger ones where there are any, else leave each topology out in turn
(``topology``); and each cluster left out of the transfer curves that price a GPU whose cluster was
never measured (``transfer``, beside the spec-sheet ``alpha-beta`` model on the same rows).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pandas as pd

from opcast.collect.replay import ReplayOptions
from opcast.train.collectives import KINDS, collective_rows, held_out_report, summary, transfer_report

ROOT = Path(__file__).resolve().parents[1]


def load(published: Path, aiconfigurator: bool = True) -> pd.DataFrame:
    from opcast.collect.replay import estimate_train_time, vidur

    frames = []
    ett = published / "estimate-train-time"
    if ett.is_dir():
        rows = [r for r in estimate_train_time.replay(ett, ReplayOptions()).rows if r["op"] in KINDS]
        frames.append(pd.DataFrame(rows).assign(source="2509.22832"))
    vid = published / "vidur"
    if vid.is_dir():
        rows = [r for r in vidur.replay(vid, ReplayOptions()).rows if r["op"] in KINDS]
        frames.append(pd.DataFrame(rows).assign(source="vidur"))
    if aiconfigurator and importlib.util.find_spec("aiconfigurator_core") is not None:
        from opcast.collect.replay import aiconfigurator as aic

        rows = aic.replay(None, tables=["nccl_perf", "custom_allreduce_perf"]).rows
        frames.append(pd.DataFrame(rows).assign(source="aiconfigurator"))
    if not frames:
        sys.exit(f"no estimate-train-time/ or vidur/ under {published}, and aiconfigurator-core is not installed")
    return pd.concat(frames, ignore_index=True)


def markdown(frame: pd.DataFrame) -> str:
    """A pipe table (no tabulate dependency)."""
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("published", nargs="?", type=Path, default=ROOT.parent / "shared" / "published")
    parser.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    parser.add_argument(
        "--no-aiconfigurator", action="store_true", help="leave out AIConfigurator's tables even when installed"
    )
    args = parser.parse_args(argv)
    frame = load(args.published, aiconfigurator=not args.no_aiconfigurator)
    rows, skipped = collective_rows(frame)
    records = held_out_report(rows) + transfer_report(rows)
    table = pd.DataFrame(summary(records))
    folds = pd.DataFrame(records)
    per_cluster = (
        folds.groupby(["cluster", "split"])
        .agg(rows=("rows", "sum"), median_ape=("median_ape", "median"), mean_ape=("mean_ape", "mean"))
        .round(2)
        .reset_index()
    )
    command = "python benchmarks/collectives.py" + (f" --out {args.out}" if args.out else "")
    command += " --no-aiconfigurator" if args.no_aiconfigurator else ""
    transfer = folds[folds["split"].isin(["transfer", "alpha-beta"])]
    versus = (
        transfer.pivot_table(index=["cluster", "kind"], columns="split", values="mean_ape").round(1).reset_index()
        if len(transfer)
        else pd.DataFrame()
    )
    topologies = (
        rows.assign(t=rows["nodes"].astype(str) + "x" + rows["gpus_per_node"].astype(str))
        .groupby(["cluster", "op"])["t"]
        .agg(lambda s: " ".join(sorted(set(s), key=lambda x: tuple(map(int, x.split("x"))))))
    )
    lines = [
        "# Learned collective laws: held-out error",
        "",
        f"Reproduce: `{command}` (published data: ../shared/published or the PUBLISHED argument).",
        "",
        "One alpha-beta law per (cluster, kind) with per-tier latency and bandwidth "
        "(opcast/train/collectives.py). Split `sizes`: every third message size of each topology "
        "held out. Split `topology`: fit on <= 4 nodes and score the larger runs where there are "
        "any (Perlmutter 8x1, Vista 8x1), else leave each topology out in turn (folds = topologies). "
        "Between measured sizes a law follows its topology's measured curve. Split `transfer`: each cluster "
        "left out, priced as a GPU no cluster measured is (the spec-sheet alpha-beta time moved by the transfer "
        "curve of its link tier, architecture and node size, learned on the other clusters' nccl-tests rows); "
        "`alpha-beta`: the spec-sheet model alone on the same rows.",
        "",
        f"Sources: {', '.join(sorted(set(frame['source'])))}.",
        "",
        "## Transfer to a cluster never measured: mean abs % error, left-out cluster (transfer vs alpha-beta)",
        "",
        markdown(versus) if len(versus) else "(no cluster with nccl-tests rows)",
        "",
        "## Per cluster (median over folds of the fold's median abs % error)",
        "",
        markdown(per_cluster),
        "",
        "## Per cluster and kind",
        "",
        markdown(table),
        "",
        "## Every fold",
        "",
        markdown(folds),
        "",
        "## Topologies measured (nodes x ranks per node)",
        "",
        markdown(topologies.reset_index().rename(columns={"t": "topologies"})),
        "",
        "Rows left out: " + ("; ".join(f"{v} {k}" for k, v in skipped.items()) or "none"),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
