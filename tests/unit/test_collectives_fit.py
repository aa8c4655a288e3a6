"""Learned per-cluster collective laws: fit (train/collectives.py), artifact (train/artifacts.py
collectives.json), predict source (predict/comm_learned.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.ops import bus_factor
from opcast.schema import write_parquet
from opcast.train.collectives import fit_collectives, fit_law, held_out_report, summary

PUBLISHED = Path(__file__).resolve().parents[2].parent / "shared" / "published" / "estimate-train-time"

# A two-tier network: NVLink inside a node of 4, a slower network across nodes.
ALPHA_S, STEP_INTRA_S, STEP_NET_S = 8e-6, 2e-6, 12e-6
B_INTRA, B_NET = 150e9, 10e9


def _law_s(kind: str, nbytes: float, nodes: int, per: int) -> float:
    """The synthetic truth: alpha + ring steps x per-step latency + ring volume / tier bandwidth."""
    n = nodes * per
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    if nodes == 1:
        return ALPHA_S + STEP_INTRA_S * steps + bus_factor(kind, n) * nbytes / B_INTRA
    net_steps = 2 * (nodes - 1) if kind == "all_reduce" else nodes - 1
    return (
        ALPHA_S
        + STEP_INTRA_S * (steps - net_steps)
        + STEP_NET_S * net_steps
        + bus_factor(kind, n) * nbytes / (per * B_NET)
    )


def _rows(topologies, kind="all_reduce", cluster="perlmutter", noise=0.02, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for nodes, per in topologies:
        for e in range(10, 31):
            nbytes = 2**e
            t = _law_s(kind, nbytes, nodes, per) * (1 + noise * rng.standard_normal())
            rows.append(
                {
                    "op": kind,
                    "bytes": nbytes,
                    "world_size": nodes * per,
                    "nodes": nodes,
                    "gpus_per_node": per,
                    "time_s_median": t,
                    "cluster": cluster,
                }
            )
    return pd.DataFrame(rows)


def test_synthetic_two_tier_law_is_recovered_on_a_held_out_topology():
    fitted = _rows([(1, 4), (2, 4), (4, 4), (2, 1), (4, 1)])
    law = fit_law("all_reduce", fitted)
    assert law is not None
    held = [(8, 4), (8, 1), (16, 4)]  # node counts never fitted
    for nodes, per in held:
        for nbytes in (2**12, 2**17, 3 * 2**20, 2**28, 2**31):  # sizes inside and beyond the sweep
            want = _law_s("all_reduce", nbytes, nodes, per)
            got = law.time_s(nbytes, nodes * per, nodes, per)
            assert abs(got / want - 1) < 0.05, (nodes, per, nbytes, got, want)
    # the physical parameters come back
    assert dict(law.intra_bw_bytes_per_s)[4] == pytest.approx(B_INTRA, rel=0.05)
    assert law.net_bw_bytes_per_s == pytest.approx(B_NET, rel=0.05)
    assert law.net_ranks_exponent == pytest.approx(1.0, abs=0.1)


def test_uncovered_tiers_stay_uncovered():
    law = fit_law("all_reduce", _rows([(1, 4), (1, 2)]))
    assert law is not None and law.net_bw_bytes_per_s is None
    assert not law.covers(2, 4)  # no multi-node rows: no inter-node law
    assert not law.covers(1, 8)  # 8 ranks of a node never measured
    assert law.covers(1, 4)


def _protocol_switch(nbytes: float) -> float:
    """A size-dependent factor no line follows: 1.0 below 64 KiB, rising to 1.5 at 4 MiB, back to 1.0
    from 256 MiB (a protocol and channel-count switch, as NCCL's tuner makes)."""
    x = np.log2(nbytes)
    return float(np.interp(x, [16, 22, 28], [1.0, 1.5, 1.0]))


def test_measured_curve_corrects_the_law_between_its_sizes_and_not_elsewhere():
    frame = _rows([(1, 4), (2, 4)], noise=0.0)
    frame["time_s_median"] *= [_protocol_switch(b) for b in frame["bytes"]]
    law = fit_law("all_reduce", frame)
    assert law is not None
    assert {(n, g) for n, g, _ in law.curves} == {(1, 4), (2, 4)}
    for nodes, per in ((1, 4), (2, 4)):
        for nbytes in (2**12, 2**20, 2**22, 2**25, 2**30):  # measured sizes come back exactly
            want = _law_s("all_reduce", nbytes, nodes, per) * _protocol_switch(nbytes)
            assert law.time_s(nbytes, 4 * nodes, nodes, per) == pytest.approx(want, rel=1e-9)
        # between two measured sizes the log factor is interpolated linearly in log size
        lo, hi = law.time_s(2**21, 4 * nodes, nodes, per), law.time_s(2**22, 4 * nodes, nodes, per)
        mid = law.time_s(2**21.5, 4 * nodes, nodes, per)

        def line(b: float, nodes: int = nodes, per: int = per) -> float:
            return law.time_s(b, 4 * nodes, nodes, per) / math.exp(law.correction(b, nodes, per))

        expect = math.sqrt((lo / line(2**21)) * (hi / line(2**22))) * line(2**21.5)
        assert mid == pytest.approx(expect, rel=1e-9)
    # beyond the sweep the end value is held; a topology never measured gets the law alone
    big = 2**34
    assert law.correction(big, 1, 4) == pytest.approx(law.correction(2**30, 1, 4))
    assert law.correction(big, 8, 4) == 0.0 and law.correction(2**22, 8, 4) == 0.0


def test_measured_curve_beats_the_line_on_held_out_sizes():
    frame = _rows([(1, 4), (1, 8)], noise=0.01)
    frame["time_s_median"] *= [_protocol_switch(b) for b in frame["bytes"]]
    report = summary(held_out_report(frame))
    line = fit_law("all_reduce", frame)
    assert line is not None
    flat = replace(line, curves=())  # the same law without its curve
    held = frame[np.isin(np.log2(frame["bytes"]) % 3, [2])]
    ape = lambda lw: np.mean(  # noqa: E731
        [
            abs(lw.time_s(b, n, 1, g) / t - 1)
            for b, n, g, t in held[["bytes", "world_size", "gpus_per_node", "time_s_median"]].itertuples(index=False)
        ]
    )
    assert ape(flat) > 0.05  # the factor is real: a line is 5 %+ off
    (sizes,) = [r for r in report if r["split"] == "sizes"]
    assert sizes["mean_ape"] < 3.0, sizes  # fitted without the held-out sizes, the curve follows it


def test_held_out_report_scores_sizes_and_the_larger_topology():
    frame = _rows([(1, 4), (2, 4), (4, 4), (8, 4)], noise=0.0)
    records = held_out_report(frame)
    splits = {(r["split"], r["held_out"]) for r in records}
    assert ("topology", "8x4") in splits and ("sizes", "every 3rd size") in splits
    for r in summary(records):
        assert r["median_ape"] < 1.0, r


def _model_set(tmp_path: Path, frame: pd.DataFrame) -> Path:
    from opcast.train.collectives import write_collectives_only_set

    models = fit_collectives(frame)
    assert models is not None
    return write_collectives_only_set(tmp_path / "models", "coll", [], "test", collectives=models)


def test_artifact_round_trip(tmp_path):
    from opcast.train.artifacts import load_collectives, load_model_set

    frame = pd.concat([_rows([(1, 4), (2, 4), (4, 4)]), _rows([(2, 1), (4, 1)], kind="send_recv")])
    frame.loc[frame.op == "send_recv", ["world_size", "nodes", "gpus_per_node"]] = [2, 2, 1]
    path = _model_set(tmp_path, frame)
    models = load_collectives(load_model_set(path))
    fresh = fit_collectives(frame)
    assert set(models.laws["perlmutter"]) == {"all_reduce", "send_recv"}
    assert models.laws == fresh.laws  # every parameter survives JSON exactly
    assert json.loads((path / "collectives.json").read_text())["format"] == "opcast-collectives"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["clusters"]["perlmutter"]["all_reduce"].update(net_bw_bytes_per_s=-1.0), "net_bw_bytes_per_s"),
        (lambda d: d["clusters"]["perlmutter"]["all_reduce"].update(code="x"), "not a field of a collective law"),
        (lambda d: d.update(base="x"), "unknown field"),
        (lambda d: d["clusters"]["perlmutter"].update(gemm={}), "not a collective"),
        (lambda d: d["clusters"]["perlmutter"]["all_reduce"]["curves"][0][2].reverse(), "curves"),
        (lambda d: d["clusters"]["perlmutter"]["all_reduce"]["curves"][0][2][0].__setitem__(1, 99.0), "curves"),
        (lambda d: d["clusters"]["perlmutter"]["all_reduce"].update(curves=[[1, 4]]), "curves"),
    ],
)
def test_malformed_artifact_is_refused_in_one_line(tmp_path, edit, message):
    from opcast.train.artifacts import _body_digest, load_collectives, load_model_set

    path = _model_set(tmp_path, _rows([(1, 4), (2, 4)]))
    data = json.loads((path / "collectives.json").read_text())
    edit(data)
    data["sha256"] = _body_digest(data)  # even with a recomputed digest
    (path / "collectives.json").write_text(json.dumps(data))
    with pytest.raises(OpcastError, match=message) as err:
        load_collectives(load_model_set(path))
    assert "\n" not in str(err.value)


