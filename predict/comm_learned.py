"""Learned collective costs in predict: the laws ``train fit`` fitted per cluster
(:mod:`opcast.train.collectives`, ``collectives.json`` of a model set) as a
:class:`~opcast.predict.comm.CollectiveCostSource` in front of the alpha-beta model.

:class:`LearnedCollectives` covers a call when the job runs on a cluster the set has a law for
(named by ``--cluster NAME`` and the device on that cluster's network, :func:`same_network`; a
library caller that names no cluster has it recognised by the device, the cluster's GPU with its
links, :func:`opcast.clusters.cluster_device_name`), the set has a law for the call's kind, and
the law identified the call's tier (:meth:`CollectiveLaw.covers`); it labels the answer
``learned/<cluster>/<ring|p2p|pairwise>/<intra-node|inter-node>``. A call inside one node of a
device no fitted cluster has a law for takes the law of a cluster whose node has the same links
(:func:`same_node_links`; labelled ``(DEVICE: same node links)``), else the spec-sheet alpha-beta
time corrected by the set's transfer curve of the node's link tier, GPU architecture and size
(:class:`opcast.train.collectives.TransferCurve`, label ``learned/transfer/<tier>/intra-node``).
Every other call (across nodes, on a cluster the set never measured) falls through to
:class:`~opcast.predict.comm.AlphaBetaCollectives` (label ``alpha-beta/...``).
:func:`collective_cost_for` builds the composite from a kernel cost model's model set.

A serving engine's own all-reduce (kinds :data:`~opcast.predict.comm.ENGINE_ALL_REDUCES`: vLLM's custom kernel,
TensorRT-LLM's AUTO strategy; one node only) runs over the node's GPU-to-GPU links alone, so its law also covers a
device whose node has the same links as a fitted cluster's GPU (:func:`same_node_links`: architecture, intra-node
bandwidth and GPUs per node; e.g. an A100-SXM4-40GB node on the dgx-a100 law, an H200 node on dgx-h100's); the label
then names both (``learned/dgx-a100/custom/intra-node (A100-SXM4-40GB: same node links)``; TensorRT-LLM's:
``learned/<cluster>/trtllm/intra-node``). Without such a law the call is priced as NCCL's all-reduce
(:class:`~opcast.predict.comm.CollectiveCostModel`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opcast.hardware import NETWORK_FIELDS, base_name
from opcast.predict.comm import (
    CUSTOM_ALL_REDUCE,
    ENGINE_ALL_REDUCES,
    TRTLLM_ALL_REDUCE,
    AlphaBetaCollectives,
    Collective,
    CollectiveCostModel,
)

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

LEARNED = "learned"
_FORMS = {"send_recv": "p2p", "all_to_all": "pairwise", CUSTOM_ALL_REDUCE: "custom", TRTLLM_ALL_REDUCE: "trtllm"}
_NODE_FIELDS = ("architecture", "intra_node_bw_bytes_per_s", "gpus_per_node")


def cluster_device(cluster: str) -> str | None:
    """The name of the device ``--cluster NAME`` prices on, or None for a name the catalog lacks."""
    from opcast.clusters import cluster_device_name, find_cluster
    from opcast.hardware import get_device

    spec = find_cluster(cluster)
    return None if spec is None else get_device(cluster_device_name(spec)).name


def same_network(device: DeviceSpec, cluster: str) -> bool:
    """Whether ``device`` sits on catalog ``cluster``'s network (True for a cluster the catalog lacks:
    its caller named it and nothing contradicts it). A device whose links or NVLink domain differ
    (``opcast explore --vary inter_node_bw_bytes_per_s=...``) is another network, which the
    cluster's fitted laws do not describe."""
    import math

    from opcast.hardware import get_device

    reference = cluster_device(cluster)
    if reference is None:
        return True
    ref = get_device(reference)
    return all(math.isclose(getattr(device, f), getattr(ref, f), rel_tol=1e-5) for f in NETWORK_FIELDS)


