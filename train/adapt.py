"""``opcast train adapt``: few-shot correction of a model set's learned kernel times on one GPU.

A model set predicts a GPU it never measured from that GPU's spec sheet; most of what it gets
wrong there is one level of efficiency the specs do not carry (clocks under power caps, a
library's kernels for that architecture), shared by the GPU's kernels. A few measured kernels of
the GPU (a minute of ``opcast collect bench``, or a few hundred replayed rows) pin that level down.

The correction is a ridge regression of the log ratio ``r = log(measured / learned)`` of those
rows (clipped to +-log 4, so a throttled or mistimed row cannot dominate)::

    r = a + a_g + (c + c_g) * z,        z = log(t_learned / t_ref_s)

``a`` is the device's level, ``a_g`` its deviation for one predictor group (op, direction,
dtype class), ``c`` and ``c_g`` a dependence on the size of the kernel (``z``: the learned time
over the geometric mean of the measured rows' learned times, held inside their range when
applied), since a short kernel's time is launch and ramp-up, which varies less between GPUs than
a long kernel's sustained rate. Each term has a Gaussian prior at 0 whose strength is stated in
rows (:data:`PRIOR_ROWS`): with ``n`` rows a term moves ``n / (n + prior)`` of the way to what the
rows alone say, so one row moves the correction little and a hundred almost fully. A group with
no measured row takes the device's terms (most of the error is the device's level).

Before those terms, a group with :data:`ANALOGUE_MIN_ROWS` measured rows may get an ``analogue``
term (:func:`fit_analogues`): the set answers the same kernels *as each GPU it was trained on*
(where it is accurate, within-GPU), and a ridge regression of the measured log times on those
answers' logs and the device's own answer's says which training GPUs' shape behaviour the device
shares (an L40S's small GEMMs follow an RTX PRO 6000's, an H100's an H200's)::

    log t = b_0 + b_own log t_own + sum_d b_d log t_d

with a Gaussian prior centred on the device's own answer (``b_own = 1``, every ``b_d = 0``; the
intercept free) whose strength is picked from :data:`ANALOGUE_RIDGES` by :data:`SHAPE_FOLDS`-fold
splits of the measured rows, and kept only when it beats a level alone on those splits. The
weights are held >= 0, so the time is a level times a product of the answers' non-negative
powers: it leans on the GPUs it resembles, never extrapolates away from one. The terms below are
then fitted on its times.

What that leaves is shape-dependent (which tiles the GPU's library picks, where its launch floor
ends), so a group with :data:`SHAPE_MIN_ROWS` measured rows or more also gets a ``shape`` term
``s_g(x)``: kernel ridge regression (a Gaussian process's posterior mean) of the rows' remaining
log ratio over ``x``, the logs of the op's integer parameters (a GEMM's b, m, n, k), with a
Gaussian kernel of length ``l`` e-folds and a ridge ``nu`` (noise over signal variance). It is
nonparametric, so it keeps improving with rows, and it fades to the terms above away from the
measured shapes. ``(l, nu)`` is chosen per group from :data:`SHAPE_GRID` by a
:data:`SHAPE_FOLDS`-fold split of the measured rows themselves, and the term is dropped when no
choice beats leaving it out on those folds; at most :data:`SHAPE_MAX_ANCHORS` rows (a seeded
draw) are kept. With fewer rows nothing but the five terms above is fitted, as before.

A tensor-core GEMM whose n or k breaks cuBLAS's 16-byte rule (:func:`opcast.ops.misaligned_tensor_gemm`) runs
another, slower kernel, which no model set has learned (their GEMM data are aligned); its rows form a group of
their own (``gemm-fwd-half_misaligned``, :func:`opcast.train.artifacts.adaptation_keys`) with all the terms above,
and ``opcast predict`` applies it where the adaptation has one (the predictor group's terms elsewhere). Fitted in
the GEMM group, ``collect bench``'s odd fifth of shapes pulled the H200's correction of its aligned GEMMs slow.

The result is ``adapt/<device>.json`` in the set (:func:`opcast.train.artifacts.write_adaptation`),
which ``opcast predict`` applies whenever it prices kernels on that device with that set
(:class:`opcast.predict.cost.learned.LearnedKernelCost`, labelled ``learned+adapted(n=...)`` in
``cost_sources``).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import numpy as np
import pandas as pd

from opcast.errors import OpcastError

PRIOR_ROWS: Final[Mapping[str, float]] = MappingProxyType(
    {"device": 1.0, "group": 4.0, "device_slope": 10.0, "group_slope": 40.0}
)
"""Prior strength of each term, in rows (slopes: in rows at one e-fold of spread in ``z``). The
device level is nearly free (one row halves it); a group's deviation from the device needs a few
rows of its own; the size dependence needs a spread of sizes, a group's own one more of them.
Chosen before the evaluation and checked there (``benchmarks/few_shot.py`` prints the variants)."""
SHAPE_MIN_ROWS: Final = 20
"""Rows a group needs before a ``shape`` term is considered (fewer: levels and slopes only)."""
SHAPE_GRID: Final = ((1.0, 0.25), (1.0, 1.0), (2.0, 0.25), (2.0, 1.0))
"""Candidate ``(length in e-folds of each parameter, ridge = noise over signal variance)`` of a
``shape`` term; fixed before the evaluation, one picked per group by the inner split."""
SHAPE_FOLDS: Final = 5
SHAPE_MAX_ANCHORS: Final = 800
"""Most rows a group's ``shape`` term keeps (a seeded draw beyond): bounds the file and the predict cost."""
ANALOGUE_MIN_ROWS: Final = 20
"""Rows a group needs before an ``analogue`` term is considered."""
ANALOGUE_RIDGES: Final = (0.01, 0.1, 1.0, 10.0, 100.0)
"""Candidate prior strengths of an ``analogue`` term, in rows at one e-fold of difference between
the answers' logs (larger: closer to the device's own answer; the answers of two GPUs for one kernel
differ by a few tenths of an e-fold, so 1 is already weak against a hundred rows); fixed before the
evaluation, one picked per group by the inner split."""
LOG_CLIP: Final = math.log(4.0)
"""Each row's ``log(measured / learned)`` is clipped to +-this (a factor of 4)."""
CV_FOLDS: Final = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class AdaptConfig:
    """How :func:`fit_correction` fits."""

    prior_rows: Mapping[str, float] = field(default_factory=lambda: dict(PRIOR_ROWS))
    """Prior strength of each term in rows (:data:`PRIOR_ROWS`); keys device, group, device_slope, group_slope."""
    slope: bool = True
    """Fit the size dependence (``c``, ``c_g``); off: levels only (no ``shape`` term either)."""
    shape: bool = True
    """Fit the groups' ``shape`` terms where they have :data:`SHAPE_MIN_ROWS` rows (and ``params`` are given)."""
    analogues: bool = True
    """Fit the groups' ``analogue`` terms where they have :data:`ANALOGUE_MIN_ROWS` rows (and the set's
    answers on its training devices are given)."""

    def __post_init__(self) -> None:
        missing = sorted(set(PRIOR_ROWS) - set(self.prior_rows))
        bad = [k for k, v in self.prior_rows.items() if not (isinstance(v, (int, float)) and 0 <= v < 1e9)]
        if missing or bad:
            raise OpcastError(f"prior_rows needs {', '.join(PRIOR_ROWS)} as numbers >= 0; missing {missing}, bad {bad}")


