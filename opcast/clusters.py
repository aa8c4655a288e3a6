"""The cluster catalog: the machines a job runs on, as plain JSON in ``data/clusters/*.json``.

A cluster names its GPU (a hardware-catalog name), how many GPUs a node holds, how many share one
NVLink/NVSwitch domain (72 for a GB200 NVL72 rack, the node otherwise), the intra-domain and
per-GPU inter-node bandwidth (one direction, bytes/s, as the hardware catalog), its NICs, the
interconnect by name, optionally the datasets its collectives were measured in, and the source
of every number. Files are validated strictly, as the hardware catalog: an unknown key, a missing
key or a number without its unit in the key's name (``intra_node_bw`` for
``intra_node_bw_bytes_per_s``) is refused with one line saying what to write instead.

:func:`cluster_device_name` turns a cluster into the ``NAME[field=VALUE,...]`` device the cost
model prices (the GPU with the cluster's links and NVLink domain), so the collectives see the
cluster's network, not the GPU's typical node.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from opcast.errors import OpcastError
from opcast.hardware import is_number, path_exists, read_json_file, show_number
from opcast.ops import INT_PARAM_LIMIT
from opcast.paths import data_path


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """One cluster of the catalog (or a cluster file)."""

    name: str
    aliases: tuple[str, ...] = ()
    gpu: str
    """Hardware-catalog name of its GPU."""
    gpus_per_node: int
    """GPUs in one node (server, or compute tray of a rack)."""
    nvlink_domain_gpus: int
    """GPUs sharing one NVLink/NVSwitch (or xGMI) domain: the node, or 72 for GB200 NVL72."""
    intra_node_bw_bytes_per_s: float
    """Bandwidth per GPU inside the NVLink domain, one direction."""
    inter_node_bw_bytes_per_s: float
    """Network bandwidth per GPU between domains, one direction."""
    nics_per_node: int
    nic_bw_bytes_per_s: float
    """Per NIC, one direction."""
    interconnect: str
    """The network by name, e.g. HPE Slingshot-11, NDR InfiniBand."""
    datasets: tuple[str, ...] = ()
    """Where its collectives were measured (paths or dataset names), if anywhere."""
    source: str
    notes: str = ""


_RULES: dict[str, str] = {
    "name": "name",
    "aliases": "names",
    "gpu": "name",
    "gpus_per_node": "count",
    "nvlink_domain_gpus": "count",
    "intra_node_bw_bytes_per_s": "bandwidth",
    "inter_node_bw_bytes_per_s": "bandwidth",
    "nics_per_node": "count",
    "nic_bw_bytes_per_s": "bandwidth",
    "interconnect": "name",
    "datasets": "names",
    "source": "name",
    "notes": "text",
}
_OPTIONAL = frozenset({"aliases", "datasets", "notes"})
_UNIT_SUFFIX = "_bytes_per_s"


def _problem(key: str, value: Any) -> str | None:
    kind = _RULES[key]
    if kind in ("name", "text"):
        if not isinstance(value, str) or (kind == "name" and not value.strip()):
            return f"'{key}' must be a non-empty string, got {value!r}"
        return None
    if kind == "names":
        ok = isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value)
        return None if ok else f"'{key}' must be a list of non-empty strings, got {value!r}"
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"'{key}' must be a positive integer (a count), got {value!r}"
        if value >= INT_PARAM_LIMIT:
            return f"'{key}' is too large, got {show_number(value)}: give an integer below 2**63"
        return None
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        return f"'{key}' must be a positive number in bytes/s, got {show_number(value)}"
    return None


def cluster_from_dict(data: Any, origin: str) -> ClusterSpec:
    """A :class:`ClusterSpec` from a parsed JSON object, or one :class:`OpcastError` line naming
    every problem (unknown keys, keys without their unit, missing keys, bad values)."""
    if not isinstance(data, dict):
        raise OpcastError(f"{origin}: a cluster must be a JSON object with keys {', '.join(_RULES)}")
    problems: list[str] = []
    for key in data:
        if key in _RULES:
            continue
        if key + _UNIT_SUFFIX in _RULES:
            problems.append(f"'{key}' has no unit; write it as '{key}{_UNIT_SUFFIX}' (bytes/s, one direction)")
        else:
            problems.append(f"unknown key '{key}'")
    problems += [
        f"missing key '{k}'"
        for k in _RULES
        if k not in _OPTIONAL and k not in data and not (k.endswith(_UNIT_SUFFIX) and k[: -len(_UNIT_SUFFIX)] in data)
    ]
    problems += [p for k, v in data.items() if k in _RULES and (p := _problem(k, v))]
    if not problems:
        if data["nvlink_domain_gpus"] % data["gpus_per_node"] and data["gpus_per_node"] % data["nvlink_domain_gpus"]:
            problems.append("'nvlink_domain_gpus' must be a multiple or a divisor of 'gpus_per_node'")
        nic_per_gpu = data["nics_per_node"] * data["nic_bw_bytes_per_s"] / data["gpus_per_node"]
        if data["inter_node_bw_bytes_per_s"] > nic_per_gpu * (1 + 1e-9):
            problems.append(
                f"'inter_node_bw_bytes_per_s' {data['inter_node_bw_bytes_per_s']:g} exceeds the NICs' "
                f"share per GPU, nics_per_node x nic_bw_bytes_per_s / gpus_per_node = {nic_per_gpu:g}"
            )
    if problems:
        raise OpcastError(f"{origin}: " + "; ".join(problems))
    fields: dict[str, Any] = {k: (tuple(v) if _RULES[k] == "names" else v) for k, v in data.items()}
    return ClusterSpec(**fields)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    """A cluster from a catalog-style JSON file (strictly validated; it is only parsed)."""
    return cluster_from_dict(read_json_file(path, "the cluster file"), str(path))


def _normalise(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


@cache
def _load_catalog() -> tuple[dict[str, ClusterSpec], dict[str, str]]:
    """(name -> cluster, normalised name or alias -> name), read once from ``data/clusters``."""
    folder = data_path("clusters")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise OpcastError(f"cluster catalog {folder} holds no *.json files; reinstall opcast")
    specs: dict[str, ClusterSpec] = {}
    index: dict[str, str] = {}
    for path in files:
        spec = load_cluster_file(path)
        if path.stem != spec.name:
            raise OpcastError(f"{path}: name '{spec.name}' differs from the file name; rename it {spec.name}.json")
        for label in (spec.name, *spec.aliases):
            owner = index.setdefault(_normalise(label), spec.name)
            if owner != spec.name:
                raise OpcastError(f"{path}: '{label}' also names cluster {owner}; names and aliases must be unique")
        specs[spec.name] = spec
    return specs, index


def cluster_catalog() -> dict[str, ClusterSpec]:
    """Every catalog cluster by name."""
    return dict(_load_catalog()[0])


def find_cluster(name: str) -> ClusterSpec | None:
    """The catalog cluster called ``name`` (or an alias; spelling-insensitive), or None."""
    specs, index = _load_catalog()
    found = index.get(_normalise(name))
    return specs[found] if found is not None else None


def get_cluster(name: str) -> ClusterSpec:
    """A catalog cluster by name or alias, or a cluster JSON file (a path with a folder in it that exists
    is read as one whatever its name, as a device file is: /dev/null was an 'unknown cluster')."""
    if name.lower().endswith(".json") or ("/" in name and path_exists(Path(name).expanduser())):
        return load_cluster_file(Path(name).expanduser())
    spec = find_cluster(name)
    if spec is None:
        raise OpcastError(
            f"unknown cluster {name!r}; choose one of {', '.join(sorted(cluster_catalog()))} "
            "or give a cluster JSON file"
        )
    return spec


def cluster_device_name(spec: ClusterSpec) -> str:
    """The device the cost model prices on ``spec``: its GPU with the cluster's links, and its
    NVLink domain as the unit inside which collectives run at the intra-node bandwidth."""
    return (
        f"{spec.gpu}[intra_node_bw_bytes_per_s={spec.intra_node_bw_bytes_per_s:.6g},"
        f"inter_node_bw_bytes_per_s={spec.inter_node_bw_bytes_per_s:.6g},"
        f"gpus_per_node={spec.nvlink_domain_gpus}]"
    )