def test_tampered_artifact_is_refused_by_the_console_script(tmp_path):
    path = _model_set(tmp_path, _rows([(1, 4), (2, 4)]))
    text = (path / "collectives.json").read_text().replace('"rows": ', '"rows": 1', 1)
    (path / "collectives.json").write_text(text)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcast",
            "predict",
            "train",
            "--arch",
            "llama2-7b",
            "--cluster",
            "perlmutter:2",
            "--models",
            str(path),
            "--global-batch",
            "8",
            "--micro-batch",
            "1",
            "--seq",
            "512",
            "--tp",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "collectives.json was modified after fitting" in lines[0]


def test_predict_labels_each_collective_with_its_source(tmp_path):
    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.comm import Collective, Group
    from opcast.predict.comm_learned import cluster_device, collective_cost_for
    from opcast.predict.cost import load_kernel_cost
    from opcast.predict.training import TrainConfig, predict_train

    path = _model_set(tmp_path, _rows([(1, 4), (2, 4), (4, 4)]))
    kernels = load_kernel_cost(path)
    comms = collective_cost_for(kernels)
    perlmutter = get_device(cluster_device("perlmutter"))
    t, label = comms.time_s(Collective("all_reduce", 2**26, Group(8, 2, 4)), perlmutter)
    assert label == "learned/perlmutter/ring/inter-node"
    assert t == pytest.approx(_law_s("all_reduce", 2**26, 2, 4), rel=0.05)
    # a kind the set has no law for, and a plain GPU without --cluster: alpha-beta
    assert comms.time_s(Collective("all_gather", 2**26, Group(8, 2, 4)), perlmutter)[1].startswith("alpha-beta/")
    plain = get_device("A100-SXM4-80GB")
    assert comms.time_s(Collective("all_reduce", 2**26, Group(8, 1, 8)), plain)[1].startswith("alpha-beta/")
    # through a whole prediction: cost_sources counts the learned collectives
    cfg = TrainConfig(global_batch=16, micro_batch=1, seq=512, tp=4)
    result = predict_train(load_arch("llama2-7b"), perlmutter, cfg, nodes=2, gpus_per_node=4, kernels=kernels)
    by_source = result.cost_sources["collectives_by_source"]
    assert any(k.startswith("learned/perlmutter/") for k in by_source), by_source
    assert result.cost_sources["learned_collectives"]["clusters"] == {"perlmutter": ["all_reduce"]}