def fit_correction(
    keys: Sequence[str] | np.ndarray,
    pred_s: np.ndarray,
    true_s: np.ndarray,
    cfg: AdaptConfig = AdaptConfig(),
    params: Any = None,
    seed: int = 0,
    analogue_s: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The correction fields of an adaptation (``rows``, ``prior_rows``, ``t_ref_s``,
    ``pred_s_range``, ``log_factor``, ``slope``, ``groups``) fitted on rows of group ``keys``
    with learned times ``pred_s`` and measured times ``true_s``; rows without a positive
    finite pair are ignored. ``params``: the rows' op parameters (a DataFrame or a mapping of
    column -> array, aligned with the rows), which the groups' ``shape`` terms need; None fits
    none. ``analogue_s``: the set's answers for the same rows on each of its training devices
    (device -> seconds, NaN where it has none), which the ``analogue`` terms need; None fits none.
    Raises :class:`OpcastError` when no row is left."""
    pred = np.asarray(pred_s, dtype=float)
    true = np.asarray(true_s, dtype=float)
    ok = np.isfinite(pred) & np.isfinite(true) & (pred > 0) & (true > 0)
    if not ok.any():
        raise OpcastError("no measured row has a learned prediction to correct; measure ops the model set covers")
    key_of = np.asarray(keys, dtype=object)[ok]
    terms: dict[str, dict[str, Any]] = {}
    if analogue_s and cfg.analogues:
        others = {d: np.asarray(v, dtype=float)[ok] for d, v in analogue_s.items()}
        terms = fit_analogues(key_of, pred[ok], true[ok], others, seed)
        if terms:
            mapped = correction({**_IDENTITY, "groups": {g: {**_NO_LEVEL, "analogue": t} for g, t in terms.items()}})
            pred = pred.copy()
            pred[ok] = mapped.analogue_s(key_of, pred[ok], others)
    fields = _fit_levels(key_of, pred[ok], true[ok], cfg)
    for g, term in terms.items():
        fields["groups"][g]["analogue"] = term
    if params is not None and cfg.shape and cfg.slope:
        _fit_shapes(fields, key_of, pred[ok], true[ok], params, np.flatnonzero(ok), seed)
    return fields


_IDENTITY: Final = {"rows": 1, "t_ref_s": 1.0, "pred_s_range": [1e-30, 1e30], "log_factor": 0.0, "slope": 0.0}
_NO_LEVEL: Final = {"rows": 1, "log_factor": 0.0, "slope": 0.0}


def fit_analogues(
    keys: np.ndarray, pred: np.ndarray, true: np.ndarray, analogue_s: Mapping[str, np.ndarray], seed: int = 0
) -> dict[str, dict[str, Any]]:
    """The ``analogue`` term of each group of ``keys`` with :data:`ANALOGUE_MIN_ROWS` rows where the
    inner split says one helps: group -> ``{"devices", "coef", "ridge"}`` (the module docstring's
    regression). ``pred``: the set's answers on the device (positive), ``true``: the measured times,
    ``analogue_s``: device -> the set's answers for the same rows on that training device; a device
    without a positive answer on every row of a group is not used for it."""
    from opcast.train.artifacts import ADAPT_ANALOGUE_MAX_COEF

    out: dict[str, dict[str, Any]] = {}
    for key in sorted(set(keys.tolist())):
        pos = np.flatnonzero(keys == key)
        if len(pos) < ANALOGUE_MIN_ROWS:
            continue
        names = [
            d
            for d in sorted(analogue_s)
            if np.isfinite(v := np.asarray(analogue_s[d], dtype=float)[pos]).all() and (v > 0).all()
        ]
        if not names:
            continue
        own = np.log(pred[pos])
        y = own + np.clip(np.log(true[pos] / pred[pos]), -LOG_CLIP, LOG_CLIP)
        shift = float(own.mean())  # centred logs: a prior strength means the same at any time scale
        x = np.column_stack([np.ones(len(pos)), own - shift, *(np.log(analogue_s[d][pos]) - shift for d in names)])
        prior = np.zeros(x.shape[1])
        prior[1] = 1.0
        fold = np.random.default_rng(seed).permutation(len(pos)) % SHAPE_FOLDS
        best, best_err = None, _cv_ape(x, y, prior, math.inf, fold)  # a level alone: the infinitely strong prior
        for ridge in ANALOGUE_RIDGES:
            err = _cv_ape(x, y, prior, ridge, fold)
            if err < best_err * (1.0 - 1e-6):
                best, best_err = ridge, err
        if best is None:
            continue
        beta = _prior_ridge(x, y, prior, best)
        coef = [float(beta[0] - shift * beta[1:].sum()), *map(float, beta[1:])]
        if all(abs(c) <= ADAPT_ANALOGUE_MAX_COEF for c in coef):  # else check_adaptation would refuse the file
            out[key] = {"devices": names, "coef": [round(c, 6) for c in coef], "ridge": best}
    return out


def _prior_ridge(x: np.ndarray, y: np.ndarray, prior: np.ndarray, ridge: float) -> np.ndarray:
    """Least squares of ``y`` on ``x`` with a Gaussian prior at ``prior`` of strength ``ridge`` (rows)
    on every column but the first (the intercept, free); ``inf``: the prior exactly, intercept fitted.
    The answers' weights (every column but the intercept) are held >= 0, so no answer is
    extrapolated away from (the most negative weight is set to 0 and the rest refitted, until none
    is negative; a last negative one leaves the prior and a level)."""
    if not math.isfinite(ridge):
        beta = prior.copy()
        beta[0] = float(np.mean(y - x[:, 1:] @ prior[1:]))
        return beta
    free = np.ones(x.shape[1], dtype=bool)
    while True:
        beta = np.zeros(x.shape[1])
        xf = x[:, free]
        penalty = np.full(x.shape[1], ridge)[free]
        penalty[0] = 0.0
        beta[free] = np.linalg.solve(
            xf.T @ xf + np.diag(penalty) + 1e-9 * np.eye(xf.shape[1]), xf.T @ y + penalty * prior[free]
        )
        worst = int(np.argmin(beta[1:])) + 1
        if beta[worst] >= 0:
            return beta
        if free.sum() <= 2:  # the one weight left is negative: the device's own answer and a level
            return _prior_ridge(x, y, prior, math.inf)
        free[worst] = False


def _cv_ape(x: np.ndarray, y: np.ndarray, prior: np.ndarray, ridge: float, fold: np.ndarray) -> float:
    """Mean absolute percentage error of :func:`_prior_ridge` on the seeded folds ``fold``."""
    err = 0.0
    for f in range(SHAPE_FOLDS):
        test, train = fold == f, fold != f
        beta = _prior_ridge(x[train], y[train], prior, ridge)
        err += float(np.abs(np.expm1(x[test] @ beta - y[test])).sum())
    return err / len(y)


def _fit_levels(key_of: np.ndarray, pred: np.ndarray, true: np.ndarray, cfg: AdaptConfig) -> dict[str, Any]:
    """The level and slope terms of :func:`fit_correction` (rows already screened)."""
    r = np.clip(np.log(true / pred), -LOG_CLIP, LOG_CLIP)
    t_ref = float(np.exp(np.mean(np.log(pred))))
    z = np.log(pred / t_ref)
    groups = sorted(set(key_of.tolist()))
    g_index = np.searchsorted(np.array(groups, dtype=object), key_of)
    n, n_g = len(r), len(groups)
    slope = cfg.slope and n >= 3 and float(np.ptp(z)) > 0
    # columns: a, a_g..., then (with the slope) c, c_g...
    cols = 1 + n_g
    x = np.zeros((n, 2 * cols if slope else cols))
    x[:, 0] = 1.0
    x[np.arange(n), 1 + g_index] = 1.0
    prior = cfg.prior_rows
    penalty = [prior["device"]] + [prior["group"]] * n_g
    if slope:
        x[:, cols:] = x[:, :cols] * z[:, None]
        penalty += [prior["device_slope"]] + [prior["group_slope"]] * n_g
    lhs = x.T @ x + np.diag(np.maximum(penalty, 1e-9))  # a zero prior: least squares (kept solvable)
    beta = np.linalg.solve(lhs, x.T @ r)
    level = beta[:cols]
    slopes = beta[cols:] if slope else np.zeros(cols)
    counts = np.bincount(g_index, minlength=n_g)
    return {
        "rows": int(n),
        "prior_rows": {k: float(prior[k]) for k in PRIOR_ROWS},
        "t_ref_s": t_ref,
        "pred_s_range": [float(pred.min()), float(pred.max())],
        "log_factor": round(float(np.clip(level[0], -5, 5)), 6),
        "slope": round(float(np.clip(slopes[0], -2, 2)), 6),
        "groups": {
            g: {
                "rows": int(counts[i]),
                "log_factor": round(float(np.clip(level[1 + i], -5, 5)), 6),
                "slope": round(float(np.clip(slopes[1 + i], -2, 2)), 6),
            }
            for i, g in enumerate(groups)
        },
    }


def _log_params(params: Any, names: Sequence[str], rows: np.ndarray) -> np.ndarray:
    """The logs of the parameters ``names`` at positions ``rows`` of ``params`` (NaN: missing)."""
    from opcast.train.artifacts import _as_float_array

    out = np.full((len(rows), len(names)), np.nan)
    for j, name in enumerate(names):
        if name in params:
            vals = _as_float_array(params[name])[rows]
            out[:, j] = np.log(np.maximum(vals, 1.0))
    return out


def _gram(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    a, b = a / length, b / length
    d2 = (a**2).sum(axis=1)[:, None] + (b**2).sum(axis=1)[None, :] - 2.0 * a @ b.T
    return np.exp(-0.5 * np.maximum(d2, 0.0))


def _ridge_weights(x: np.ndarray, e: np.ndarray, length: float, ridge: float) -> np.ndarray:
    return np.linalg.solve(_gram(x, x, length) + ridge * np.eye(len(x)), e)


def choose_shape(x: np.ndarray, e: np.ndarray, seed: int = 0) -> tuple[float, float] | None:
    """The ``(length, ridge)`` of :data:`SHAPE_GRID` with the least squared error on
    :data:`SHAPE_FOLDS` seeded folds of the rows ``x`` (log parameters) with remaining log
    ratios ``e``, or None when none beats predicting 0 (no shape term) there."""
    fold = np.random.default_rng(seed).permutation(len(e)) % SHAPE_FOLDS
    best, best_err = None, float(np.mean(e**2))
    for length, ridge in SHAPE_GRID:
        err = 0.0
        for f in range(SHAPE_FOLDS):
            test, train = fold == f, fold != f
            w = _ridge_weights(x[train], e[train], length, ridge)
            err += float(np.sum((_gram(x[test], x[train], length) @ w - e[test]) ** 2))
        err /= len(e)
        if err < best_err * (1.0 - 1e-6):
            best, best_err = (length, ridge), err
    return best


def _fit_shapes(
    fields: dict[str, Any],
    keys: np.ndarray,
    pred: np.ndarray,
    true: np.ndarray,
    params: Any,
    rows: np.ndarray,
    seed: int,
) -> None:
    """Add a ``shape`` term to each group of ``fields`` with :data:`SHAPE_MIN_ROWS` rows whose
    inner split says it helps (``rows``: the positions of the screened rows in ``params``)."""
    from opcast.train.artifacts import shape_params

    e_all = np.clip(np.log(true / pred), -LOG_CLIP, LOG_CLIP) - correction(fields).log_factor(keys, pred)
    for key, entry in fields["groups"].items():
        names = [n for n in shape_params(key) if n in params]
        pos = np.flatnonzero(keys == key)
        if not names or len(pos) < SHAPE_MIN_ROWS:
            continue
        x = _log_params(params, names, rows[pos])
        keep = np.isfinite(x).all(axis=1)
        spread = np.ptp(x[keep], axis=0) > 0 if keep.any() else np.zeros(len(names), dtype=bool)
        if keep.sum() < SHAPE_MIN_ROWS or not spread.any():
            continue
        x, e = x[keep][:, spread], e_all[pos][keep]
        names = [n for n, s in zip(names, spread) if s]
        if len(e) > SHAPE_MAX_ANCHORS:
            pick = np.sort(np.random.default_rng(seed).choice(len(e), SHAPE_MAX_ANCHORS, replace=False))
            x, e = x[pick], e[pick]
        chosen = choose_shape(x, e, seed)
        if chosen is None:
            continue
        length, ridge = chosen
        w = _ridge_weights(x, e, length, ridge)
        entry["shape"] = {
            "features": names,
            "length": length,
            "anchors": [[round(float(v), 5) for v in row] for row in x],
            "weights": [round(float(v), 6) for v in np.clip(w, -100, 100)],
        }


def correction(fields: Mapping[str, Any]) -> Any:
    """An :class:`opcast.train.artifacts.Adaptation` of fitted ``fields`` (not written anywhere),
    to apply the same arithmetic the predict path applies."""
    from opcast.train.artifacts import Adaptation

    return Adaptation({"device": "", **fields})


def cross_validate(
    keys: np.ndarray,
    pred_s: np.ndarray,
    true_s: np.ndarray,
    cfg: AdaptConfig = AdaptConfig(),
    seed: int = 0,
    params: Any = None,
    analogue_s: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any] | None:
    """MAPE (percent) of the learned and of the adapted times on the measured rows themselves,
    each row predicted by a correction fitted without its fold (:data:`CV_FOLDS` seeded folds);
    None with fewer than 10 rows. ``params`` and ``analogue_s`` as :func:`fit_correction` takes them."""
    from opcast.train.evaluate import ape_metrics

    keys = np.asarray(keys, dtype=object)
    pred = np.asarray(pred_s, dtype=float)
    true = np.asarray(true_s, dtype=float)
    ok = np.flatnonzero(np.isfinite(pred) & np.isfinite(true) & (pred > 0) & (true > 0))
    if len(ok) < 10:
        return None
    fold = np.random.default_rng(seed).permutation(len(ok)) % CV_FOLDS
    adapted = np.full(len(pred), np.nan)
    for f in range(CV_FOLDS):
        test, train = ok[fold == f], ok[fold != f]
        fields = fit_correction(
            keys[train], pred[train], true[train], cfg, _take(params, train), seed, _take(analogue_s, train)
        )
        adapted[test] = correction(fields).apply(keys[test], pred[test], _take(params, test), _take(analogue_s, test))
    base, adapt = ape_metrics(pred[ok], true[ok]), ape_metrics(adapted[ok], true[ok])
    return {
        "folds": CV_FOLDS,
        "rows": int(len(ok)),
        "learned_mape": round(base["mape"], 2),
        "adapted_mape": round(adapt["mape"], 2),
    }


def _describe_analogue(term: Mapping[str, Any] | None) -> str:
    """A group's ``analogue`` term in words: the weight of each answer's log, largest first ("" for none)."""
    if not term:
        return ""
    weights = sorted(zip(["own", *term["devices"]], term["coef"][1:], strict=True), key=lambda w: -abs(w[1]))
    return ", ".join(f"{name} {b:+.2f}" for name, b in weights if abs(b) >= 0.005)


def analogue_answers(model_set: Any, rows: Any, keys: np.ndarray, device_name: str) -> dict[str, np.ndarray]:
    """The set's answers for ``rows`` (of groups ``keys``) on each training device of their groups
    but ``device_name`` itself (device -> seconds, NaN for rows of groups not trained on it): what the
    ``analogue`` terms regress on (:func:`fit_analogues`)."""
    specs = model_set.device_specs
    out: dict[str, np.ndarray] = {}
    for key in dict.fromkeys(keys.tolist()):
        pos = np.flatnonzero(keys == key)
        for dev in (model_set.predictors.get(key) or {}).get("devices", ()):
            if dev == device_name or dev not in specs:
                continue
            got = out.setdefault(dev, np.full(len(keys), np.nan))
            got[pos] = model_set.predict_s(rows.iloc[pos].reset_index(drop=True), specs[dev])
    return out


def _take(params: Any, rows: np.ndarray) -> dict[str, np.ndarray] | None:
    """The parameter columns of ``params`` (None: none) at positions ``rows``."""
    if params is None:
        return None
    cols = params.columns if hasattr(params, "columns") else params.keys()
    return {c: np.asarray(params[c])[rows] for c in cols}


# --------------------------------------------------------------------------- the command


@dataclass(kw_only=True, slots=True)
class AdaptResult:
    """What :func:`adapt_model_set` wrote."""

    path: Path
    """The adaptation file."""
    set_path: Path
    """The model set it belongs to (``--models``, or the copy at ``--out``)."""
    fields: dict[str, Any]
    """The written fields."""
    table: pd.DataFrame
    """Per group: measured rows, learned and adapted MAPE on those rows (in-sample), factor at t_ref."""
    ignored: dict[str, int]
    """Rows not used, by reason."""


def _destination(models: str | Path | None, out: str | Path | None, model_set: Any) -> Path | None:
    """Where the adaptation goes: ``--models SET`` itself, or ``--out NEWSET`` (None: copy there
    once the fit succeeded). Checked before any work; nothing existing is overwritten but an
    adaptation of the same set."""
    if out is None:
        if models is None:
            raise OpcastError(
                "the embedded default set is part of the install and is not changed; give --out DIR to "
                "write an adapted copy of it (then predict with --models DIR)"
            )
        return Path(model_set.path)
    out = Path(out)
    try:
        if out.exists():
            from opcast.train.artifacts import META, _read_meta

            if not (out / META).is_file():
                raise OpcastError(
                    f"--out {out} exists and is not a model set; give a new folder (the set is copied there "
                    "with the adaptation added) or an adapted copy of the same set"
                )
            other = _read_meta(out / META)
            if not isinstance(other, dict) or other.get("meta_sha256") != model_set.meta.get("meta_sha256"):
                raise OpcastError(
                    f"--out {out} is another model set, not a copy of {model_set.path}; give a new folder"
                )
            return out
        base = out.parent
        while not base.exists():
            base = base.parent
    except OSError as err:
        raise OpcastError(f"--out {out} cannot be inspected ({err.strerror}); choose a writable folder") from None
    if not base.is_dir():
        raise OpcastError(f"--out {out} lies under {base}, which is a file; choose a folder")
    return None


def _copy_set(src: Path, out: Path) -> Path:
    """Copy the set ``src`` to the new folder ``out`` atomically (a temporary sibling renamed)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        raise OpcastError(f"cannot write {out}: {err.strerror}; choose a writable --out folder") from None
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*", "__pycache__"))
        tmp.rename(out)
        out.chmod(0o755)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OpcastError(f"cannot copy {src} to {out}: {err.strerror}; choose a writable --out folder") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def adapt_model_set(
    datasets: Sequence[str | Path],
    gpu: str,
    *,
    models: str | Path | None = None,
    out: str | Path | None = None,
    cfg: AdaptConfig = AdaptConfig(),
    command: str = "opcast train adapt",
) -> AdaptResult:
    """Fit the correction of ``models`` (None: the embedded default) on ``gpu`` from the rows of
    ``datasets`` measured there, and write it into the set, or into a copy of it at ``out``."""
    from opcast.hardware import get_device
    from opcast.train.artifacts import adaptation_keys, load_model_set, misaligned_rows, write_adaptation
    from opcast.train.evaluate import ape_metrics
    from opcast.train.features import group_key_array
    from opcast.train.fit import NO_TIME, dataset_records, load_training_frame, portable_command, resolve_devices

    model_set = load_model_set(models)
    dest = _destination(models, out, model_set)  # before reading any data
    no_time: dict[str, int] = {}
    frame = load_training_frame(datasets, no_time)
    names = sorted(pd.unique(frame["device"].astype(object)).tolist())
    problem: OpcastError | None = None
    try:
        name = get_device(gpu).name
    except OpcastError as err:  # a device the catalog lacks may still name the rows (a local CPU)
        name, problem = gpu, err
    if name not in names and gpu in names:
        name = gpu
    if name not in names:
        if problem is not None:  # an unreadable device file or an unknown name: that, not 'no rows of it'
            raise problem
        raise OpcastError(
            f"--gpu {gpu}: no rows of that device in the datasets (devices: {', '.join(map(str, names))[:200]}); "
            "give the device the rows were measured on"
        )
    rows = frame[frame["device"] == name].reset_index(drop=True)
    spec = resolve_devices([name], datasets, known=model_set.meta.get("device_specs", {}))[name]
    keys = group_key_array(rows)
    covered = np.fromiter((k in model_set.predictors for k in keys.tolist()), dtype=bool, count=len(keys))
    pred = np.full(len(rows), np.nan)
    if covered.any():
        pos = np.flatnonzero(covered)
        pred[pos] = model_set.predict_s(rows.iloc[pos].reset_index(drop=True), spec)
    true = rows["time_s_median"].to_numpy(dtype=float)
    usable = np.isfinite(pred) & (pred > 0)
    ignored = {
        k: int(v)
        for k, v in {
            f"measured on another device than {name} ({', '.join(str(n) for n in names if n != name)[:120]})": len(
                frame
            )
            - len(rows),
            "no predictor in the set for its op group": int((~covered).sum()),
            "no learned prediction (the device lacks the dtype's peak)": int((covered & ~usable).sum()),
            "no positive, finite time_s_median": no_time.get(NO_TIME, 0),
        }.items()
        if v
    }
    if not usable.any():
        groups = ", ".join(sorted(set(keys.tolist())))[:160]
        raise OpcastError(
            f"none of the {len(rows)} rows of {name} ({groups}) has a learned prediction in {model_set.path}; "
            "measure ops the set covers (opcast train eval shows them)"
        )
    use = np.flatnonzero(usable)
    params = _take(rows, use)
    answers = _take(analogue_answers(model_set, rows, keys, name), use) if cfg.analogues else None
    keys = adaptation_keys(keys, misaligned_rows(rows))  # a misaligned tensor-core GEMM is a group of its own
    fields = fit_correction(keys[usable], pred[usable], true[usable], cfg, params, analogue_s=answers)
    cv = cross_validate(keys[usable], pred[usable], true[usable], cfg, params=params, analogue_s=answers)
    shaped = any("shape" in g for g in fields["groups"].values())
    analogue = any("analogue" in g for g in fields["groups"].values())
    body = {
        "format": "opcast-adaptation",
        # a file without the newer terms stays readable by an older opcast
        "format_version": 3 if analogue else 2 if shaped else 1,
        "device": name,
        **fields,
        "datasets": dataset_records(datasets),
        "command": portable_command(command),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cross_validated": cv,
    }
    if dest is None:
        dest = _copy_set(Path(model_set.path), Path(out))  # type: ignore[arg-type]  # out is set when dest is None
    path = write_adaptation(dest, body)
    adapted = np.full(len(rows), np.nan)
    adapted[use] = correction(fields).apply(keys[use], pred[use], params, answers)
    table = []
    for g in sorted(set(keys[usable].tolist())):
        m = usable & (keys == g)
        entry = fields["groups"][g]
        table.append(
            {
                "group": g,
                "rows": int(m.sum()),
                "learned_mape": ape_metrics(pred[m], true[m])["mape"],
                "adapted_mape": ape_metrics(adapted[m], true[m])["mape"],
                "factor_at_t_ref": math.exp(fields["log_factor"] + entry["log_factor"]),
                "analogue": _describe_analogue(entry.get("analogue")),
            }
        )
    return AdaptResult(path=path, set_path=dest, fields=body, table=pd.DataFrame(table), ignored=ignored)
