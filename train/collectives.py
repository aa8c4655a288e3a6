"""Learned collective costs: one physically-shaped alpha-beta law per (cluster, collective kind).

``train fit`` fits it on every collective row that names its cluster (``collect comm --cluster``,
the replays' tags) and stores it in the model set as ``collectives.json``
(:func:`opcast.train.artifacts.write_collectives`); predict prices the collectives of a job on
that cluster with it (:mod:`opcast.predict.comm_learned`) and falls back to the spec-sheet
alpha-beta model elsewhere.

The law (Hockney's alpha-beta, per link tier, over the ring's phases as NCCL runs them)::

    one node (g ranks):  t = base + step_intra * steps(kind, g) + vol(kind, g) * S / B_intra[g]
    N > 1 nodes:         t = base + step_intra * (steps(kind, n) - steps_net(kind, N))
                              + step_net * steps_net(kind, N) + vol_net(kind, n, g) * S / (B_net * g**gamma)

``S`` is the nccl-tests size, ``vol`` the ring volume per rank (the nccl-tests bus factor of
:func:`opcast.ops.bus_factor`: all-reduce ``2(n-1)/n``, all-gather and reduce-scatter ``(n-1)/n``,
send/recv and broadcast 1; all-to-all sends its inter-node share ``(n-g)/n`` over each GPU's own
NIC), ``steps`` the ring's latency steps (``2(n-1)`` for all-reduce, ``n-1`` otherwise, 1 for
send/recv) of which ``steps_net`` cross nodes. Those are the formulas of
:class:`opcast.predict.comm.AlphaBetaCollectives`' ring. The parameters are physical: a launch
latency ``base_s``, a latency per intra-node and per inter-node ring step, the bus bandwidth a
group of ``g`` ranks of one node reaches (``B_intra[g]``: one per g measured, since an NVLink mesh
gives a pair a third of what four GPUs reach, while an NVSwitch gives every g the same), the
per-GPU network bandwidth ``B_net`` and ``gamma`` in [0, 1], how much of its node's NICs a ring
with g ranks per node uses (1: one NIC per rank, as the alpha-beta model assumes; 0: one NIC for
the node). They are fitted by non-negative least squares on the relative error (the log-time
error to first order) with Huber re-weighting (robust to the odd slow sample), ``gamma`` on a
grid. A parameter the rows cannot identify stays null, and a call that needs it is not covered
(the alpha-beta model prices it): no intra-node law without single-node rows, none for a number
of ranks per node never measured inside one node, no inter-node law without multi-node rows.
So the law extrapolates in message size and in node count (8 nodes from 1-4), not in kinds of
links it never saw.

Between the sizes it measured, a topology's times are the law's times corrected by that topology's
own measured curve (:attr:`CollectiveLaw.curves`): per measured (nodes, ranks per node), the median
log ratio of measured to law time at each message size, interpolated linearly in log size and held
at its end values beyond them. One line per tier cannot follow NCCL's size-dependent choices (the
protocol, LL / LL128 / Simple, and the number of channels switch with the size, ``src/graph/
tuning.cc`` and ``enqueue.cc``), which leave the affine law 10-30 % off in the middle of its range
on an NVSwitch node (held-out sizes of AIConfigurator's DGX tables: 10-16 % mean error for the line
alone); the curve keeps the law's extrapolation in size and node count (an unmeasured topology has
no curve and gets the law alone) and makes the measured sizes' neighbourhood the measurement's.

A serving engine's custom all-reduce (vLLM's one-shot/two-shot IPC kernel, measured by
AIConfigurator) is fitted as its own kind, :data:`CUSTOM_ALL_REDUCE`, with the same law and the
all-reduce's step and volume counts (its free launch, step and bandwidth terms absorb the
kernel's one-shot/two-shot shape): single-node rows only, so it never covers a call across nodes.
TensorRT-LLM's ``AllReduce`` (strategy AUTO: its own one-shot and two-shot kernels, NCCL where it
picks it) is another kind of the same form, :data:`TRTLLM_ALL_REDUCE`, from the rows of ``backend``
trtllm (:data:`CUSTOM_BACKENDS`).

For a GPU whose cluster was never measured, :class:`TransferCurve` carries what the fitted clusters
agree on: per link tier (NVLink/NVSwitch or PCIe, :func:`opcast.collectives_law.link_tier`), kind
and ranks of one node, the median over clusters of each cluster's measured / spec-sheet alpha-beta
log ratio (:func:`opcast.collectives_law.alpha_beta_time_s` on the cluster's links) at each message
size: one curve per GPU architecture and node size measured (its clusters alone: how NCCL runs on
that generation's NVLink and on that fabric, e.g. Hopper's NVLink SHARP reaches 0.95-1.0 of the link
where Blackwell's NVSwitch tables read 0.75, and a 4-GPU NVLink mesh is not an 8-GPU NVSwitch), and
one over every architecture where at least :data:`TRANSFER_MIN_CLUSTERS` clusters measured a size.
A GPU takes the curve of its architecture and node size, else the pooled one. Predict multiplies an
unmeasured device's alpha-beta time by it inside one node (:mod:`opcast.predict.comm_learned`).
It is scored by leaving each cluster out (split ``transfer``).

Held-out report (:func:`held_out_report`): ``sizes`` leaves out every third message size of each
topology and fits on the rest; ``topology`` fits on the runs of at most 4 nodes and scores those of
more where there are any, else leaves each topology out in turn (scored where the rest still
identify its tiers). Median and mean absolute % error per cluster and kind.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from opcast.ops import bus_factor

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

OP_KINDS: Final = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")
"""The registry's collective ops (the ``op`` of a dataset row)."""
CUSTOM_ALL_REDUCE: Final = "all_reduce_custom"
"""The law of a serving engine's own (non-NCCL) all-reduce: ``all_reduce`` rows whose ``backend``
is one of :data:`CUSTOM_BACKENDS` (the AIConfigurator replay's ``custom_allreduce_perf``).
:data:`opcast.predict.comm.CUSTOM_ALL_REDUCE` names the same kind."""
TRTLLM_ALL_REDUCE: Final = "all_reduce_trtllm"
"""The law of TensorRT-LLM's all-reduce (``AllReduce``, strategy AUTO): ``all_reduce`` rows of ``backend`` trtllm
(the AIConfigurator replay's family of TensorRT-LLM's ``custom_allreduce_perf`` rows,
:data:`opcast.collect.replay.aiconfigurator.CUSTOM_FAMILIES`). :data:`opcast.predict.comm.TRTLLM_ALL_REDUCE` names
the same kind."""
CUSTOM_BACKENDS: Final = {"custom": CUSTOM_ALL_REDUCE, "trtllm": TRTLLM_ALL_REDUCE}
"""``backend`` of a serving engine's own all-reduce rows -> the law kind they fit (never NCCL's ``all_reduce``)."""
ENGINE_KINDS: Final = tuple(CUSTOM_BACKENDS.values())
"""The law kinds of serving engines' own all-reduce: one node only, no transfer curve."""


