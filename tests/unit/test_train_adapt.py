"""opcast train adapt: a per-device correction recovered from a few rows, shrunk with few rows,
stored in the set (bound to it, checked field by field) and applied and labelled by predict."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.schema import write_parquet
from opcast.train.adapt import adapt_model_set, correction, fit_correction
from opcast.train.artifacts import load_adaptation, load_model_set, write_model_set
from opcast.train.features import group_key_array
from opcast.train.fit import FitConfig, fit_frame

from helpers.synthetic import aligned_gemms, fake_devices, synthetic_dataset

FACTOR = 1.3
"""The target GPU runs every kernel this much slower than the set predicts."""
TARGET = "H100-SXM"


@pytest.fixture(scope="module")
def toy_set(tmp_path_factory):
    """A small set fitted on three fake GPUs (gemm, layernorm), and rows of a GPU it never saw
    whose measured times are the set's own predictions x FACTOR (1 % noise)."""
    devices = {d.name: d for d in fake_devices(3)}
    frame = synthetic_dataset(list(devices.values()), ops=("gemm", "layernorm"), rows_per_op=60, seed=4)
    groups, _, _ = fit_frame(frame, devices, FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 40}))
    root = write_model_set(tmp_path_factory.mktemp("sets"), "toy", groups, {"datasets": []})
    ms = load_model_set(root)
    target = get_device(TARGET)
    rows = aligned_gemms(synthetic_dataset([target], ops=("gemm", "layernorm"), rows_per_op=100, seed=9))
    rows = rows.sample(frac=1.0, random_state=3).reset_index(drop=True)  # ops mixed, as a bench run's rows
    base = ms.predict_s(rows, target)
    noise = np.exp(np.random.default_rng(1).normal(0.0, 0.01, len(rows)))
    rows["time_s_median"] = base * FACTOR * noise
    return root, rows, base


def _dataset(tmp_path: Path, rows, n: int, name: str = "measured") -> Path:
    out = tmp_path / name
    out.mkdir()
    write_parquet(rows.iloc[:n].reset_index(drop=True), out / "rows.parquet")
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120)


def test_a_constant_factor_is_recovered_from_10_rows(tmp_path, toy_set):
    root, rows, base = toy_set
    result = adapt_model_set([_dataset(tmp_path, rows, 10)], TARGET, models=root, out=tmp_path / "adapted")
    assert result.fields["rows"] == 10
    adapted = load_adaptation(load_model_set(tmp_path / "adapted"), TARGET)
    assert adapted is not None and adapted.label == "learned+adapted(n=10)"
    rest = rows.iloc[10:]
    got = adapted.apply(group_key_array(rest), base[10:])
    ratio = got / base[10:]
    assert np.all(np.abs(ratio / FACTOR - 1) < 0.04), (ratio.min(), ratio.max())  # within 4 % of x1.3 everywhere
    before = np.mean(np.abs(base[10:] / rest["time_s_median"].to_numpy() - 1))
    after = np.mean(np.abs(got / rest["time_s_median"].to_numpy() - 1))
    assert before > 0.2 and after < 0.04


def test_one_row_moves_the_correction_less_than_a_hundred(toy_set):
    _, rows, base = toy_set
    keys = group_key_array(rows)
    true = rows["time_s_median"].to_numpy()

    def total(n: int) -> float:
        fields = fit_correction(keys[:n], base[:n], true[:n])
        return float(correction(fields).log_factor(keys[:1], base[:1])[0])

    one, hundred = total(1), total(100)
    assert 0 < one < 0.7 * hundred
    assert abs(hundred - math.log(FACTOR)) < 0.02  # a hundred rows: the prior barely matters
    # an op group never measured borrows the device level, shrunk the same way
    # an op group never measured borrows the device level: with a prior of 1 row on the device
    # level and 4 on a group's deviation, 4/5 of what the measured group says
    one_group = keys == keys[0]
    fields = fit_correction(keys[one_group], base[one_group], true[one_group])
    other = next(k for k in keys if k != keys[0])
    assert other not in fields["groups"]
    borrowed = correction(fields).log_factor([other], base[:1])[0]
    assert 0.7 * math.log(FACTOR) < borrowed < 0.85 * math.log(FACTOR)


