"""NeuSight's tile-level predictor (Lee et al., ASPLOS'25, arXiv 2407.13853) as the public code
builds it (sitar-lab/NeuSight, MIT, commit 6945927): its file format and its numpy forward pass.
:mod:`opcast.train.estimators.neusight` fits it.

What it reproduces (paths in sitar-lab/NeuSight):

- **Tiles** (``neusight/Model/mlp_wave_mm.py`` ``get_tiles`` l.49-63, ``neusight/Dataset/dataset.py``
  ``read_tile`` l.46-85). A GEMM's tile is the profiled cuBLAS kernel's threadblock tile, read from
  its name (``sgemm_128x64``, ``tilesize128x64``, AMD ``_mt128x64``): the first number tiles the
  cuBLAS (column-major) ``m``, i.e. our output columns ``n``, the second our output rows ``m``; a
  tile spans the whole reduction (NeuSight's ``tn = N``). Training uses the measured tile of every
  row, and so does NeuSight's kernel-level test (``Trainer.test`` passes the test rows' tiles,
  ``neusight/Model/trainer.py`` l.158-162). Without a profile (its end-to-end predictor) the tile
  is that of the *nearest training row*, plain Euclidean distance over the raw
  ``B, M, N, K, Num_Sm, SingleFLOPs, Dev_Mem, Mem_Bw, L2Cache`` (``neusight/Model/meta.py``
  ``closest_point``/``get_tile`` l.19-53): NeuSight enumerates no candidate tiles. LayerNorm and
  softmax give one row per block (tile = H); pointwise kernels take ``2**ceil(log2(B*H/grid))``
  elements per block, 512 for PyTorch's fp32 ``vectorized_elementwise_kernel``.
- **Waves** (``mlp_wave.py`` ``compute_wave_time`` l.289-315): ``blocks = B * ceil(M/tm) *
  ceil(K/tk)`` (GEMM, ``mlp_wave_mm.py`` l.36-47) or ``B * ceil(H/tile)`` (vector,
  ``mlp_wave_vec.py`` l.35-42); ``waves = ceil(blocks / Num_Sm)``.
- **Per-wave time** (``mlp_wave.py`` ``compute_eff_bw`` l.194-240): ``ops_per_wave = Num_Sm x
  tile FLOPs`` (GFLOP) over an effective rate ``roofline x utilisation``, where ``roofline =
  min(SingleFLOPs, op_intensity x Mem_Bw)`` of the whole op (GEMM intensity: ``2 ceil(M,tm) N
  ceil(K,tk) / (4 (MN + NK + MK))``, batch left out; vector: ``OpsPerO ceil(H,tile) / (MemPerO
  H)``). ``time = waves x ops_per_wave / (roofline x utilisation)``.
- **Utilisation** (``mlp_wave.py`` ``compute_bw_util`` l.242-266): an MLP (``MLPBlock`` l.8-35:
  ``num_layers`` Linear layers of ``hidden_size``, ReLU, no output activation, 3 outputs alpha,
  beta, gamma) reads ``log2`` of ``[tile FLOPs / (SingleFLOPs/Num_Sm), tile bytes /
  (Mem_Bw/Num_Sm), waves x tile bytes / (Dev_Mem/Num_Sm), waves x tile bytes / (L2Cache/Num_Sm)]``
  in NeuSight's units (GFLOP, TFLOPS, MB, GB/s, MB, KB); ``utilisation = sigmoid(gamma) -
  sigmoid(alpha) / waves`` (beta unused).

Where opcast's data force a difference (each said where it applies):

- ``Dev_Mem`` (memory size) is not in opcast's feature frame, so the MLP reads three inputs, not
  four, and the nearest-tile distance omits it. Its input was ``log2(waves x tile bytes)`` less a
  per-GPU constant, which is the L2 input less another per-GPU constant.
- NeuSight trains bmm and linear apart; opcast's ``gemm`` group pools them.
- A utilisation at or below 0 (NeuSight's formula allows it; its time is then negative) is
  floored at :data:`UTIL_FLOOR`.
- Backward rows (NeuSight's kernel models are forward-only): a GEMM's backward is its two
  GEMMs (dA = dC B^T, dB = A^T dC) summed; vector rows read their ops and bytes per output
  element from the registry's formulas (the frame's ``flops``/``bytes``).

A plain matrix (scikit-learn's own checks) feeds its columns to the MLP as they are, one wave,
a 1 s roofline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

import numpy as np

from opcast.errors import OpcastError
from opcast.train.estimators import (
    RECORD_KEY,
    PredictorBase,
    checked_layers,
    layer_arrays,
    parse_record,
    read_arrays,
    record_array,
    require_arrays,
)
from opcast.train.features import GEMM_TILES, VECTOR_TILE_BYTES, matrix

if TYPE_CHECKING:  # pandas stays off the predict path: a model set passes a features Table
    import pandas as pd

    from opcast.train.features import Table

UTIL_FLOOR: Final = 1e-3
MODES: Final = ("mm", "vec", "row", "plain")
"""How a group's rows map to NeuSight's kernel models: ``mm`` (MLPWaveMM: GEMM), ``vec``
(MLPWaveVec, pointwise), ``row`` (MLPWaveVec with tile = H: layernorm, softmax and the other
row-wise kinds), ``plain`` (a plain matrix, no kernel model)."""
MEASURED_TILE_COLUMNS: Final = ("measured_tile_m", "measured_tile_n", "measured_tile_elems")
"""Optional frame columns holding the profiled kernel's tile (:func:`measured_tiles`): GEMM
output rows and columns per block, pointwise elements per block. Where present and finite they
are used (NeuSight's protocol); elsewhere the tile is looked up (:meth:`NeuSightPredictor._gemm_tile`)."""
KEY_COLUMNS: Final = ("B", "M", "N", "K", "Num_Sm", "SingleFLOPs", "Mem_Bw", "L2Cache")
"""The nearest-tile key, NeuSight's MetaTable features in its units (less Dev_Mem), NeuSight's
M x K output and N reduction: our b, m, k, n, SMs, GFLOP/s, GB/s, MB."""
_SHAPE_COLUMNS: Final = {
    "mm": ("log_b", "log_m", "log_n", "log_k"),
    "vec": ("log_numel",),
    "row": (),
}
_DEVICE_COLUMNS: Final = ("log_peak_flops", "log_mem_bw_bytes_per_s", "log_sm_count", "log_l2_bytes", "dtype_bytes")
_NN_CHUNK: Final = 2048


def mode_of(feature_names: tuple[str, ...] | None) -> str:
    """The kernel model of a group from its declared features (None: a plain matrix)."""
    if feature_names is None:
        return "plain"
    names = set(feature_names)
    if {"log_m", "log_n", "log_k"} <= names:
        return "mm"
    if {"log_rows", "log_cols"} <= names or {"log_tokens", "log_vocab"} <= names:
        return "row"
    if "log_numel" in names:
        return "vec"
    raise OpcastError(
        "neusight models GEMMs, pointwise and row-wise kernels only (features with m/n/k, numel or rows/cols); "
        "use --estimator xgb for this op"
    )


# --------------------------------------------------------------------------- tiles and waves


def gemm_blocks(b: Any, m: Any, n: Any, tile_m: Any, tile_n: Any) -> np.ndarray:
    """Thread blocks of ``b`` GEMMs with an ``m x n`` output in ``tile_m x tile_n`` tiles
    (NeuSight's ``compute_num_block``: each block spans the whole reduction)."""
    return np.asarray(b, dtype=float) * np.ceil(np.asarray(m) / tile_m) * np.ceil(np.asarray(n) / tile_n)


def num_waves(blocks: Any, sm_count: Any) -> np.ndarray:
    """Waves of ``blocks`` over ``sm_count`` SMs, one block per SM at a time: ``ceil(blocks / SMs)``."""
    return np.ceil(np.asarray(blocks, dtype=float) / np.asarray(sm_count, dtype=float))


def vector_tile(numel: Any, dtype_bytes: Any) -> np.ndarray:
    """Elements per block of a pointwise kernel, NeuSight's ``2 ** ceil(log2(B*H / grid))``, with
    PyTorch's grid of ``ceil(numel / (128 threads x 16 bytes / dtype))`` blocks (512 fp32
    elements a block; fewer, rounded up to a power of two, for a tensor smaller than a block)."""
    numel = np.maximum(np.asarray(numel, dtype=float), 1.0)
    grid = np.ceil(numel / (VECTOR_TILE_BYTES / np.asarray(dtype_bytes, dtype=float)))
    return 2.0 ** np.ceil(np.log2(numel / grid))


def heuristic_gemm_tile(b: Any, m: Any, n: Any, sm_count: Any) -> tuple[np.ndarray, np.ndarray]:
    """(tile rows, tile cols) when neither a profile nor a nearest training row gives one: the
    largest of :data:`~opcast.train.features.GEMM_TILES` that still fills one wave, else the
    smallest (the rule of opcast's tile features)."""
    b, m, n = (np.asarray(a, dtype=float) for a in (b, m, n))
    tm, tn = np.full(m.shape, np.nan), np.full(m.shape, np.nan)
    todo = np.ones(m.shape, dtype=bool)
    for i, (rows, cols) in enumerate(GEMM_TILES):
        take = todo & ((gemm_blocks(b, m, n, rows, cols) >= sm_count) | (i == len(GEMM_TILES) - 1))
        tm[take], tn[take] = rows, cols
        todo &= ~take
    return tm, tn


def nearest_tiles(query: np.ndarray, keys: np.ndarray, tiles: np.ndarray) -> np.ndarray:
    """The tile of the nearest key (plain Euclidean distance over the raw values, NeuSight's
    ``MetaTable.closest_point``) of every query row; ties go to the first key."""
    out = np.empty((len(query), tiles.shape[1]))
    k2 = np.einsum("ij,ij->i", keys, keys)
    for start in range(0, len(query), _NN_CHUNK):
        q = query[start : start + _NN_CHUNK]
        d = k2[None, :] - 2.0 * q @ keys.T  # |q|^2 is the same for every key of a row
        out[start : start + len(q)] = tiles[np.argmin(d, axis=1)]
    return out


# --------------------------------------------------------------------------- kernels of rows


def _col(feats: Any, name: str, n: int) -> np.ndarray:
    return feats[name].to_numpy(dtype=float) if name in feats.columns else np.full(n, np.nan)


def _dims(feats: Any, names: tuple[str, ...], n: int) -> list[np.ndarray]:
    return [np.round(np.exp(_col(feats, c, n))) for c in names]


class NeuSightPredictor(PredictorBase):
    """The fitted utilisation MLP of one op group (and its nearest-tile table for GEMMs)."""

    name = "neusight"
    suffix = ".npz"
    """numpy archive: the MLP's layers, the mode, the nearest-tile table."""

    # Set by fit or load.
    mode_: str
    weights_: list[tuple[np.ndarray, np.ndarray]]
    tile_keys_: np.ndarray
    tile_table_: np.ndarray

    # ------------------------------------------------------------------ kernels

    def _gemm_tile(self, key: np.ndarray, b: np.ndarray, m: np.ndarray, n: np.ndarray, sms: np.ndarray) -> np.ndarray:
        """(tile rows, tile cols) of GEMMs with no profiled tile: the nearest training row's, or
        the heuristic when the fit saw no profiled tiles."""
        if len(getattr(self, "tile_keys_", ())):
            return nearest_tiles(key, self.tile_keys_, self.tile_table_)
        return np.column_stack(heuristic_gemm_tile(b, m, n, sms))

    def _kernels(self, feats: pd.DataFrame | Table | None, x: np.ndarray) -> dict[str, np.ndarray]:
        """The NeuSight kernels of every row: ``row`` (the frame row each kernel belongs to: a
        GEMM backward row has two), ``waves``, ``ops_per_wave`` (GFLOP), ``roof`` (GFLOP/s),
        ``inputs`` (the MLP's input matrix), and for GEMMs ``key``/``tile`` (the nearest-tile key
        and the tile used) and ``part`` (0 the forward GEMM, 1 and 2 a backward row's dA and dB)."""
        n = len(x)
        mode = getattr(self, "mode_", "plain")
        if feats is None or mode == "plain":
            return {
                "row": np.arange(n),
                "waves": np.ones(n),
                "ops_per_wave": np.ones(n),
                "roof": np.ones(n),
                "inputs": x,
            }
        peak = np.exp(_col(feats, "log_peak_flops", n)) / 1e9  # GFLOP/s
        bw = np.exp(_col(feats, "log_mem_bw_bytes_per_s", n)) / 1e9  # GB/s
        sms = np.round(np.exp(_col(feats, "log_sm_count", n)))
        l2_mb = np.exp(_col(feats, "log_l2_bytes", n)) / 2**20
        dt = _col(feats, "dtype_bytes", n)
        flops, moved = _col(feats, "flops", n), _col(feats, "bytes", n)
        if mode == "mm":
            b, m, nn, k = _dims(feats, _SHAPE_COLUMNS["mm"], n)
            bwd = flops > 3.0 * b * m * nn * k  # forward 2bmnk FLOPs, backward 4bmnk
            rows = [np.flatnonzero(~bwd), np.flatnonzero(bwd), np.flatnonzero(bwd)]
            # (batch, out rows, out cols, reduction) of C = A B, and of dA = dC B^T, dB = A^T dC
            parts = [(b, m, nn, k), (b, m, k, nn), (b, k, nn, m)]
            measured = [(_col(feats, "measured_tile_m", n), _col(feats, "measured_tile_n", n)), None, None]
            out: dict[str, list[np.ndarray]] = {key: [] for key in ("row", "b", "m", "n", "k", "tile", "key", "part")}
            for part, (idx, (pb, pm, pn, pk), meas) in enumerate(zip(rows, parts, measured)):
                pb, pm, pn, pk = pb[idx], pm[idx], pn[idx], pk[idx]
                key = np.column_stack([pb, pm, pk, pn, sms[idx], peak[idx], bw[idx], l2_mb[idx]])
                tile = np.full((len(idx), 2), np.nan)
                if meas is not None:
                    tile = np.column_stack([meas[0][idx], meas[1][idx]])
                todo = ~np.isfinite(tile).all(axis=1) | (tile <= 0).any(axis=1)
                if todo.any():
                    tile[todo] = self._gemm_tile(key[todo], pb[todo], pm[todo], pn[todo], sms[idx][todo])
                for name, val in zip(out, (idx, pb, pm, pn, pk, tile, key, np.full(len(idx), part))):
                    out[name].append(val)
            cat = {name: np.concatenate(v) for name, v in out.items()}
            r = cat["row"]
            tm, tn = cat["tile"][:, 0], cat["tile"][:, 1]
            gb, gm, gn, gk, dtr = cat["b"], cat["m"], cat["n"], cat["k"], dt[r]
            waves = num_waves(gemm_blocks(gb, gm, gn, tm, tn), sms[r])
            # NeuSight's M x K output, N reduction (mlp_wave_mm.py): ours m x n, reducing k
            op_flops = 2.0 * np.ceil(gm / tm) * tm * gk * np.ceil(gn / tn) * tn / 1e9
            op_mem = dtr * (gm * gk + gk * gn + gm * gn) / 2**30
            tile_flops = 2.0 * tm * gk * tn / 1e9
            tile_mb = dtr * (tm * gk + gk * tn + tm * tn) / 2**20
            roof = np.minimum(peak[r], op_flops / op_mem * bw[r])
            extra = {"key": cat["key"], "tile": cat["tile"], "part": cat["part"]}
        else:
            if mode == "row":
                rows_, cols_ = (
                    _dims(feats, ("log_rows", "log_cols"), n)
                    if "log_rows" in feats.columns
                    else _dims(feats, ("log_tokens", "log_vocab"), n)
                )
                tile = cols_  # one row per block (read_tile: ln, softmax -> [H, 0])
                numel = rows_ * cols_
                blocks = rows_
            else:
                (numel,) = _dims(feats, _SHAPE_COLUMNS["vec"], n)
                tile = _col(feats, "measured_tile_elems", n)
                tile = np.where(np.isfinite(tile) & (tile > 0), tile, vector_tile(numel, dt))
                blocks = np.ceil(numel / tile)
            ops_per = np.maximum(flops / numel, 1.0)  # OpsPerO (NeuSight: 1 pointwise, 5 softmax, 6 ln)
            mem_per = moved / numel  # MemPerO, bytes per output element
            r = np.arange(n)
            waves = num_waves(blocks, sms)
            # op intensity: OpsPerO ceil(H, tile) / (MemPerO H); with B*H = numel as one row
            op_flops = ops_per * np.ceil(numel / tile) * tile / 1e9
            op_mem = mem_per * numel / 2**30
            tile_flops = ops_per * tile / 1e9
            tile_mb = mem_per * tile / 2**20
            roof = np.minimum(peak, op_flops / op_mem * bw)
            extra = {}
        with np.errstate(divide="ignore", invalid="ignore"):
            # NeuSight's norm_bw_vec: TFLOP/s, GB/s and KB per SM (mlp_wave.py l.211-212), Dev_Mem left out
            inputs = np.log2(
                np.column_stack(
                    [
                        tile_flops / (peak[r] / 1000.0 / sms[r]),
                        tile_mb / (bw[r] / sms[r]),
                        waves * tile_mb / (l2_mb[r] * 1024.0 / sms[r]),
                    ]
                )
            )
        return {"row": r, "waves": waves, "ops_per_wave": sms[r] * tile_flops, "roof": roof, "inputs": inputs, **extra}

    # ------------------------------------------------------------------ predicting

    def _forward(self, inputs: np.ndarray) -> np.ndarray:
        h = np.nan_to_num(inputs, nan=0.0, posinf=60.0, neginf=-60.0)
        for i, (w, b) in enumerate(self.weights_):
            h = h @ w.T + b
            if i < len(self.weights_) - 1:
                h = np.maximum(h, 0.0)
        return h

    def _utilisation(self, out: np.ndarray, waves: np.ndarray) -> np.ndarray:
        alpha = 1.0 / (1.0 + np.exp(-np.clip(out[:, 0], -60, 60)))
        gamma = 1.0 / (1.0 + np.exp(-np.clip(out[:, 2], -60, 60)))
        return np.maximum(gamma - alpha / waves, UTIL_FLOOR)

    def _seconds_of(self, kernels: Mapping[str, np.ndarray], n_rows: int) -> np.ndarray:
        util = self._utilisation(self._forward(kernels["inputs"]), kernels["waves"])
        t = kernels["waves"] * kernels["ops_per_wave"] / (kernels["roof"] * util)
        out = np.zeros(n_rows)
        np.add.at(out, kernels["row"], t)
        return out

    def predict_s(self, feats: pd.DataFrame | Table) -> np.ndarray:
        """Predicted seconds of every row of a feature frame or Table (NaN where a spec or shape is missing)."""
        assert self.feature_names is not None  # a predictor of a model set always names its inputs
        x = matrix(feats, self.feature_names)
        return self._seconds(x, self._reference(feats, len(x)))

    @staticmethod
    def _reference(feats: pd.DataFrame | Table | None, n_rows: int) -> Any:
        """What :meth:`_seconds` needs besides the model inputs: the frame itself (None: a plain matrix)."""
        return feats

    def _seconds(self, x: np.ndarray, feats: pd.DataFrame | Table | None) -> np.ndarray:
        with np.errstate(all="ignore"):
            return self._seconds_of(self._kernels(feats, x), len(x))

    # ------------------------------------------------------------------ persistence

    def save(self, path: Path, *, record: Mapping[str, Any] | None = None) -> Path:
        """Write ``<path>.npz``: layers, mode and nearest-tile table (no pickles)."""
        path = Path(path).with_suffix(self.suffix)
        arrays: dict[str, np.ndarray] = {
            "mode": np.array(self.mode_),
            "tile_keys": np.asarray(self.tile_keys_, dtype=np.float64).reshape(-1, len(KEY_COLUMNS)),
            "tile_table": np.asarray(self.tile_table_, dtype=np.float64).reshape(-1, 2),
        }
        if record is not None:
            arrays[RECORD_KEY] = record_array(record)
        arrays.update(layer_arrays(self.weights_))
        with open(path, "wb") as fh:  # a file object: savez would append .npz to a bare path
            np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        est = cls._from_config(tuple(feature_names), config)
        path = Path(path)
        if path.suffix != cls.suffix:
            raise OpcastError(f"{path}: neusight predictors are .npz files; re-fit with opcast train fit")
        state = read_arrays(path)
        est.record_ = parse_record(state.pop(RECORD_KEY), path) if RECORD_KEY in state else None
        require_arrays(state, {"mode": "U", "tile_keys": "f", "tile_table": "f"}, path)
        mode = str(state.pop("mode"))
        keys, table = state.pop("tile_keys"), state.pop("tile_table")
        if mode not in MODES or keys.ndim != 2 or keys.shape[1] != len(KEY_COLUMNS) or table.shape != (len(keys), 2):
            raise OpcastError(
                f"{path}: its mode ({mode[:20]!r}) or tile table {keys.shape}/{table.shape} is not a neusight "
                "predictor's; re-fit with opcast train fit"
            )
        est.mode_, est.tile_keys_, est.tile_table_ = mode, keys, table
        width = len(feature_names) if mode == "plain" else 3
        est.weights_ = checked_layers(state, width, 3, path)  # alpha, beta, gamma
        return est