KINDS: Final = (*OP_KINDS, *ENGINE_KINDS)
"""Every law kind a ``collectives.json`` may hold."""
FORMAT: Final = "opcast-collectives"
FORMAT_VERSION: Final = 2
"""1: the laws alone; 2: a law may carry its measured ``curves``, and the file ``transfer`` curves
(each written only where fitted)."""
MIN_ROWS: Final = 8
"""A (cluster, kind) with fewer usable rows is not fitted."""
GAMMA_GRID: Final = tuple(i / 10 for i in range(11))
HUBER_C: Final = 1.345
IRLS_ITERATIONS: Final = 6
HOLDOUT_MAX_NODES: Final = 4
"""The topology split fits on runs of at most this many nodes and scores the larger ones."""
CURVE_MIN_SIZES: Final = 3
"""A topology measured at fewer distinct message sizes gets no curve (the law alone)."""
CURVE_MAX_LOG: Final = 20.0
"""A curve's log factor is held within +-20 (what collectives.json accepts): a factor of e**20 is a
corrupt row, not a correction."""
CURVE_BINS_PER_OCTAVE: Final = 4
"""A curve has one point per quarter octave of message size at most (the median log size and log
ratio of the sizes in it): nccl-tests' power-of-two sweeps keep every size, Vidur's ~1,000 sizes
per topology are smoothed to ~60 points."""
TRANSFER_TIMINGS: Final = ("nccl-tests",)
"""Transfer curves learn from rows timed as the collective kernel alone: a ``timing_method``
naming nccl-tests (AIConfigurator's ``nccl-tests-avg``). Vidur's rows time a torch.distributed call
(Python launch and a sync: 62 us at 2 KiB on Azure's A100 NVSwitch node where nccl-tests reads
22 us on a DGX A100), 2509.22832's a framework call too; each fits its own cluster's law, but a
curve that moves another GPU's kernel time must be measured as one."""
TRANSFER_MIN_CLUSTERS: Final = 3
"""A transfer curve's point needs this many clusters of the tier measuring its size (two that
disagree give no median worth moving a spec-sheet time by)."""


# --------------------------------------------------------------------------- the law


def op_kind(kind: str) -> str:
    """The collective op a law kind prices (each of :data:`ENGINE_KINDS` is an all-reduce)."""
    return "all_reduce" if kind in ENGINE_KINDS else kind


def ring_steps(kind: str, n: int) -> int:
    """Latency steps of the ring over ``n`` ranks (NCCL's ring: all-reduce 2(n-1), send/recv 1)."""
    kind = op_kind(kind)
    if kind == "send_recv":
        return 1
    return 2 * (n - 1) if kind == "all_reduce" else n - 1