def test_the_artifact_round_trips_and_is_bound_to_its_set(tmp_path, toy_set):
    root, rows, base = toy_set
    copy = tmp_path / "copy"
    result = adapt_model_set([_dataset(tmp_path, rows, 50)], TARGET, models=root, out=copy)
    assert result.path == copy / "adapt" / f"{TARGET}.json" and result.set_path == copy
    loaded = load_adaptation(load_model_set(copy), TARGET)
    assert loaded is not None and loaded.data == json.loads(result.path.read_text())
    keys = group_key_array(rows)
    assert np.allclose(loaded.apply(keys, base), correction(result.fields).apply(keys, base))
    assert load_adaptation(load_model_set(root), TARGET) is None  # --out left the original set alone
    assert load_adaptation(load_model_set(copy), "A100-SXM4-80GB") is None  # another device: none
    # the same file in another set (another meta.json) is refused
    other = tmp_path / "other"
    other.mkdir()
    meta = json.loads((copy / "meta.json").read_text())
    meta["name"] = "other"
    from opcast.train.artifacts import _meta_digest

    meta["meta_sha256"] = _meta_digest(meta)
    (other / "meta.json").write_text(json.dumps(meta))
    for name in meta["files"]:
        (other / name).write_bytes((copy / name).read_bytes())
    (other / "adapt").mkdir()
    (other / "adapt" / f"{TARGET}.json").write_bytes(result.path.read_bytes())
    with pytest.raises(OpcastError, match="another model set"):
        load_adaptation(load_model_set(other), TARGET)


def test_the_predict_path_applies_it_and_says_so(tmp_path, toy_set):
    from opcast.predict.cost import kernel, load_kernel_cost

    root, rows, _ = toy_set
    copy = tmp_path / "copy"
    adapt_model_set([_dataset(tmp_path, rows, 50)], TARGET, models=root, out=copy)
    k = kernel("gemm", {"b": 1, "m": 2048, "n": 2048, "k": 2048}, "fp16")
    plain, adapted = load_kernel_cost(root), load_kernel_cost(copy)
    target = get_device(TARGET)
    t0, t1 = plain.time_s(k, target)[0], adapted.time_s(k, target)[0]
    assert abs(t1 / t0 / FACTOR - 1) < 0.04
    assert not any("adapted" in n for n in plain.describe()["notes"])
    notes = [n for n in adapted.describe()["notes"] if "learned+adapted(n=50)" in n]
    assert len(notes) == 1 and TARGET in notes[0]
    other = get_device("A100-SXM4-80GB")  # no adaptation there: the same time as the plain set
    assert plain.time_s(k, other)[0] == adapted.time_s(k, other)[0]
    # the GPU on a cluster's network (--cluster) and a what-if GPU derived from it keep its correction
    for name in ("H100-SXM[inter_node_bw_bytes_per_s=x2]", "H100-SXM[mem_bw_bytes_per_s=x2]"):
        derived = get_device(name)
        t2, t3 = plain.time_s(k, derived)[0], adapted.time_s(k, derived)[0]
        assert abs(t3 / t2 / FACTOR - 1) < 0.04, name
        notes = [n for n in adapted.describe()["notes"] if f"on {name} (carried from {TARGET}" in n]
        assert len(notes) == 1, name


