"""A fitted xgboost ensemble as flat numpy arrays, evaluated without importing xgboost.

``predict`` is a hot path that prices a few hundred distinct kernels per configuration; paying
~1 s for ``import xgboost`` (and its native library) before the first one would dominate it.
The trees of a ``reg:squarederror`` booster are plain binary trees over float32 features:
node ``i`` sends a row left when ``x[split_indices[i]] < split_conditions[i]`` and, for a
missing (NaN) value, to the side ``default_left[i]`` says; a leaf's value is its
``split_conditions`` entry; the margin is ``base_score + sum of the leaves reached`` (xgboost's
JSON model schema, ``doc/model.schema`` of the xgboost repository). Trees are padded to one node
count, leaves point at themselves, so every row walks ``depth`` steps in lock-step over all
trees at once — vectorised numpy, exact to float32 rounding of xgboost's own sum.

It pays off for small and medium batches; for very large ones (tens of thousands of rows times
hundreds of trees) xgboost's C++ predictor is faster once it is imported, and
:class:`~opcast.train.estimators.xgb_predictor.XGBPredictor` switches to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from opcast.errors import OpcastError
from opcast.train.estimators import require_arrays

_CHUNK_CELLS = 1 << 20
"""Rows x trees evaluated at once (int32 node indices: 4 MB per array)."""


@dataclass(frozen=True, eq=False)
class TreeArrays:
    """Padded, flattened trees: arrays of shape (n_trees * max_nodes,), global node indices."""

    left: np.ndarray  # int32, next node when going left (a leaf points at itself)
    right: np.ndarray  # int32
    feature: np.ndarray  # int32, split feature (0 at leaves)
    threshold: np.ndarray  # float32, split condition
    default_left: np.ndarray  # bool, where a NaN goes
    value: np.ndarray  # float32, leaf value (0 at inner nodes)
    n_trees: int
    max_nodes: int
    depth: int
    base_score: float

    def to_arrays(self) -> dict[str, np.ndarray]:
        """What :func:`numpy.savez` stores (see :meth:`from_arrays`)."""
        return {
            "tree_left": self.left,
            "tree_right": self.right,
            "tree_feature": self.feature,
            "tree_threshold": self.threshold,
            "tree_default_left": self.default_left,
            "tree_value": self.value,
            "tree_shape": np.array([self.n_trees, self.max_nodes, self.depth], dtype=np.int64),
            "tree_base_score": np.array([self.base_score], dtype=np.float64),
        }

    @classmethod
    def from_arrays(cls, arrays: Any, *, path: Any = "trees", n_features: int | None = None) -> TreeArrays:
        """Rebuild from :meth:`to_arrays`' output. Read from a file (``path``), every array is
        checked first (dtype, length, node and feature indices in range), so a corrupt file is a
        one-line :class:`OpcastError`, never an index error in the middle of a prediction."""
        kinds = {
            "tree_left": "iu",
            "tree_right": "iu",
            "tree_feature": "iu",
            "tree_threshold": "f",
            "tree_default_left": "b",
            "tree_value": "f",
            "tree_shape": "iu",
            "tree_base_score": "f",
        }
        require_arrays(arrays, kinds, path)
        shape, base = arrays["tree_shape"], arrays["tree_base_score"]
        if shape.shape != (3,) or base.shape != (1,) or not np.isfinite(base).all():
            raise OpcastError(
                f"{path}: tree_shape or tree_base_score has the wrong shape; re-fit with opcast train fit"
            )
        n_trees, max_nodes, depth = (int(v) for v in shape)
        size = n_trees * max_nodes
        if n_trees < 0 or max_nodes < 1 or not 0 <= depth <= max_nodes:
            raise OpcastError(f"{path}: tree_shape {shape.tolist()} is impossible; re-fit with opcast train fit")
        for name in ("tree_left", "tree_right", "tree_feature", "tree_threshold", "tree_default_left", "tree_value"):
            if arrays[name].shape != (size,):
                raise OpcastError(
                    f"{path}: {name} holds {arrays[name].shape} values, not {n_trees} x {max_nodes}; "
                    "re-fit with opcast train fit"
                )
        for name in ("tree_left", "tree_right"):
            if size and not 0 <= int(arrays[name].min()) <= int(arrays[name].max()) < size:
                raise OpcastError(f"{path}: {name} points outside the trees; re-fit with opcast train fit")
        limit = n_features if n_features is not None else np.iinfo(np.int32).max
        if size and not 0 <= int(arrays["tree_feature"].min()) <= int(arrays["tree_feature"].max()) < limit:
            raise OpcastError(
                f"{path}: tree_feature names a feature outside the {limit} it was fitted on; "
                "re-fit with opcast train fit"
            )
        as32 = {k: np.ascontiguousarray(arrays[k], dtype=np.int32) for k in ("tree_left", "tree_right", "tree_feature")}
        return cls(
            left=as32["tree_left"],
            right=as32["tree_right"],
            feature=as32["tree_feature"],
            threshold=arrays["tree_threshold"],
            default_left=arrays["tree_default_left"],
            value=arrays["tree_value"],
            n_trees=n_trees,
            max_nodes=max_nodes,
            depth=depth,
            base_score=float(base[0]),
        )

    def margin(self, x: np.ndarray) -> np.ndarray:
        """The booster's raw output (``output_margin``) for every row of ``x`` (n_rows, n_features)."""
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        n, n_feat = x32.shape
        out = np.full(n, self.base_score, dtype=np.float64)
        if n == 0 or self.n_trees == 0:
            return out
        roots = (np.arange(self.n_trees, dtype=np.int32) * self.max_nodes)[None, :]
        step = max(1, _CHUNK_CELLS // self.n_trees)
        has_nan = bool(np.isnan(x32).any())
        for start in range(0, n, step):
            xc = x32[start : start + step]
            flat = xc.ravel()
            row_base = (np.arange(len(xc), dtype=np.int32) * n_feat)[:, None]
            node = np.broadcast_to(roots, (len(xc), self.n_trees)).copy()
            for _ in range(self.depth):
                v = flat[row_base + self.feature[node]]
                go_left = v < self.threshold[node]
                if has_nan:
                    missing = np.isnan(v)
                    go_left = np.where(missing, self.default_left[node], go_left)
                node = np.where(go_left, self.left[node], self.right[node])
            out[start : start + step] += self.value[node].sum(axis=1, dtype=np.float64)
        return out


def trees_from_booster(booster: Any) -> TreeArrays:
    """Flatten an ``xgboost.Booster`` (``reg:squarederror``, numerical splits) via its JSON model."""
    model = json.loads(bytes(booster.save_raw(raw_format="json")))
    learner = model["learner"]
    objective = learner["objective"]["name"]
    if objective != "reg:squarederror":
        raise ValueError(f"numpy trees support reg:squarederror only, not {objective}")
    base = learner["learner_model_param"]["base_score"].strip("[]")
    trees = learner["gradient_booster"]["model"]["trees"]
    n_trees = len(trees)
    max_nodes = max((len(t["left_children"]) for t in trees), default=1)
    size = n_trees * max_nodes
    left = np.zeros(size, dtype=np.int32)
    right = np.zeros(size, dtype=np.int32)
    feature = np.zeros(size, dtype=np.int32)
    threshold = np.zeros(size, dtype=np.float32)
    default_left = np.zeros(size, dtype=bool)
    value = np.zeros(size, dtype=np.float32)
    depth = 0
    for t, tree in enumerate(trees):
        if any(int(s) != 0 for s in tree.get("split_type", ())):
            raise ValueError("numpy trees support numerical splits only")
        off = t * max_nodes
        lc = np.asarray(tree["left_children"], dtype=np.int64)
        rc = np.asarray(tree["right_children"], dtype=np.int64)
        cond = np.asarray(tree["split_conditions"], dtype=np.float32)
        k = len(lc)
        ids = np.arange(k)
        leaf = lc < 0
        sl = slice(off, off + k)
        left[sl] = np.where(leaf, ids, lc) + off
        right[sl] = np.where(leaf, ids, rc) + off
        feature[sl] = np.where(leaf, 0, np.asarray(tree["split_indices"], dtype=np.int64))
        threshold[sl] = np.where(leaf, np.float32(0), cond)
        default_left[sl] = np.asarray(tree["default_left"], dtype=bool) & ~leaf
        value[sl] = np.where(leaf, cond, np.float32(0))
        depth = max(depth, _depth(lc, rc))
        left[off + k : off + max_nodes] = np.arange(off + k, off + max_nodes)  # padding: self loops, never reached
        right[off + k : off + max_nodes] = np.arange(off + k, off + max_nodes)
    return TreeArrays(
        left=left,
        right=right,
        feature=feature,
        threshold=threshold,
        default_left=default_left,
        value=value,
        n_trees=n_trees,
        max_nodes=max_nodes,
        depth=depth,
        base_score=float(base),
    )


def _depth(left: np.ndarray, right: np.ndarray) -> int:
    """Edges on the longest root-to-leaf path."""
    level, frontier = 0, [0]
    while True:
        nxt = [c for i in frontier for c in (left[i], right[i]) if c >= 0]
        if not nxt:
            return level
        frontier = nxt
        level += 1