def test_train_fit_writes_collectives_from_a_collectives_only_dataset(tmp_path):
    frame = _rows([(1, 4), (2, 4)]).assign(
        run_id="r",
        source="comm",
        device="A100-SXM4-80GB",
        timing_method="wallclock_max_ranks:nccl",
        dtype="bf16",
        direction="fwd",
        backend="nccl",
    )
    write_parquet(frame, tmp_path / "data" / "comm.parquet")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcast",
            "train",
            "fit",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "m"),
            "--name",
            "c",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["collectives"]["clusters"] == {"perlmutter": ["all_reduce"]}
    assert (tmp_path / "m" / "c" / "collectives.json").is_file()


@pytest.mark.skipif(not PUBLISHED.is_dir(), reason=f"published 2509.22832 data absent ({PUBLISHED})")
def test_perlmutter_nccl_held_out_error(tmp_path):
    from opcast.collect.replay import ReplayOptions
    from opcast.collect.replay import estimate_train_time as ett

    rows = [r for r in ett.replay(PUBLISHED, ReplayOptions()).rows if r["op"] in ("all_reduce", "all_gather")]
    frame = pd.DataFrame(rows)
    assert set(frame["cluster"]) == {"perlmutter", "vista"}  # the replay tags each row by its system folder
    frame = frame[frame["cluster"] == "perlmutter"]
    table = pd.DataFrame(summary(held_out_report(frame)))
    print(table.to_string())
    assert set(table["split"]) == {"sizes", "topology"}
    assert (table["median_ape"] <= 10).all(), table


# --------------------------------------------------------------------------- transfer to unmeasured clusters