def test_the_console_script_adapts_in_place_and_refuses_a_tampered_file_in_one_line(tmp_path, toy_set):
    root, rows, _ = toy_set
    data = _dataset(tmp_path, rows, 20)
    work = tmp_path / "set"
    work.mkdir()
    for f in root.iterdir():
        (work / f.name).write_bytes(f.read_bytes())
    done = _cli("train", "adapt", str(data), "--gpu", "H100", "--models", str(work), "--json")  # an alias
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 20
    path = work / "adapt" / f"{TARGET}.json"
    good = path.read_text()
    query = ["predict", "kernel", "--gpu", TARGET, "--op", "gemm", "--dtype", "fp16", "--models", str(work), "--json"]
    query += ["--param", "b=1", "--param", "m=512", "--param", "n=512", "--param", "k=512"]
    ok = _cli(*query)
    assert ok.returncode == 0, ok.stderr
    assert "learned+adapted(n=20)" in ok.stdout
    body = json.loads(good)
    body["log_factor"] = 0.9  # edited by hand: the digest no longer matches
    path.write_text(json.dumps(body))
    bad = _cli(*query)
    assert bad.returncode == 2 and "modified after it was fitted" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    path.write_text("{not json")
    bad = _cli(*query)
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert "re-run opcast train adapt" in bad.stderr and "train fit" not in bad.stderr


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to be an adaptation"),
        (b'{"rows": 1' + b"0" * 5000 + b"}", "thousands of digits, not an adaptation"),
    ],
)
def test_an_unparsable_artifact_asks_for_a_new_adaptation_not_a_refit(tmp_path, toy_set, content, needle):
    """The fix of a broken adapt/<gpu>.json is to re-run train adapt, not to re-fit the whole set
    (which the meta.json reader's messages said)."""
    root, rows, _ = toy_set
    copy = tmp_path / "copy"
    result = adapt_model_set([_dataset(tmp_path, rows, 10)], TARGET, models=root, out=copy)
    result.path.write_bytes(content)
    with pytest.raises(OpcastError, match=needle) as err:
        load_adaptation(load_model_set(copy), TARGET)
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith("re-run opcast train adapt") and "train fit" not in msg


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d.update(log_factor="big"), "log_factor must be"),
        (lambda d: d["groups"].update({"gemm-fwd-half": {"rows": 1, "log_factor": 0.1}}), "slope is missing"),
        (lambda d: d["groups"].update({"nope": {"rows": 1, "log_factor": 0.1, "slope": 0}}), "is not <op>"),
        (lambda d: d.update(format_version=99), "newer than this opcast"),
        (lambda d: d.update(pred_s_range=[1.0, -1.0]), "pred_s_range must be"),
    ],
)
def test_a_malformed_artifact_is_refused_in_one_line(tmp_path, toy_set, edit, needle):
    from opcast.train.artifacts import _body_digest

    root, rows, _ = toy_set
    copy = tmp_path / "copy"
    result = adapt_model_set([_dataset(tmp_path, rows, 10)], TARGET, models=root, out=copy)
    body = json.loads(result.path.read_text())
    edit(body)
    body["sha256"] = _body_digest(body)  # re-hashed: the field checks must catch it
    result.path.write_text(json.dumps(body))
    with pytest.raises(OpcastError, match=needle) as err:
        load_adaptation(load_model_set(copy), TARGET)
    assert "\n" not in str(err.value)


def test_bad_requests_are_refused_before_anything_is_written(tmp_path, toy_set):
    root, rows, _ = toy_set
    data = _dataset(tmp_path, rows, 10)
    with pytest.raises(OpcastError, match="no rows of that device"):
        adapt_model_set([data], "A100-SXM4-80GB", models=root, out=tmp_path / "x")
    with pytest.raises(OpcastError, match="embedded default"):
        adapt_model_set([data], TARGET)
    (tmp_path / "taken").mkdir()
    with pytest.raises(OpcastError, match="not a model set"):
        adapt_model_set([data], TARGET, models=root, out=tmp_path / "taken")
    assert not (tmp_path / "x").exists() and not any((tmp_path / "taken").iterdir())
    done = _cli("train", "adapt", str(data), "--gpu", TARGET)  # the embedded default, no --out
    assert done.returncode == 2 and "--out" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_rows_of_other_devices_are_counted_as_ignored(tmp_path, toy_set):
    root, rows, _ = toy_set
    other = rows.iloc[:7].copy()
    other["device"] = "A100-SXM4-80GB"
    mixed = _dataset(tmp_path, rows, 20)
    write_parquet(other.reset_index(drop=True), mixed / "other.parquet")
    result = adapt_model_set([mixed], TARGET, models=root, out=tmp_path / "adapted")
    assert result.fields["rows"] == 20
    assert result.ignored == {f"measured on another device than {TARGET} (A100-SXM4-80GB)": 7}