def _gpu_of(cluster: str) -> str | None:
    """The catalog GPU name of ``cluster`` (None for a cluster the catalog lacks)."""
    from opcast.clusters import find_cluster
    from opcast.hardware import get_device

    spec = find_cluster(cluster)
    return None if spec is None else get_device(spec.gpu).name


def same_node_links(device: DeviceSpec, cluster: str) -> bool:
    """Whether a node of ``device`` links its GPUs as a node of catalog ``cluster`` does (same GPU
    architecture, intra-node bandwidth and GPUs per node): what borrowing that cluster's law for a
    collective inside one node needs (NCCL's and a serving engine's custom all-reduce alike)."""
    from opcast.clusters import cluster_device_name, find_cluster
    from opcast.hardware import get_device

    spec = find_cluster(cluster)
    if spec is None:
        return False
    ref = get_device(cluster_device_name(spec))
    return all(getattr(device, f) == getattr(ref, f) for f in _NODE_FIELDS)


class LearnedCollectives:
    """The fitted per-cluster laws of a model set (see the module docstring)."""

    name = LEARNED

    def __init__(self, models: Any, label: str, *, cluster: str | None = None) -> None:
        self.models = models
        """:class:`opcast.train.collectives.CollectiveModels`."""
        self.label = label
        """Where the laws came from (the model set)."""
        self.cluster = cluster
        """The job's cluster when the caller knows it (``--cluster NAME``); else found from the device."""
        self._by_device: dict[str, str | None] = {}

    def cluster_of(self, device: DeviceSpec) -> str | None:
        """The fitted cluster ``device`` is on (None: none, or several fitted clusters share its
        device). A named cluster covers a device on its network (:func:`same_network`): the
        cluster's GPU, or any other GPU given the cluster's links (``opcast compare --cluster``)."""
        if self.cluster is not None:
            if self.cluster not in self.models.laws:
                return None
            key = f"{self.cluster}|{device.name}"
            if key not in self._by_device:
                self._by_device[key] = self.cluster if same_network(device, self.cluster) else None
            return self._by_device[key]
        found = self._by_device.get(device.name, "?")
        if found == "?":
            matches = [c for c in sorted(self.models.laws) if cluster_device(c) == device.name]
            found = self._by_device[device.name] = matches[0] if len(matches) == 1 else None
        return found

    def _twin(self, call: Collective, device: DeviceSpec) -> str | None:
        """The fitted cluster (the named one first) whose node links ``device``'s node as its own
        (:func:`same_node_links`) and has a law of the call's kind, or None."""
        links = (call.kind, device.name, device.architecture, device.intra_node_bw_bytes_per_s, device.gpus_per_node)
        key = "links|" + "|".join(map(str, links))
        if key not in self._by_device:
            own = base_name(device)

            # the named cluster first, then a cluster of the device's own GPU (H200 on dgx-h200, not dgx-h100),
            # then a law timed as the kernel alone (dgx-a100's nccl-tests before Vidur's torch calls on Azure)
            def order(c: str) -> tuple[bool, bool, bool, str]:
                law = self.models.law(c, call.kind)
                return (c != self.cluster, _gpu_of(c) != own, not (law is not None and law.kernel_timed), c)

            fitted = sorted(self.models.laws, key=order)
            twins = [c for c in fitted if self.models.law(c, call.kind) and same_node_links(device, c)]
            self._by_device[key] = twins[0] if twins else None
        return self._by_device[key]

    def _law(self, call: Collective, device: DeviceSpec) -> tuple[str, Any, str] | None:
        """(cluster, law, label suffix) of the call, or None where no law covers it. A call inside
        one node of a device whose own cluster has no law of its kind takes the law of a cluster
        whose node has the same links (:meth:`_twin`): what runs inside a node is the links' and
        the GPU architecture's, not the cluster's network."""
        g = call.group
        if g.size <= 1 or call.bytes <= 0:
            return None
        cluster = self.cluster_of(device)
        law = None if cluster is None else self.models.law(cluster, call.kind)
        if law is None and g.nodes == 1:
            twin = self._twin(call, device)
            if twin is not None:
                law = self.models.law(twin, call.kind)
                if law is not None and law.covers(g.nodes, g.per_node):
                    return twin, law, f" ({device.name}: same node links)"
            return None
        if law is None or not law.covers(g.nodes, g.per_node):
            return None
        return str(cluster), law, ""

    def _transfer(self, call: Collective, device: DeviceSpec) -> Any:
        """The transfer curve (:class:`opcast.train.collectives.TransferCurve`) of a single-node
        NCCL call no law covers, or None."""
        g = call.group
        if g.size <= 1 or call.bytes <= 0 or g.nodes != 1 or call.kind in ENGINE_ALL_REDUCES:
            return None
        from opcast.collectives_law import link_tier

        tier = link_tier(device.intra_node_bw_bytes_per_s)
        return self.models.transfer_curve(tier, device.architecture, device.gpus_per_node, call.kind, g.per_node)

    def covers(self, call: Collective, device: DeviceSpec) -> bool:
        return self._law(call, device) is not None or self._transfer(call, device) is not None

    def time_s(self, call: Collective, device: DeviceSpec) -> tuple[float, str]:
        found = self._law(call, device)
        g = call.group
        if found is None:
            from opcast.train.collectives import transfer_time_s

            curve = self._transfer(call, device)
            assert curve is not None, "covers() is asked first"
            seconds = transfer_time_s(
                curve, float(call.bytes), device.intra_node_bw_bytes_per_s, device.inter_node_bw_bytes_per_s
            )
            arch = "any architecture" if curve.architecture is None else f"{curve.architecture} x{curve.node_gpus}"
            return seconds, f"{LEARNED}/transfer/{curve.tier}/intra-node ({arch}: {', '.join(curve.clusters)})"
        cluster, law, note = found
        seconds = law.time_s(float(call.bytes), g.size, g.nodes, g.per_node)
        return seconds, f"{LEARNED}/{cluster}/{_FORMS.get(call.kind, 'ring')}/{law.tier(g.nodes)}{note}"

    def describe(self) -> dict[str, object]:
        return {
            "learned_collectives": {
                "from": self.label,
                "clusters": {c: sorted(kinds) for c, kinds in sorted(self.models.laws.items())},
            }
        }


