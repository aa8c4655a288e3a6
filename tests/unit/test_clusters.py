"""The cluster catalog (data/clusters/*.json): strict validation, the presets, --cluster NAME."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from opcast.clusters import (
    cluster_catalog,
    cluster_device_name,
    cluster_from_dict,
    find_cluster,
    get_cluster,
    load_cluster_file,
)
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.paths import data_path
from opcast.predict.parallel import ClusterChoice, parse_cluster

PRESETS = {
    "perlmutter",
    "vista",
    "dgx-a100",
    "dgx-h100",
    "dgx-h200",
    "dgx-b200",
    "dgx-b300",
    "gb200-nvl72",
    "gb300-nvl72",
    "l40s-pcie-8",
    "rtx-pro-6000-pcie-8",
    "azure-nd-a100-v4",
    "azure-nc-a100-v4",
}


def test_catalog_validates_and_cites():
    cat = cluster_catalog()
    assert set(cat) >= PRESETS
    for name, c in cat.items():
        assert c.source.strip() and "http" in c.source, name
        get_device(c.gpu)  # its GPU is in the hardware catalog
        assert get_device(cluster_device_name(c)).gpus_per_node == c.nvlink_domain_gpus
    assert cat["gb200-nvl72"].nvlink_domain_gpus == 72 and cat["gb200-nvl72"].gpus_per_node == 4
    assert find_cluster("selene").name == "dgx-a100"
    assert find_cluster("a100_pairwise_nvlink").name == "azure-nc-a100-v4"  # Vidur's folder names
    assert find_cluster("a100_dgx").name == "azure-nd-a100-v4"
    assert cat["perlmutter"].datasets and cat["vista"].datasets


@pytest.mark.parametrize(
    ("name", "alias", "gpu"),
    [
        ("dgx-h200", "hgx-h200", "H200"),
        ("dgx-b300", "hgx-b300", "B300"),
        ("l40s-pcie-8", "aiconfigurator-l40s", "L40S"),
        ("rtx-pro-6000-pcie-8", "aiconfigurator-rtx-pro-6000-server", "RTX-PRO-6000"),
    ],
)
def test_eight_gpu_nodes_run_on_their_gpus_catalog_links(name, alias, gpu):
    """The 8-GPU nodes AIConfigurator measured: one NVLink (or PCIe) domain a node, and the links
    the GPU's catalog entry already cites (its reference node), so the cluster's device prices as the GPU."""
    c = find_cluster(alias)
    assert c is not None and c.name == name and c.gpu == gpu
    assert c.gpus_per_node == c.nvlink_domain_gpus == 8
    spec, on_cluster = get_device(gpu), get_device(cluster_device_name(c))
    for field in ("intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s", "gpus_per_node"):
        assert getattr(on_cluster, field) == getattr(spec, field), field
    assert c.inter_node_bw_bytes_per_s == c.nics_per_node * c.nic_bw_bytes_per_s / c.gpus_per_node


def test_cluster_option_help_names_every_catalog_cluster():
    from opcast.predict.options import CLUSTER

    words = set(re.findall(r"[\w-]+", CLUSTER.help))
    assert not [name for name in cluster_catalog() if name not in words]


def _perlmutter() -> dict:
    return json.loads((data_path("clusters") / "perlmutter.json").read_text())


def test_refuses_unknown_and_missing_keys():
    doc = _perlmutter() | {"colour": "blue"}
    del doc["nics_per_node"]
    with pytest.raises(OpcastError, match=r"unknown key 'colour'.*missing key 'nics_per_node'"):
        cluster_from_dict(doc, "x.json")


def test_refuses_missing_units():
    doc = _perlmutter()
    doc["intra_node_bw"] = doc.pop("intra_node_bw_bytes_per_s")
    with pytest.raises(OpcastError, match=r"'intra_node_bw' has no unit; write it as 'intra_node_bw_bytes_per_s'") as e:
        cluster_from_dict(doc, "x.json")
    assert "missing key 'intra_node_bw_bytes_per_s'" not in str(e.value)  # said once, as the unit
    doc = _perlmutter() | {"inter_node_bw_bytes_per_s": "25 GB/s"}
    with pytest.raises(OpcastError, match="positive number in bytes/s"):
        cluster_from_dict(doc, "x.json")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("intra_node_bw_bytes_per_s", 10**400, "'intra_node_bw_bytes_per_s' must be a positive number in bytes/s"),
        ("gpus_per_node", 10**30, "'gpus_per_node' is too large, got 1e+30: give an integer below 2**63"),
        ("nics_per_node", 2**63, "'nics_per_node' is too large"),
    ],
)
def test_refuses_numbers_past_the_arithmetic(key, value, needle):
    # an integer past a float died in math.isfinite (OverflowError, exit 1); a count past int64 was read
    with pytest.raises(OpcastError) as e:
        cluster_from_dict(_perlmutter() | {key: value}, "x.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_refuses_inconsistent_links(tmp_path):
    doc = _perlmutter() | {"inter_node_bw_bytes_per_s": 100e9}  # more than its NICs carry
    with pytest.raises(OpcastError, match="exceeds the NICs' share"):
        cluster_from_dict(doc, "x.json")
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(_perlmutter() | {"name": "mine"}))
    assert load_cluster_file(f).name == "mine" and get_cluster(str(f)).gpus_per_node == 4
    with pytest.raises(OpcastError, match="unknown cluster 'nowhere'"):
        get_cluster("nowhere")


def test_parse_cluster_forms(tmp_path):
    assert parse_cluster("16x8")[0].world_size == 128  # the old forms stay
    c, gpu = parse_cluster("perlmutter")
    assert c == ClusterChoice(nodes=None, name="perlmutter") and gpu.startswith("A100-SXM4-80GB[")
    assert parse_cluster("vista:8")[0].nodes == 8
    f = tmp_path / "c.json"
    f.write_text(json.dumps(_perlmutter() | {"name": "mine"}))
    assert parse_cluster(str(f))[0].name == "mine"
    with pytest.raises(OpcastError, match="catalog cluster"):
        parse_cluster("lots")


@pytest.mark.parametrize("form", ["1" + "0" * 20 + "x8", "8x" + "1" + "0" * 20, "vista:" + "1" + "0" * 20, "file"])
def test_parse_cluster_refuses_counts_past_int64_as_nodes_does(tmp_path, form):
    # 1e20x8 was priced on 8e20 GPUs (opcast search on it never ended), where --nodes 1e20 is refused
    if form == "file":
        form = str(tmp_path / "c.json")
        (tmp_path / "c.json").write_text(json.dumps({"nodes": 10**20, "gpus_per_node": 8}))
    with pytest.raises(OpcastError, match=re.escape("below 2**63")):
        parse_cluster(form)


def _opcast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120)


def test_console_cluster_perlmutter():
    out = _opcast(
        "predict",
        "train",
        "--arch",
        "gpt-neox-20b",
        "--cluster",
        "perlmutter:8",
        "--tp",
        "4",
        "--pp",
        "8",
        "--global-batch",
        "16",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["config"]["nodes"] == 8 and doc["config"]["gpus_per_node"] == 4
    assert doc["gpu"].startswith("A100-SXM4-80GB[") and "inter_node_bw_bytes_per_s=25000000000" in doc["gpu"]
    bad = _opcast("predict", "train", "--arch", "gpt-neox-20b", "--cluster", "perlmuter", "--pp", "4")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "perlmutter" in bad.stderr


def test_predict_infer_takes_a_catalog_cluster_and_refuses_a_gpu_beside_it():
    base = [sys.executable, "-m", "opcast", "predict", "infer", "--arch", "llama3-70b", "--tp", "8", "--json"]
    done = subprocess.run([*base, "--cluster", "dgx-h100"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    same = subprocess.run([*base, "--gpu", "H100-SXM"], capture_output=True, text=True, timeout=300)
    # dgx-h100's links are the H100-SXM catalog defaults: the same kernel times, and inside the node the
    # same learned dgx-h100 law (AIConfigurator's NCCL tables), which plain --gpu takes as its node's links
    on_cluster, plain = json.loads(done.stdout), json.loads(same.stdout)
    for phase in ("prefill", "decode_step"):
        assert on_cluster["breakdown_s"][phase]["compute"] == pytest.approx(plain["breakdown_s"][phase]["compute"])
        assert on_cluster["breakdown_s"][phase]["tp_comm"] == pytest.approx(plain["breakdown_s"][phase]["tp_comm"])
    assert "dgx-h100" in on_cluster["cost_sources"]["learned_collectives"]["clusters"]
    both = subprocess.run(
        [*base, "--cluster", "dgx-h100", "--gpu", "H100-SXM"], capture_output=True, text=True, timeout=300
    )
    assert both.returncode == 2 and "Traceback" not in both.stderr
    assert len(both.stderr.strip().splitlines()) == 1 and "leave --gpu out" in both.stderr