@pytest.mark.parametrize("kind", ["folder", "dangling link"])
def test_a_non_file_at_the_artifact_path_is_refused_not_left_out(tmp_path, toy_set, kind):
    """A folder or a link to nothing at adapt/<gpu>.json was taken for no adaptation (the set answered
    unadapted, silently), and re-adapting failed naming its temporary file."""
    root, rows, _ = toy_set
    copy = tmp_path / "copy"
    data = _dataset(tmp_path, rows, 10)
    result = adapt_model_set([data], TARGET, models=root, out=copy)
    result.path.unlink()
    if kind == "folder":
        result.path.mkdir()
    else:
        result.path.symlink_to(tmp_path / "moved_away.json")
    with pytest.raises(OpcastError, match="re-run opcast train adapt") as err:
        load_adaptation(load_model_set(copy), TARGET)
    assert str(result.path) in str(err.value) and ("a folder" if kind == "folder" else "a link to nothing") in str(
        err.value
    )
    if kind == "folder":
        with pytest.raises(OpcastError, match=r"cannot write .*H100-SXM\.json: ") as err:
            adapt_model_set([data], TARGET, models=copy)
        assert ".tmp" not in str(err.value)
        assert [p.name for p in result.path.parent.iterdir()] == [result.path.name]  # no temporary file left


def test_rows_without_a_time_are_counted_by_adapt_and_fit(tmp_path, toy_set):
    """Rows whose time_s_median is NaN, zero, negative or infinite were left out silently: adapt's
    'ignored' and the fit's 'skipped' now count them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from opcast.train.fit import fit_model_set

    root, rows, _ = toy_set
    data = _dataset(tmp_path, rows, 24, name="bad")
    table = pq.read_table(data / "rows.parquet")  # the writer refuses such rows: damage the file it wrote
    times = table.column("time_s_median").to_numpy().copy()
    times[:4] = [float("nan"), 0.0, -1e-5, float("inf")]
    i = table.schema.get_field_index("time_s_median")
    pq.write_table(table.set_column(i, table.schema.field(i), pa.array(times)), data / "rows.parquet")
    result = adapt_model_set([data], TARGET, models=root, out=tmp_path / "adapted")
    assert result.fields["rows"] == 20
    assert result.ignored == {"no positive, finite time_s_median": 4}
    cfg = FitConfig(estimator="xgb", folds=0, n_jobs=1, min_rows=5)
    fit = fit_model_set([data], tmp_path / "sets", name="s", cfg=cfg)
    assert fit.skipped["rows without a time"].startswith("4 rows")


_SIGTERM_MID_COPY = """
import os, signal, sys
import opcast.train.adapt as adapt
from opcast.cli import main

real = adapt.shutil.copytree

def copytree(*args, **kwargs):  # the set is copied, not yet renamed into place: SIGTERM
    done = real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return done