HOPPER_FACTOR = [0.9, 1.3, 0.8]  # measured / alpha-beta at 2**12, 2**20 and 2**28 bytes (then held)
BLACKWELL_FACTOR = [1.1, 1.6, 1.3]


def _factor(nbytes: float, points: list[float]) -> float:
    return float(np.exp(np.interp(np.log2(nbytes), [12, 20, 28], np.log(points))))


def _single_node_rows(cluster: str, factor: list[float], timing: str = "replay:aiconfigurator:nccl-tests-avg"):
    """NCCL rows of one catalog cluster: its alpha-beta time on its own links times ``factor``."""
    from opcast.collectives_law import alpha_beta_time_s
    from opcast.train.collectives import cluster_links

    links = cluster_links(cluster)
    assert links is not None
    rows = []
    for kind in ("all_reduce", "all_gather"):
        for n in (2, 4, 8):
            for e in range(10, 31):
                t = alpha_beta_time_s(kind, 2**e, n, 1, n, links[0], links[1])[0] * _factor(2**e, factor)
                rows.append(
                    {
                        "op": kind,
                        "bytes": 2**e,
                        "world_size": n,
                        "nodes": 1,
                        "gpus_per_node": n,
                        "time_s_median": t,
                        "cluster": cluster,
                        "timing_method": timing,
                    }
                )
    return pd.DataFrame(rows)


def _four_clusters() -> pd.DataFrame:
    return pd.concat(
        [
            _single_node_rows("dgx-h100", HOPPER_FACTOR),
            _single_node_rows("dgx-h200", HOPPER_FACTOR),
            _single_node_rows("dgx-b200", BLACKWELL_FACTOR),
            _single_node_rows("dgx-b300", BLACKWELL_FACTOR),
        ],
        ignore_index=True,
    )


def test_transfer_curve_is_its_architectures_and_moves_the_spec_time_of_an_unmeasured_gpu():
    from opcast.collectives_law import alpha_beta_time_s
    from opcast.hardware import get_device
    from opcast.predict.comm import Collective, Group
    from opcast.predict.comm_learned import LearnedCollectives

    models = fit_collectives(_four_clusters())
    assert models is not None
    hopper = models.transfer_curve("nvlink", "hopper", 8, "all_reduce", 4)
    pooled = models.transfer_curve("nvlink", "cdna3", 8, "all_reduce", 4)  # no AMD cluster: the pooled curve
    assert hopper is not None and hopper.clusters == ("dgx-h100", "dgx-h200")
    assert pooled is not None and pooled.architecture is None and len(pooled.clusters) == 4
    # H800 (Hopper, 200 GB/s NVLink, no cluster measured): its own alpha-beta time x Hopper's factor
    h800 = get_device("H800")
    source = LearnedCollectives(models, "test")
    for nbytes in (2**14, 2**20, 3 * 2**22, 2**29):
        call = Collective("all_reduce", nbytes, Group(4, 1, 4))
        seconds, label = source.time_s(call, h800)
        spec = alpha_beta_time_s("all_reduce", nbytes, 4, 1, 4, h800.intra_node_bw_bytes_per_s, 1e9)[0]
        assert seconds == pytest.approx(spec * _factor(nbytes, HOPPER_FACTOR), rel=1e-6), nbytes
        assert label == "learned/transfer/nvlink/intra-node (hopper x8: dgx-h100, dgx-h200)"
    assert not source.covers(Collective("all_reduce", 2**20, Group(8, 2, 4)), h800)  # across nodes: alpha-beta
    # H20 has an H100 node's links: it takes dgx-h100's own law, not a transfer
    _, label = source.time_s(Collective("all_reduce", 2**20, Group(8, 1, 8)), get_device("H20"))
    assert label.startswith("learned/dgx-h100/ring/intra-node (H20: same node links)")


def test_transfer_is_scored_by_leaving_each_cluster_out_and_ignores_framework_timings():
    frame = _four_clusters()
    torch_level = _single_node_rows("dgx-a100", [3.0, 3.0, 3.0], timing="replay:vidur:median3")
    models = fit_collectives(pd.concat([frame, torch_level], ignore_index=True))
    assert models is not None
    assert all("dgx-a100" not in c.clusters for c in models.transfer)  # a torch-level timing moves no curve
    assert "dgx-a100" in models.laws  # but fits its own cluster's law
    report = {(r["cluster"], r["kind"]): r for r in models.held_out if r["split"] == "transfer"}
    spec = {(r["cluster"], r["kind"]): r for r in models.held_out if r["split"] == "alpha-beta"}
    assert set(report) == {
        (c, k) for c in ("dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300") for k in ("all_gather", "all_reduce")
    }
    for key, r in report.items():  # each left-out cluster is predicted by its twin's curve: exact
        assert r["mean_ape"] < 0.5 and r["not_covered"] == 0, r
        assert spec[key]["mean_ape"] > 10, spec[key]  # the spec sheet alone is not