_LOADED: dict[tuple[str, str], Any] = {}


def _learned_models(kernels: Any) -> tuple[Any, str] | None:
    """(collective laws, label) of the model set behind ``kernels``' learned source, if any."""
    for source in getattr(kernels, "sources", ()):
        model_set = getattr(source, "model_set", None)
        if model_set is None:
            continue
        key = (str(model_set.path), str(model_set.meta.get("meta_sha256")))
        if key not in _LOADED:
            from opcast.train.artifacts import load_collectives

            _LOADED[key] = load_collectives(model_set)
        models = _LOADED[key]
        if models is not None:
            return models, str(getattr(source, "label", model_set.path))
    return None


def collective_cost_for(kernels: Any, *, cluster: str | None = None) -> CollectiveCostModel:
    """The collective cost model for a prediction with ``kernels``: the learned laws of its model
    set in front of alpha-beta where the set has any, plain alpha-beta otherwise. ``cluster``
    names the job's cluster when known (``--cluster NAME``: :attr:`opcast.predict.options.Placement.cluster`);
    else it is recognised by its device."""
    found = _learned_models(kernels)
    if found is None:
        return CollectiveCostModel()
    models, label = found
    return CollectiveCostModel(sources=(LearnedCollectives(models, label, cluster=cluster), AlphaBetaCollectives()))
