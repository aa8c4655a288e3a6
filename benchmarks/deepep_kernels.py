"""opcast's price of DeepEP's expert all-to-alls against the latencies DeepEP publishes (``--moe-dispatcher flex``).

    python benchmarks/deepep_kernels.py [--out benchmarks/results/deepep_kernels.md]

Measured: DeepEP V1's low-latency kernels on H800 GPUs, each with a ConnectX-7 400 Gb/s InfiniBand NIC, in
DeepSeek-V3's decode setting (128 tokens a rank, hidden 7,168, top-8 experts, FP8 dispatch, BF16 combine), EP 8
to 256 (deepseek-ai/DeepEP ``docs/legacy.md`` at 0297fc8, "Low-latency kernels with pure RDMA"; the table below
copies its twelve latencies). Nothing is fitted to them.

Priced: one call of each on the catalog's H800 in nodes of 8 (NVLink 200 GB/s a direction, one 50 GB/s NIC a GPU):
- ``flex``: :data:`opcast.collectives_law.EP_DISPATCH`, what ``--moe-dispatcher flex`` prices (every peer written at
  once: NCCL's Simple launch latency and one hop, then the larger of the NVLink and the NIC share, at opcast's link
  efficiencies); the low-latency kernels send one copy of a token per expert, so the message is not deduplicated;
- ``alltoall``: NCCL's pairwise all-to-all on the same bytes (one latency per peer), what ``alltoall`` prices.

The message of a rank: ``128 x 8`` token copies of 7,168 FP8 values and their 56 fp32 scales (one per 128
channels, DeepEP's per-token FP8 cast) in dispatch, of 7,168 BF16 values in combine.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

TOKENS, HIDDEN, TOP_K = 128, 7168, 8
FP8_SCALE_BLOCK = 128
PUBLISHED_US = {  # EP: (dispatch, combine) microseconds, DeepEP docs/legacy.md (0297fc8)
    8: (77, 114),
    16: (118, 195),
    32: (155, 273),
    64: (173, 314),
    128: (192, 369),
    256: (194, 360),
}
SOURCE = "https://github.com/deepseek-ai/DeepEP/blob/0297fc801788b14b338a46554faca28d419e518a/docs/legacy.md"
GPU, GPUS_PER_NODE = "H800", 8


def rows() -> list[dict]:
    from opcast.collectives_law import EP_DISPATCH
    from opcast.hardware import get_device
    from opcast.predict.comm import Collective, CollectiveCostModel, Group

    device, cost = get_device(GPU), CollectiveCostModel()
    sizes = {
        "dispatch": TOKENS * TOP_K * (HIDDEN + HIDDEN // FP8_SCALE_BLOCK * 4),
        "combine": TOKENS * TOP_K * HIDDEN * 2,
    }
    out = []
    for ep, published in PUBLISHED_US.items():
        per = min(ep, GPUS_PER_NODE)
        group = Group(ep, ep // per, per)
        for (op, size), measured_us in zip(sizes.items(), published):
            flex = cost.time_s(Collective(EP_DISPATCH, size, group), device)[0] * 1e6
            nccl = cost.time_s(Collective("all_to_all", size, group), device)[0] * 1e6
            out.append(
                {"ep": ep, "op": op, "bytes": size, "measured_us": measured_us, "flex_us": flex, "nccl_us": nccl}
            )
    return out


def table(data: list[dict]) -> list[str]:
    lines = [
        "| EP | nodes | op | MB a rank | DeepEP measured | opcast flex | error | NCCL pairwise (alltoall) | error |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data:
        lines.append(
            f"| {r['ep']} | {max(1, r['ep'] // GPUS_PER_NODE)} | {r['op']} | {r['bytes'] / 1e6:.2f} | "
            f"{r['measured_us']} us | {r['flex_us']:.0f} us | {r['flex_us'] / r['measured_us'] - 1:+.0%} | "
            f"{r['nccl_us']:.0f} us | {r['nccl_us'] / r['measured_us'] - 1:+.0%} |"
        )
    return lines


def mape(data: list[dict], key: str) -> float:
    return 100 * statistics.mean(abs(r[key] / r["measured_us"] - 1) for r in data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="Also write the table as markdown here.")
    args = ap.parse_args()
    data = rows()
    summary = (
        f"MAPE over {len(data)} calls: opcast flex {mape(data, 'flex_us'):.1f} %, "
        f"NCCL pairwise {mape(data, 'nccl_us'):.1f} %"
    )
    lines = [
        "# DeepEP's low-latency kernels: published latency vs opcast",
        "",
        "`python benchmarks/deepep_kernels.py --out benchmarks/results/deepep_kernels.md`. Measured: "
        f"[DeepEP]({SOURCE}) on {GPU} + CX7 400 Gb/s, {TOKENS} tokens a rank, hidden {HIDDEN}, top-{TOP_K}, "
        "FP8 dispatch, BF16 combine. Priced on the catalog's H800 in nodes of 8, nothing fitted (see the "
        "script's docstring).",
        "",
        summary,
        "",
        *table(data),
        "",
    ]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