def test_transfer_curves_survive_the_artifact(tmp_path):
    from opcast.train.artifacts import _body_digest, load_collectives, load_model_set

    path = _model_set(tmp_path, _four_clusters())
    loaded = load_collectives(load_model_set(path))
    assert loaded.transfer == fit_collectives(_four_clusters()).transfer and loaded.transfer
    data = json.loads((path / "collectives.json").read_text())
    data["transfer"][0]["tier"] = "infiniband"
    data["sha256"] = _body_digest(data)
    (path / "collectives.json").write_text(json.dumps(data))
    with pytest.raises(OpcastError, match=r"transfer\[0\]\.tier") as err:
        load_collectives(load_model_set(path))
    assert "\n" not in str(err.value)


def test_a_dense_size_sweep_gives_a_smoothed_curve_that_loads(tmp_path):
    from opcast.train.artifacts import load_collectives, load_model_set

    rng = np.random.default_rng(1)
    sizes = np.unique(np.round(2 ** rng.uniform(11, 26, 1000)).astype(int))  # ~1,000 sizes, as Vidur's profiles
    frame = pd.DataFrame(
        {
            "op": "all_reduce",
            "bytes": sizes,
            "world_size": 4,
            "nodes": 1,
            "gpus_per_node": 4,
            "time_s_median": [_law_s("all_reduce", b, 1, 4) * (1 + 0.05 * rng.standard_normal()) for b in sizes],
            "cluster": "perlmutter",
        }
    )
    law = fit_law("all_reduce", frame)
    assert law is not None
    ((_, _, points),) = law.curves
    assert len(points) <= 4 * 15 + 1  # a point per quarter octave over 15 octaves
    loaded = load_collectives(load_model_set(_model_set(tmp_path, frame)))
    assert loaded.laws["perlmutter"]["all_reduce"].curves == law.curves


def test_a_plain_gpu_takes_the_kernel_timed_law_of_its_own_node():
    from opcast.hardware import get_device
    from opcast.predict.comm import Collective, Group
    from opcast.predict.comm_learned import LearnedCollectives

    frame = pd.concat(
        [
            _single_node_rows("azure-nd-a100-v4", [3.0, 3.0, 3.0], timing="replay:vidur:median3"),
            _single_node_rows("dgx-a100", [1.0, 1.2, 1.0]),
        ],
        ignore_index=True,
    )
    models = fit_collectives(frame)
    assert models is not None
    assert models.laws["dgx-a100"]["all_reduce"].kernel_timed
    assert not models.laws["azure-nd-a100-v4"]["all_reduce"].kernel_timed
    # both are nodes of eight A100-SXM4-80GB on NVSwitch; the nccl-tests law prices the kernel
    _, label = LearnedCollectives(models, "test").time_s(
        Collective("all_reduce", 2**24, Group(8, 1, 8)), get_device("A100-SXM4-80GB")
    )
    assert label == "learned/dgx-a100/ring/intra-node (A100-SXM4-80GB: same node links)"
    # a job that names the Azure cluster gets the Azure law
    _, label = LearnedCollectives(models, "test", cluster="azure-nd-a100-v4").time_s(
        Collective("all_reduce", 2**24, Group(8, 1, 8)), get_device("A100-SXM4-80GB")
    )
    assert label.startswith("learned/azure-nd-a100-v4/")


def test_laws_that_would_not_load_stop_the_write_with_the_old_set_whole(tmp_path):
    from opcast.train.collectives import write_collectives_only_set

    frame = _rows([(1, 4), (2, 4)])
    path = _model_set(tmp_path, frame)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    good = fit_collectives(frame)
    assert good is not None
    law = good.laws["perlmutter"]["all_reduce"]
    bad = replace(good, laws={"perlmutter": {"all_reduce": replace(law, curves=((1, 4, ((1.0, 99.0),)),))}})
    with pytest.raises(OpcastError, match="curves") as err:
        write_collectives_only_set(tmp_path / "models", "coll", [], "test", collectives=bad)
    assert "\n" not in str(err.value)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # meta.json and collectives.json as they were
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["coll"]  # no staging folder left behind
