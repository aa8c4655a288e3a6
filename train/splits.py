"""Honest splits: rows grouped by shape (the same op configuration on every device is one
group) and by whole device, so that no held-out score is computed on a shape or a GPU the
model has seen."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd


def shape_groups(frame: pd.DataFrame) -> np.ndarray:
    """One id per op configuration (``point_id``: op, parameters, dtype, direction, tensor
    cores), identical across devices."""
    if "point_id" in frame.columns and frame["point_id"].notna().all():
        return frame["point_id"].astype(str).to_numpy()
    from opcast.schema import _row_point_id

    return np.array([_row_point_id(r) for r in frame.to_dict("records")], dtype=object)


def seeded_draw(names: list[str] | np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per name from a seeded hash of the name alone: a draw in which
    each name's fate never depends on which other names are present."""
    salt = str(seed).encode()
    digests = (hashlib.blake2b(salt + str(g).encode(), digest_size=8).digest() for g in names)
    return np.array([int.from_bytes(d, "little") / 2**64 for d in digests])


def grouped_mask(groups: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """True for the rows of about ``fraction`` of the distinct ``groups``, chosen by a seeded
    hash of the group id (stable when rows are added or reordered)."""
    uniq, inverse = np.unique(np.asarray(groups, dtype=str), return_inverse=True)
    return (seeded_draw(uniq, seed) < fraction)[inverse]


def leave_one_group_out(groups: np.ndarray) -> list[tuple[object, np.ndarray]]:
    """(group, True on its rows) for every distinct group of ``groups`` in sorted order: the test
    side of scikit-learn's ``LeaveOneGroupOut`` (the training side is the complement); empty
    with fewer than two groups, where leaving one out leaves nothing to train on."""
    from sklearn.model_selection import LeaveOneGroupOut

    groups = np.asarray(groups)
    if len(np.unique(groups)) < 2:
        return []
    out = []
    for _, test in LeaveOneGroupOut().split(groups, groups=groups):
        rows = np.zeros(len(groups), dtype=bool)
        rows[test] = True
        out.append((groups[test[0]], rows))
    return out