def volume(kind: str, n: int, per_node: int, tier: str) -> float:
    """Bytes per byte of ``S`` that each rank moves over ``tier`` (intra or net) in the ring."""
    kind = op_kind(kind)
    if kind == "all_to_all" and tier == "net":
        return (n - per_node) / n  # the inter-node share, over each GPU's own NIC
    return bus_factor(kind, n)


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveLaw:
    """The fitted law of one collective kind on one cluster (see the module docstring)."""

    kind: str
    base_s: float
    """Launch latency, seconds."""
    step_intra_s: float | None
    """Latency per ring step inside a node (None: not measured)."""
    step_net_s: float | None
    """Latency per ring step across nodes (None: not measured)."""
    intra_bw_bytes_per_s: tuple[tuple[int, float], ...]
    """(ranks of the group per node g, bus bandwidth g ranks of one node reach), per g measured."""
    net_bw_bytes_per_s: float | None
    """Network bandwidth per GPU (one rank per node); None: no multi-node rows."""
    net_ranks_exponent: float
    """gamma: a ring with g ranks per node crosses nodes at ``g**gamma`` x the per-GPU bandwidth."""
    rows: int
    bytes_min: int
    bytes_max: int
    topologies: tuple[tuple[int, int], ...]
    """(nodes, ranks per node) measured."""
    kernel_timed: bool = False
    """Whether every row it was fitted on timed the collective kernel alone (a ``timing_method`` of
    :data:`TRANSFER_TIMINGS`), not a framework call: what a device borrowing a same-links cluster's
    law prefers (:mod:`opcast.predict.comm_learned`)."""
    curves: tuple[tuple[int, int, tuple[tuple[float, float], ...]], ...] = ()
    """Per measured topology (nodes, ranks per node), its correction curve: (log2 bytes, natural
    log of measured / law time) at each measured size, ascending (see the module docstring)."""

    def covers(self, nodes: int, per_node: int) -> bool:
        if nodes > 1:
            return self.net_bw_bytes_per_s is not None
        return any(g == per_node for g, _ in self.intra_bw_bytes_per_s)

    def tier(self, nodes: int) -> str:
        return "inter-node" if nodes > 1 else "intra-node"

    def time_s(self, nbytes: float, n: int, nodes: int, per_node: int) -> float:
        """Seconds of one call (``covers`` must hold)."""
        x = design_row(self.kind, nbytes, n, nodes, per_node, self.net_ranks_exponent)
        si, sn = self.step_intra_s or 0.0, self.step_net_s or 0.0
        t = self.base_s + si * x["steps_intra"] + sn * x["steps_net"]
        if nodes > 1:
            assert self.net_bw_bytes_per_s is not None, "covers() is checked first"
            t += x["vol_net"] / self.net_bw_bytes_per_s
        else:
            t += x["vol_intra"] / dict(self.intra_bw_bytes_per_s)[per_node]
        return t * math.exp(self.correction(nbytes, nodes, per_node))

    def correction(self, nbytes: float, nodes: int, per_node: int) -> float:
        """The log factor of the topology's measured curve at ``nbytes`` (0 without a curve)."""
        for nd, g, points in self.curves:
            if nd == nodes and g == per_node:
                return interpolate(math.log2(nbytes), points)
        return 0.0


