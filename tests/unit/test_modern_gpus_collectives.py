"""benchmarks/modern_gpus.py scores collectives as ``opcast predict`` prices them (issue 17): a
system's own cluster law within-GPU; left out, a same-links cluster's law, else the transfer curve,
else alpha-beta (:func:`collective_predictions`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcast.collectives_law import alpha_beta_time_s
from opcast.train.collectives import cluster_links

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
mg = load_script(REPO / "benchmarks" / "modern_gpus.py", "modern_gpus_benchmark_collectives")

DEVICES = {"dgx-h100": "H100-SXM", "dgx-h200": "H200", "dgx-b200": "B200", "dgx-b300": "B300", "gb200-nvl72": "GB200"}
FACTOR = {"hopper": (0.9, 1.3, 0.8), "blackwell": (1.1, 1.6, 1.3)}


def _rows(cluster: str) -> pd.DataFrame:
    """nccl-tests rows of one catalog cluster: its alpha-beta time x its architecture's size curve."""
    links = cluster_links(cluster)
    assert links is not None
    intra, inter, arch, _ = links
    rows = []
    for kind in ("all_reduce", "all_gather"):
        for n in (2, 4):
            for e in range(10, 31):
                factor = np.exp(np.interp(e, [12, 20, 28], np.log(FACTOR[arch])))
                rows.append(
                    {
                        "op": kind,
                        "label": kind,
                        "device": DEVICES[cluster],
                        "bytes": 2**e,
                        "world_size": n,
                        "nodes": 1,
                        "gpus_per_node": n,
                        "time_s_median": alpha_beta_time_s(kind, 2**e, n, 1, n, intra, inter)[0] * factor,
                        "cluster": cluster,
                        "timing_method": "replay:aiconfigurator:nccl-tests-avg",
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return pd.concat([_rows(c) for c in DEVICES], ignore_index=True)


def test_within_gpu_is_the_systems_own_law(frame):
    mine = frame[frame["cluster"] == "dgx-b200"].reset_index(drop=True)
    held = (np.log2(mine["bytes"]) % 3 == 2).to_numpy()
    seconds, source = mg.collective_predictions(mine[~held], mine[held].reset_index(drop=True))
    assert set(source) == {"learned own law"}
    ape = np.abs(seconds / mine[held]["time_s_median"].to_numpy() - 1)
    assert ape.max() < 0.05  # the measured curve follows the size factor between measured sizes


@pytest.mark.parametrize(
    ("left_out", "source"),
    [("dgx-h200", "learned twin law"), ("gb200-nvl72", "learned transfer curve")],
)
def test_left_out_system_takes_a_twin_law_else_the_transfer_curve(frame, left_out, source):
    out = (frame["cluster"] == left_out).to_numpy()
    test = frame[out].reset_index(drop=True)
    seconds, how = mg.collective_predictions(frame[~out], test)
    assert set(how) == {source}
    ape = np.abs(seconds / test["time_s_median"].to_numpy() - 1)
    if source == "learned twin law":  # H100's node is H200's: its law is the truth here
        assert ape.max() < 0.05
    else:  # no Blackwell node of 72: the curve pooled over Hopper and Blackwell, nearer than the spec sheet
        links = cluster_links(left_out)
        assert links is not None
        spec = [
            alpha_beta_time_s(k, b, n, 1, n, links[0], links[1])[0]
            for k, b, n in test[["op", "bytes", "world_size"]].itertuples(index=False)
        ]
        spec_ape = np.abs(np.array(spec) / test["time_s_median"].to_numpy() - 1)
        assert ape.mean() < 0.7 * spec_ape.mean(), (ape.mean(), spec_ape.mean())
    kernels = frame.assign(op="gemm").iloc[:3]
    none, blank = mg.collective_predictions(frame[~out], kernels)
    assert np.isnan(none).all() and set(blank) == {""}