adapt.shutil.copytree = copytree
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_mid_copy_leaves_nothing_behind(tmp_path, toy_set):
    """SIGTERM while train adapt copied the set ended it on the spot and left the hidden temporary copy
    in --out's folder; it is an interrupt now: one line, exit 143, nothing left, and a re-run adapts."""
    root, rows, _ = toy_set
    data = _dataset(tmp_path, rows, 20)
    args = ["train", "adapt", str(data), "--gpu", TARGET, "--models", str(root), "--out", str(tmp_path / "sets" / "a")]
    res = subprocess.run([sys.executable, "-c", _SIGTERM_MID_COPY, *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 143 and res.stderr.strip() == "opcast: terminated (SIGTERM); what was written is kept"
    assert not (tmp_path / "sets").exists() or not any((tmp_path / "sets").iterdir())
    assert _cli(*args).returncode == 0 and (tmp_path / "sets" / "a" / "adapt").is_dir()


SLOWER = 3.0
"""Misaligned tensor-core GEMMs of the target run this much slower again (the H200 measured 1.9-3.7x)."""


def test_misaligned_gemms_get_their_own_group_and_leave_the_aligned_ones_alone(tmp_path, toy_set):
    """A fifth of collect bench's GEMM shapes are odd on purpose; cuBLAS runs those through slower kernels
    (opcast.ops.misaligned_tensor_gemm). Measured that way, they get a correction group of their own, so the
    aligned GEMMs keep the device's factor and the odd ones get theirs -- in fit_correction and through predict."""
    from opcast.predict.cost import kernel, load_kernel_cost
    from opcast.train.artifacts import MISALIGNED_SUFFIX, adaptation_keys, misaligned_rows

    root, rows, _ = toy_set
    ms, target = load_model_set(root), get_device(TARGET)
    gemm = rows[rows["op"] == "gemm"].reset_index(drop=True)
    aligned = gemm.assign(n=(gemm["n"] // 8).clip(lower=1) * 8, k=(gemm["k"] // 8).clip(lower=1) * 8)
    odd = aligned.head(40).assign(k=aligned["k"].head(40) + 1)
    both = pd.concat([aligned, odd], ignore_index=True)
    wrong = misaligned_rows(both)
    assert not wrong[: len(aligned)].any() and wrong[len(aligned) :].all()
    base = ms.predict_s(both, target)
    both["time_s_median"] = base * FACTOR * np.where(wrong, SLOWER, 1.0)
    result = adapt_model_set([_dataset(tmp_path, both, len(both))], TARGET, models=root, out=tmp_path / "adapted")
    group = f"gemm-fwd-half{MISALIGNED_SUFFIX}"
    assert set(result.fields["groups"]) == {"gemm-fwd-half", group}
    adapted = load_adaptation(load_model_set(tmp_path / "adapted"), TARGET)
    assert adapted is not None
    keys = adaptation_keys(group_key_array(both), wrong)
    ratio = adapted.apply(keys, base, both) / base
    assert np.all(np.abs(ratio[~wrong] / FACTOR - 1) < 0.05), ratio[~wrong]
    assert np.all(np.abs(ratio[wrong] / (FACTOR * SLOWER) - 1) < 0.15), ratio[wrong]
    plain, cost = load_kernel_cost(root), load_kernel_cost(tmp_path / "adapted")
    for k_dim, want in ((2048, FACTOR), (2049, FACTOR * SLOWER)):
        k = kernel("gemm", {"b": 1, "m": 2048, "n": 2048, "k": k_dim}, "fp16")
        got = cost.time_s(k, target)[0] / plain.time_s(k, target)[0]
        assert abs(got / want - 1) < 0.15, (k_dim, got, want)
    # an adaptation fitted on aligned rows only corrects a misaligned GEMM as its predictor group, as before
    only = adapt_model_set(
        [_dataset(tmp_path, aligned, len(aligned), "aligned")], TARGET, models=root, out=tmp_path / "a2"
    )
    assert set(only.fields["groups"]) == {"gemm-fwd-half"}
    cost2 = load_kernel_cost(tmp_path / "a2")
    odd_k = kernel("gemm", {"b": 1, "m": 2048, "n": 2048, "k": 2049}, "fp16")
    assert abs(cost2.time_s(odd_k, target)[0] / plain.time_s(odd_k, target)[0] / FACTOR - 1) < 0.05


def test_the_misalignment_rule_by_hand():
    from opcast.ops import misaligned_tensor_gemm as mis

    assert mis(4096, 4095, "bf16", True) and mis(4095, 4096, "fp16", True)  # 16 bytes: 8 half elements
    assert not mis(4096, 4096, "bf16", True) and not mis(8, 8, "bf16", True)
    assert not mis(4095, 4095, "fp32", False)  # CUDA-core SGEMM: any size
    assert mis(4096, 8, "fp8", True) and not mis(4096, 16, "fp8", True)  # 16 one-byte elements
    assert not mis(4096, 4, "tf32", True) and mis(4096, 2, "tf32", True)
    assert mis(64, 16, "nvfp4", True) and not mis(64, 32, "nvfp4", True)
    assert not mis(None, "x", "bf16", True) and not mis(float("nan"), 4096, "bf16", True)