def interpolate(x: float, points: tuple[tuple[float, float], ...]) -> float:
    """Piecewise-linear ``y(x)`` through ascending ``points``, held at the end values outside them."""
    import bisect

    i = bisect.bisect_left(points, (x, -math.inf))
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def design_row(kind: str, nbytes: float, n: int, nodes: int, per_node: int, gamma: float) -> dict[str, float]:
    """The law's regressors of one call: ring steps per tier and bytes over each tier (the
    network's already divided by ``per_node**gamma``)."""
    if nodes == 1:
        return {
            "steps_intra": float(ring_steps(kind, n)),
            "steps_net": 0.0,
            "vol_intra": volume(kind, n, per_node, "intra") * nbytes,
            "vol_net": 0.0,
        }
    net_steps = ring_steps(kind, nodes)
    return {
        "steps_intra": float(max(0, ring_steps(kind, n) - net_steps)),
        "steps_net": float(net_steps),
        "vol_intra": 0.0,
        "vol_net": volume(kind, n, per_node, "net") * nbytes / per_node**gamma,
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferCurve:
    """How one node's NCCL departs from the spec-sheet alpha-beta model, over every fitted cluster
    of a link tier (see the module docstring)."""

    tier: str
    """``nvlink`` or ``pci`` (:func:`opcast.collectives_law.link_tier`)."""
    architecture: str | None
    """The GPU architecture of its clusters; None: pooled over architectures and node sizes."""
    node_gpus: int | None
    """GPUs of one node (NVLink domain) of its clusters; None when pooled."""
    kind: str
    per_node: int
    """Ranks, all inside one node."""
    clusters: tuple[str, ...]
    """The clusters it was learned from."""
    points: tuple[tuple[float, float], ...]
    """(log2 bytes, median over clusters of log(measured / alpha-beta)), ascending."""

    def correction(self, nbytes: float) -> float:
        return interpolate(math.log2(nbytes), self.points)


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveModels:
    """Every fitted law, by cluster and kind, the transfer curves and the held-out report."""

    laws: Mapping[str, Mapping[str, CollectiveLaw]]
    """cluster name -> kind -> law."""
    held_out: tuple[Mapping[str, Any], ...] = ()
    skipped: Mapping[str, int] = field(default_factory=dict)
    transfer: tuple[TransferCurve, ...] = ()

    def law(self, cluster: str, kind: str) -> CollectiveLaw | None:
        return self.laws.get(cluster, {}).get(kind)

    def transfer_curve(
        self, tier: str, architecture: str, node_gpus: int, kind: str, per_node: int
    ) -> TransferCurve | None:
        """The curve of ``architecture`` on nodes of ``node_gpus`` for the call, else the pooled
        one of ``tier``, else None."""
        found = [c for c in self.transfer if c.tier == tier and c.kind == kind and c.per_node == per_node]
        for c in found:
            if c.architecture == architecture and c.node_gpus == node_gpus:
                return c
        return next((c for c in found if c.architecture is None), None)


# --------------------------------------------------------------------------- fitting


def custom_backend(frame: pd.DataFrame) -> np.ndarray:
    """Which rows of ``frame`` timed a serving engine's own collective (``backend`` in
    :data:`CUSTOM_BACKENDS`), not NCCL's: they fit that backend's law only (:data:`ENGINE_KINDS`)."""
    import numpy as np

    if "backend" not in frame.columns:
        return np.zeros(len(frame), dtype=bool)
    return frame["backend"].isin(list(CUSTOM_BACKENDS)).fillna(False).to_numpy(dtype=bool)


def collective_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows a law can be fitted on (a collective, its cluster named, a positive time, a
    consistent topology) and the count of the others by reason. A custom all-reduce row (its
    ``backend`` in :data:`CUSTOM_BACKENDS`) comes back with ``op`` its backend's law kind."""
    import numpy as np

    skipped: dict[str, int] = {}
    coll = frame[frame["op"].isin(OP_KINDS)] if len(frame) else frame
    if not len(coll):
        return coll, skipped
    custom = custom_backend(coll)
    if custom.any():
        other = custom & (coll["op"].astype(str) != "all_reduce").to_numpy()
        if other.any():
            skipped["custom-backend collectives other than all-reduce (no law for them)"] = int(other.sum())
        kinds = coll["backend"].map(CUSTOM_BACKENDS).to_numpy(dtype=object)
        op = np.where(custom, kinds, coll["op"].astype(str).to_numpy())
        coll = coll[~other].assign(op=op[~other])
    cluster = coll["cluster"] if "cluster" in coll.columns else None
    named = cluster.notna().to_numpy() if cluster is not None else np.zeros(len(coll), dtype=bool)
    if (~named).any():
        skipped["collective rows without a cluster (collect comm --cluster NAME records it)"] = int((~named).sum())
    coll = coll[named]
    t = coll["time_s_median"].astype(float).to_numpy()
    nb = coll["bytes"].astype(float).to_numpy()
    world = coll["world_size"].astype(float).to_numpy()
    nodes = coll["nodes"].astype(float).to_numpy()
    per = coll["gpus_per_node"].astype(float).to_numpy()
    ok = np.isfinite(t) & (t > 0) & np.isfinite(nb) & (nb > 0) & (nodes >= 1) & (per >= 1) & (nodes * per == world)
    ok &= world >= 2
    if (~ok).any():
        skipped["collective rows with a non-positive time or size, or world_size != nodes x gpus_per_node"] = int(
            (~ok).sum()
        )
    return coll[ok], skipped


def kernel_timed(rows: pd.DataFrame) -> np.ndarray:
    """Which rows timed the collective kernel alone (:data:`TRANSFER_TIMINGS`)."""
    import numpy as np

    if "timing_method" not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    method = rows["timing_method"].astype(str)
    return np.logical_or.reduce([method.str.contains(t, regex=False).to_numpy() for t in TRANSFER_TIMINGS])


def _arrays(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    import numpy as np

    return {
        "kind": rows["op"].astype(str).to_numpy(),
        "bytes": rows["bytes"].astype(float).to_numpy(),
        "n": rows["world_size"].astype(int).to_numpy(),
        "nodes": rows["nodes"].astype(int).to_numpy(),
        "per": rows["gpus_per_node"].astype(int).to_numpy(),
        "t": rows["time_s_median"].astype(float).to_numpy(),
        "one": np.ones(len(rows)),
    }


def _design(kind: str, a: Mapping[str, np.ndarray], gamma: float, gs: tuple[int, ...]) -> np.ndarray:
    """:func:`design_row` over arrays (one row per call), with one intra-node volume column per g."""
    import numpy as np

    n, nodes, per, nb = a["n"], a["nodes"], a["per"], a["bytes"]
    single = nodes == 1

    kind = op_kind(kind)

    def steps(k: np.ndarray) -> np.ndarray:
        if kind == "send_recv":
            return np.ones(len(k))
        return (2.0 if kind == "all_reduce" else 1.0) * (k - 1)

    factor = np.array([bus_factor(kind, int(k)) for k in n]) if len(n) else np.zeros(0)
    net_factor = (n - per) / n if kind == "all_to_all" else factor
    x = np.zeros((len(n), 3 + len(gs) + 1))
    x[:, 0] = 1.0
    x[:, 1] = np.where(single, steps(n), np.maximum(0.0, steps(n) - steps(nodes)))
    x[:, 2] = np.where(single, 0.0, steps(nodes))
    for j, g in enumerate(gs):
        x[:, 3 + j] = np.where(single & (per == g), factor * nb, 0.0)
    x[:, -1] = np.where(single, 0.0, net_factor * nb / per.astype(float) ** gamma)
    return x


def _robust_nnls(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative coefficients minimising the Huber loss of the relative error (IRLS), and
    that loss's median absolute relative error."""
    import numpy as np
    from scipy.optimize import nnls

    a = x / t[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    w = np.ones(len(t))
    coef = np.zeros(x.shape[1])
    for _ in range(IRLS_ITERATIONS):
        # min |W^1/2 (a c - 1)| over c >= 0, reduced to its k x k Cholesky form (same minimiser)
        aw = a * w[:, None]
        gram = a.T @ aw + 1e-12 * np.eye(a.shape[1])
        upper = np.linalg.cholesky(gram).T
        rhs = np.linalg.solve(upper.T, aw.sum(axis=0))
        sol, _ = nnls(upper, rhs, maxiter=50 * x.shape[1])
        coef = sol / scale
        r = x @ coef / t - 1.0
        mad = 1.4826 * float(np.median(np.abs(r))) or 1e-12
        w = np.minimum(1.0, HUBER_C * mad / np.maximum(np.abs(r), 1e-15))
    r = x @ coef / t - 1.0
    return coef, float(np.median(np.abs(r)))


def fit_law(kind: str, rows: pd.DataFrame) -> CollectiveLaw | None:
    """The law of one kind on one cluster's rows, or None with too few rows or sizes."""
    import numpy as np

    if len(rows) < MIN_ROWS or rows["bytes"].nunique() < 2:
        return None
    a = _arrays(rows)
    single = a["nodes"] == 1
    gs = tuple(sorted({int(g) for g in a["per"][single]}))
    multi_per = {int(g) for g in a["per"][~single]}
    gammas = GAMMA_GRID if len(multi_per) > 1 else (1.0,)
    best: tuple[float, float, np.ndarray] | None = None
    for gamma in gammas:
        x = _design(kind, a, gamma, gs)
        coef, loss = _robust_nnls(x, a["t"])
        if best is None or loss < best[0] - 1e-12:
            best = (loss, gamma, coef)
    assert best is not None
    _, gamma, coef = best
    x = _design(kind, a, gamma, gs)
    used = np.abs(x).sum(axis=0) > 0
    intra = []
    for j, g in enumerate(gs):
        inv = coef[3 + j]
        intra.append((g, 1.0 / inv if inv > 0 else math.inf))
    # A bandwidth that fitted as infinite (its time is all latency) is capped at 1 PB/s: finite JSON.
    intra = [(g, min(bw, 1e15)) for g, bw in intra]
    net = None
    if used[-1]:
        net = min(1.0 / coef[-1], 1e15) if coef[-1] > 0 else 1e15
    topologies = sorted({(int(nd), int(p)) for nd, p in zip(a["nodes"], a["per"])})
    log_ratio = np.log(a["t"] / np.maximum(x @ coef, 1e-300))
    return CollectiveLaw(
        kind=kind,
        base_s=float(coef[0]),
        step_intra_s=float(coef[1]) if used[1] else None,
        step_net_s=float(coef[2]) if used[2] else None,
        intra_bw_bytes_per_s=tuple((g, float(bw)) for g, bw in intra),
        net_bw_bytes_per_s=None if net is None else float(net),
        net_ranks_exponent=float(gamma),
        rows=len(rows),
        kernel_timed=bool(kernel_timed(rows).all()),
        bytes_min=int(a["bytes"].min()),
        bytes_max=int(a["bytes"].max()),
        topologies=tuple(topologies),
        curves=_curves(a, log_ratio),
    )


def _curves(
    a: Mapping[str, np.ndarray], log_ratio: np.ndarray
) -> tuple[tuple[int, int, tuple[tuple[float, float], ...]], ...]:
    """Each measured topology's correction curve: the median of ``log_ratio`` (measured over law)
    per quarter octave of message size (:data:`CURVE_BINS_PER_OCTAVE`), where it has at least
    :data:`CURVE_MIN_SIZES` sizes."""
    import numpy as np

    out = []
    topo = np.stack([a["nodes"], a["per"]], axis=1)
    for nd, g in sorted({(int(n), int(p)) for n, p in topo}):
        mine = (topo[:, 0] == nd) & (topo[:, 1] == g)
        sizes = np.log2(a["bytes"][mine])
        if len(np.unique(sizes)) < CURVE_MIN_SIZES:
            continue
        r = log_ratio[mine]
        bins = np.floor(sizes * CURVE_BINS_PER_OCTAVE + 1e-9)
        points = tuple(
            (float(np.median(sizes[bins == b])), float(np.clip(np.median(r[bins == b]), -CURVE_MAX_LOG, CURVE_MAX_LOG)))
            for b in np.unique(bins)
        )
        out.append((nd, g, points))
    return tuple(out)


def fit_laws(rows: pd.DataFrame) -> dict[str, dict[str, CollectiveLaw]]:
    """cluster -> kind -> law over already-filtered rows (:func:`collective_rows`)."""
    out: dict[str, dict[str, CollectiveLaw]] = {}
    for (cluster, kind), group in rows.groupby([rows["cluster"].astype(str), rows["op"].astype(str)], sort=True):
        law = fit_law(str(kind), group)
        if law is not None:
            out.setdefault(str(cluster), {})[str(kind)] = law
    return out


def fit_collectives(frame: pd.DataFrame, *, held_out: bool = True) -> CollectiveModels | None:
    """Every (cluster, kind) law of ``frame``'s collective rows, the transfer curves and the
    held-out report; None when no collective row names its cluster."""
    rows, skipped = collective_rows(frame)
    if not len(rows):
        return None
    laws = fit_laws(rows)
    if not laws:
        skipped[f"(cluster, kind) groups with fewer than {MIN_ROWS} rows or one message size"] = len(rows)
        return None
    report = tuple(held_out_report(rows)) + tuple(transfer_report(rows)) if held_out else ()
    return CollectiveModels(laws=laws, held_out=report, skipped=skipped, transfer=fit_transfer(rows))


# --------------------------------------------------------------------------- transfer to unmeasured clusters


def cluster_links(cluster: str) -> tuple[float, float, str, int] | None:
    """(intra-node, inter-node) bandwidth per GPU, one direction, the GPU architecture and the GPUs
    of one node (NVLink domain) of catalog ``cluster``; None for a cluster the catalog lacks."""
    from opcast.clusters import cluster_device_name, find_cluster
    from opcast.hardware import get_device

    spec = find_cluster(cluster)
    if spec is None:
        return None
    device = get_device(cluster_device_name(spec))
    return device.intra_node_bw_bytes_per_s, device.inter_node_bw_bytes_per_s, device.architecture, device.gpus_per_node


def _transfer_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows a transfer curve learns from and is scored on: NCCL's (not a custom all-reduce's),
    inside one node, timed as the kernel alone (:func:`kernel_timed`)."""
    one = rows[(rows["nodes"].astype(int) == 1) & ~rows["op"].astype(str).isin(ENGINE_KINDS)]
    return one[kernel_timed(one)]


def _single_node_ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (tier, architecture, kind, per_node, cluster, bytes) of the single-node NCCL
    rows of catalog clusters: the median log(measured / alpha-beta)."""
    import numpy as np
    import pandas as pd

    from opcast.collectives_law import alpha_beta_time_s, link_tier

    one = _transfer_rows(rows)
    parts = []
    for cluster, group in one.groupby(one["cluster"].astype(str), sort=True):
        links = cluster_links(str(cluster))
        if links is None:
            continue
        intra, inter, arch, node_gpus = links
        ab = np.array(
            [
                alpha_beta_time_s(k, b, int(n), 1, int(n), intra, inter)[0]
                for k, b, n in zip(group["op"].astype(str), group["bytes"].astype(float), group["world_size"])
            ]
        )
        parts.append(
            pd.DataFrame(
                {
                    "tier": link_tier(intra),
                    "architecture": arch,
                    "node_gpus": node_gpus,
                    "kind": group["op"].astype(str).to_numpy(),
                    "per_node": group["world_size"].astype(int).to_numpy(),
                    "cluster": str(cluster),
                    "bytes": group["bytes"].astype(float).to_numpy(),
                    "log_ratio": np.log(group["time_s_median"].astype(float).to_numpy() / ab),
                }
            )
        )
    if not parts:
        return pd.DataFrame(
            columns=["tier", "architecture", "node_gpus", "kind", "per_node", "cluster", "bytes", "log_ratio"]
        )
    keys = ["tier", "architecture", "node_gpus", "kind", "per_node", "cluster", "bytes"]
    return pd.concat(parts, ignore_index=True).groupby(keys)["log_ratio"].median().reset_index()


def fit_transfer(rows: pd.DataFrame) -> tuple[TransferCurve, ...]:
    """The transfer curves of the single-node NCCL rows of ``rows`` (see the module docstring)."""
    return _curves_of(_single_node_ratios(rows))


def _curves_of(per_cluster: pd.DataFrame) -> tuple[TransferCurve, ...]:
    """The transfer curves of per-cluster ratios (:func:`_single_node_ratios`)."""
    import numpy as np

    out = []
    for (tier, kind, per), group in per_cluster.groupby(["tier", "kind", "per_node"], sort=True):
        pools: list[tuple[str | None, int | None, pd.DataFrame, int]] = [(None, None, group, TRANSFER_MIN_CLUSTERS)]
        for (a, n), g in group.groupby(["architecture", "node_gpus"], sort=True):
            pools.append((str(a), int(n), g, 1))  # type: ignore[call-overload]
        for arch, node_gpus, pool, least in pools:
            points = []
            clusters: set[str] = set()
            for nbytes, at in pool.groupby("bytes", sort=True):
                if at["cluster"].nunique() >= least:
                    points.append((math.log2(float(nbytes)), float(np.median(at["log_ratio"]))))  # type: ignore[arg-type]
                    clusters |= set(at["cluster"])
            if len(points) >= CURVE_MIN_SIZES:
                out.append(
                    TransferCurve(
                        tier=str(tier),
                        architecture=arch,
                        node_gpus=node_gpus,
                        kind=str(kind),
                        per_node=int(per),  # type: ignore[call-overload]
                        clusters=tuple(sorted(clusters)),
                        points=tuple(points),
                    )
                )
    return tuple(out)


def transfer_time_s(curve: TransferCurve, nbytes: float, intra_bw: float, inter_bw: float) -> float:
    """Seconds of one single-node call of ``curve``'s kind and ranks on links of the given speeds."""
    from opcast.collectives_law import alpha_beta_time_s

    ab, _ = alpha_beta_time_s(curve.kind, nbytes, curve.per_node, 1, curve.per_node, intra_bw, inter_bw)
    return ab * math.exp(curve.correction(nbytes))


def transfer_report(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Leave each catalog cluster out in turn: transfer curves from the others, scored on its
    single-node NCCL rows (split ``transfer``; rows no curve covers are counted not covered)."""
    import numpy as np

    from opcast.collectives_law import alpha_beta_time_s, link_tier

    records: list[dict[str, Any]] = []
    one = _transfer_rows(rows)
    ratios = _single_node_ratios(rows)  # once: each fold drops one cluster's ratios
    for cluster in sorted(set(one["cluster"].astype(str))):
        links = cluster_links(cluster)
        if links is None:
            continue
        mine = (rows["cluster"].astype(str) == cluster).to_numpy()
        models = CollectiveModels(laws={}, transfer=_curves_of(ratios[ratios["cluster"] != cluster]))
        test = one[one["cluster"].astype(str) == cluster]
        for kind, group in test.groupby(test["op"].astype(str), sort=True):
            pred = np.full(len(group), np.nan)
            spec = np.full(len(group), np.nan)
            for i, (b, n) in enumerate(zip(group["bytes"].astype(float), group["world_size"].astype(int))):
                spec[i] = alpha_beta_time_s(str(kind), b, int(n), 1, int(n), links[0], links[1])[0]
                curve = models.transfer_curve(link_tier(links[0]), links[2], links[3], str(kind), int(n))
                if curve is not None:
                    pred[i] = transfer_time_s(curve, b, links[0], links[1])
            others = sorted(set(rows["cluster"].astype(str)[~mine]))
            _score(group, pred, "transfer", cluster, records, f"{len(others)} other clusters")
            _score(group, spec, "alpha-beta", cluster, records, "nothing (the spec sheet)")
    return records


# --------------------------------------------------------------------------- held-out evaluation


def predict_rows(laws: Mapping[str, Mapping[str, CollectiveLaw]], rows: pd.DataFrame) -> np.ndarray:
    """Predicted seconds of each row (NaN where no law covers it)."""
    import numpy as np

    out = np.full(len(rows), np.nan)
    for i, (cluster, kind, b, n, nd, p) in enumerate(
        zip(
            rows["cluster"].astype(str),
            rows["op"].astype(str),
            rows["bytes"].astype(float),
            rows["world_size"].astype(int),
            rows["nodes"].astype(int),
            rows["gpus_per_node"].astype(int),
        )
    ):
        law = laws.get(cluster, {}).get(kind)
        if law is not None and law.covers(nd, p):
            out[i] = law.time_s(b, n, nd, p)
    return out


def size_split(rows: pd.DataFrame) -> np.ndarray:
    """True for the held-out rows: every third distinct message size of each (cluster, kind, topology)."""
    import numpy as np

    held = np.zeros(len(rows), dtype=bool)
    keys = ["cluster", "op", "nodes", "gpus_per_node"]
    pos = np.arange(len(rows))
    for _, g in rows.assign(_pos=pos).groupby([rows[k].astype(str) for k in keys]):
        sizes = sorted(g["bytes"].unique())
        out = {s for i, s in enumerate(sizes) if i % 3 == 2}
        held[g["_pos"].to_numpy()[g["bytes"].isin(out).to_numpy()]] = True
    return held


def _score(
    rows: pd.DataFrame, pred: np.ndarray, split: str, left_out: str, records: list[dict[str, Any]], fitted_on: str
) -> None:
    import numpy as np

    ok = np.isfinite(pred)
    if not ok.any():
        return
    ape = np.abs(pred[ok] / rows["time_s_median"].astype(float).to_numpy()[ok] - 1.0) * 100
    records.append(
        {
            "cluster": str(rows["cluster"].iloc[0]),
            "kind": str(rows["op"].iloc[0]),
            "split": split,
            "held_out": left_out,
            "fitted_on": fitted_on,
            "rows": int(ok.sum()),
            "not_covered": int((~ok).sum()),
            "median_ape": round(float(np.median(ape)), 3),
            "mean_ape": round(float(np.mean(ape)), 3),
        }
    )


def _topo_label(topologies: Iterable[tuple[int, int]]) -> str:
    return " ".join(f"{n}x{g}" for n, g in sorted(topologies)) or "-"


def held_out_report(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Held-out absolute % errors per (cluster, kind): the size split and the topology split(s)."""
    records: list[dict[str, Any]] = []
    for (_cluster, kind), group in rows.groupby([rows["cluster"].astype(str), rows["op"].astype(str)], sort=True):
        group = group.reset_index(drop=True)
        held = size_split(group)
        law = fit_law(str(kind), group[~held])
        if law is not None and held.any():
            sub = group[held]
            _score(sub, _law_predict(law, sub), "sizes", "every 3rd size", records, "the other sizes")
        topo = list(zip(group["nodes"].astype(int), group["gpus_per_node"].astype(int)))
        topologies = sorted(set(topo))
        if len(topologies) < 2:
            continue
        big = group["nodes"].astype(int).to_numpy() > HOLDOUT_MAX_NODES
        if big.any() and (~big).any():
            law = fit_law(str(kind), group[~big])
            if law is not None:
                sub = group[big]
                fitted = {t for t, b in zip(topo, big) if not b}
                left = {t for t, b in zip(topo, big) if b}
                _score(sub, _law_predict(law, sub), "topology", _topo_label(left), records, _topo_label(fitted))
            continue
        for t in topologies:
            mask = [x == t for x in topo]
            import numpy as np

            m = np.array(mask)
            law = fit_law(str(kind), group[~m])
            if law is not None:
                _score(
                    group[m],
                    _law_predict(law, group[m]),
                    "topology",
                    _topo_label([t]),
                    records,
                    _topo_label(set(topologies) - {t}),
                )
    return records


def _law_predict(law: CollectiveLaw, rows: pd.DataFrame) -> np.ndarray:
    import numpy as np

    out = np.full(len(rows), np.nan)
    for i, (b, n, nd, p) in enumerate(
        zip(
            rows["bytes"].astype(float),
            rows["world_size"].astype(int),
            rows["nodes"].astype(int),
            rows["gpus_per_node"].astype(int),
        )
    ):
        if law.covers(nd, p):
            out[i] = law.time_s(b, n, nd, p)
    return out


def summary(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (cluster, kind, split): held-out rows and their median / mean APE pooled over the
    split's folds (row-weighted mean; median of the fold medians)."""
    import statistics

    pooled: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        pooled.setdefault((r["cluster"], r["kind"], r["split"]), []).append(r)
    out = []
    for (cluster, kind, split), rs in sorted(pooled.items()):
        n = sum(r["rows"] for r in rs)
        out.append(
            {
                "cluster": cluster,
                "kind": kind,
                "split": split,
                "folds": len(rs),
                "rows": n,
                "median_ape": round(statistics.median(r["median_ape"] for r in rs), 2),
                "mean_ape": round(sum(r["mean_ape"] * r["rows"] for r in rs) / n, 2),
            }
        )
    return out


# --------------------------------------------------------------------------- JSON


def law_to_dict(law: CollectiveLaw) -> dict[str, Any]:
    return {
        "base_s": law.base_s,
        "step_intra_s": law.step_intra_s,
        "step_net_s": law.step_net_s,
        "intra_bw_bytes_per_s": [[g, bw] for g, bw in law.intra_bw_bytes_per_s],
        "net_bw_bytes_per_s": law.net_bw_bytes_per_s,
        "net_ranks_exponent": law.net_ranks_exponent,
        "rows": law.rows,
        "bytes_min": law.bytes_min,
        "bytes_max": law.bytes_max,
        "topologies": [[n, g] for n, g in law.topologies],
        **({"kernel_timed": True} if law.kernel_timed else {}),
        **({"curves": [[n, g, [list(p) for p in pts]] for n, g, pts in law.curves]} if law.curves else {}),
    }


def law_from_dict(kind: str, data: Mapping[str, Any]) -> CollectiveLaw:
    """A law from its already validated JSON object (:func:`opcast.train.artifacts.check_collectives`)."""
    return CollectiveLaw(
        kind=kind,
        base_s=float(data["base_s"]),
        step_intra_s=None if data["step_intra_s"] is None else float(data["step_intra_s"]),
        step_net_s=None if data["step_net_s"] is None else float(data["step_net_s"]),
        intra_bw_bytes_per_s=tuple((int(g), float(bw)) for g, bw in data["intra_bw_bytes_per_s"]),
        net_bw_bytes_per_s=None if data["net_bw_bytes_per_s"] is None else float(data["net_bw_bytes_per_s"]),
        net_ranks_exponent=float(data["net_ranks_exponent"]),
        rows=int(data["rows"]),
        bytes_min=int(data["bytes_min"]),
        bytes_max=int(data["bytes_max"]),
        topologies=tuple((int(n), int(g)) for n, g in data["topologies"]),
        kernel_timed=bool(data.get("kernel_timed", False)),
        curves=tuple(
            (int(n), int(g), tuple((float(x), float(y)) for x, y in pts)) for n, g, pts in data.get("curves", ())
        ),
    )


def models_to_dict(models: CollectiveModels) -> dict[str, Any]:
    """The ``collectives.json`` body (without the binding to its set, which the writer adds)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "clusters": {
            c: {k: law_to_dict(law) for k, law in sorted(kinds.items())} for c, kinds in sorted(models.laws.items())
        },
        "held_out": [dict(r) for r in models.held_out],
        "skipped": dict(models.skipped),
        **({"transfer": [transfer_to_dict(c) for c in models.transfer]} if models.transfer else {}),
    }


def transfer_to_dict(curve: TransferCurve) -> dict[str, Any]:
    return {
        "tier": curve.tier,
        "architecture": curve.architecture,
        "node_gpus": curve.node_gpus,
        "kind": curve.kind,
        "per_node": curve.per_node,
        "clusters": list(curve.clusters),
        "points": [list(p) for p in curve.points],
    }


def transfer_from_dict(data: Mapping[str, Any]) -> TransferCurve:
    """A transfer curve from its already validated JSON object."""
    return TransferCurve(
        tier=str(data["tier"]),
        architecture=None if data["architecture"] is None else str(data["architecture"]),
        node_gpus=None if data["node_gpus"] is None else int(data["node_gpus"]),
        kind=str(data["kind"]),
        per_node=int(data["per_node"]),
        clusters=tuple(str(c) for c in data["clusters"]),
        points=tuple((float(x), float(y)) for x, y in data["points"]),
    )


def models_from_dict(data: Mapping[str, Any]) -> CollectiveModels:
    """Models from a validated ``collectives.json`` body."""
    return CollectiveModels(
        laws={c: {k: law_from_dict(k, law) for k, law in kinds.items()} for c, kinds in data["clusters"].items()},
        held_out=tuple(data.get("held_out", ())),
        skipped=dict(data.get("skipped", {})),
        transfer=tuple(transfer_from_dict(c) for c in data.get("transfer", ())),
    )


# --------------------------------------------------------------------------- train fit


def fit_datasets(datasets: Iterable[str | Any]) -> tuple[CollectiveModels | None, bool]:
    """The laws of every cluster-tagged collective row in ``datasets`` (None: there are none),
    and whether the datasets hold any other (kernel) row."""
    from opcast.schema import read_dataset

    frame = read_dataset(list(datasets))
    return fit_collectives(frame), bool((~frame["op"].isin(OP_KINDS)).any())


def write_collectives_only_set(
    out: Any, name: str, datasets: Iterable[Any], command: str, collectives: CollectiveModels | None = None
) -> Any:
    """A model set with no kernel predictors (the data held only collectives): meta.json for
    the collective laws to bind to, and those laws (``collectives``) in the same atomic write.
    Returns its folder."""
    import time
    from pathlib import Path

    from opcast.train.artifacts import write_model_set
    from opcast.train.fit import dataset_records, portable_command

    meta = {
        "command": portable_command(command),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "datasets": dataset_records(list(datasets)),
        "rows": 0,
        "skipped": {"kernels": "the datasets hold only collectives: this set prices collectives only"},
    }
    return write_model_set(Path(out), name, {}, meta, collectives=collectives)
