"""calibrate's budget, noise and interval decisions on a fake clock: every stage replaced by a fake
that takes a stated number of fake seconds and, like the real fresh process, is stopped at its
``timeout_s``. Nothing is timed, so the outcomes are the same on any machine under any load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import opcast.check.isolated as isolated
from opcast.archs import ArchSpec
from opcast.check.calibrate import (
    COLLECT_SKIP_S,
    FIT_MIN_S,
    MIN_BUDGET_S,
    CalibrateConfig,
    StagePlan,
    plan_stages,
    run_calibrate,
)
from opcast.check.calibrate_noise import AnchorTiming
from opcast.errors import OpcastError

TINY = ArchSpec(
    name="tiny",
    family="gpt2",
    n_layers=2,
    hidden=128,
    n_heads=4,
    n_kv_heads=4,
    head_dim=32,
    ffn_hidden=512,
    vocab=512,
    max_seq=256,
    norm="layernorm",
    activation="gelu",
    gated_mlp=False,
    position="learned",
    tied_embeddings=True,
    linear_bias=True,
    parallel_residual=False,
    source="test",
)


def _anchors(spread_x: float = 1.02, median_ms: float = 5.0) -> tuple[AnchorTiming, ...]:
    m = median_ms * 1e-3
    return (AnchorTiming(name="gemm 512^3", median_s=m, p20_s=m / math.sqrt(spread_x), p80_s=m * math.sqrt(spread_x)),)


def _report(arch: str):
    from opcast.check.validate import PhaseCheck, ValidateReport

    phases = tuple(
        PhaseCheck(phase=p, measured_s=1.0, measured_p20_s=1.0, measured_p80_s=1.0, predicted_s=1.1, predicted_as="x")
        for p in ("forward", "backward", "optimizer", "total", "forward_nograd")
    )
    return ValidateReport(
        arch=arch,
        params=1,
        device="cpu-test",
        device_type="cpu",
        precision="fp32",
        attention="flash",
        batch=1,
        seq=64,
        world_size=1,
        threads=1,
        steps=1,
        warmup=0,
        models="m",
        phases=phases,
    )


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Stages:
    """The fake fresh processes: ``seconds[name]`` fake seconds each (default 1), stopped at the timeout."""

    def __init__(self, clock: Clock, **seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.calls: list[tuple[str, float | None]] = []
        self.anchors = [_anchors()]
        """Anchor timings, one per call (the last one repeats)."""
        self.row_spread = 1.05
        self.rows = 40
        self.signal: str | None = None
        """A signal that stops every collection (as collect bench reports one)."""
        self.benches: list = []
        """The BenchConfig of every collection."""

    def __call__(self, fn, *args, timeout_s=None, forward_sigint=False, **kwargs):
        name = fn.__name__
        self.calls.append((name, timeout_s))
        took = self.seconds.get(name, 1.0)
        if timeout_s is not None and took > timeout_s:
            self.clock.t += timeout_s
            value = self._bench(args[0], share=timeout_s / took) if name == "bench_with_progress" else None
            raise isolated.Overran(timeout_s, value)
        self.clock.t += took
        if name == "bench_with_progress":
            self.benches.append(args[0])
        if name == "measure_anchors":
            return self.anchors.pop(0) if len(self.anchors) > 1 else self.anchors[0]
        if name == "run_validate":
            return _report(args[0].name)
        if name == "bench_with_progress":
            return self._bench(args[0], share=1.0)
        if name == "fit_with_progress":
            return self._fit(*args)
        raise AssertionError(name)

    def _bench(self, cfg, share: float):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from opcast.collect.bench import BenchResult

        n = int(self.rows * share)
        run_id = f"run{len(self.calls)}"
        parts = Path(cfg.out) / "bench"
        parts.mkdir(parents=True, exist_ok=True)
        if n:
            pq.write_table(
                pa.table({"time_s_p20": [1.0] * n, "time_s_p80": [self.row_spread] * n}),
                parts / f"rank0000-{run_id}-0000.parquet",
            )
        return BenchResult(
            rows_written=n,
            remaining=self.rows - n,
            planned=self.rows,
            run_id=run_id,
            interrupted=self.signal is not None,
            signal=self.signal,
        )

    def _fit(self, datasets, out, name, cfg, command):
        import pandas as pd

        from opcast.train.fit import FitResult

        path = Path(out) / name
        path.mkdir(parents=True)
        (path / "meta.json").write_text(json.dumps({"name": name, "new": True}))
        groups = pd.DataFrame([{"group": "gemm-fwd-fp32", "rows": 40, "estimator": "xgb", "held_out_mape": 9.0}])
        return FitResult(path=path, groups=groups, holdout=None, seconds=1.0)


@pytest.fixture
def setup(monkeypatch, tmp_path):
    clock = Clock()
    stages = Stages(clock)
    intervals = [{"arch": "tiny", "batch": 1, "seq": 64, "predicted_s": 1.0, "low_s": 0.9, "high_s": 1.3}]
    monkeypatch.setattr(isolated, "in_fresh_process", stages)
    monkeypatch.setattr("opcast.check.calibrate.load_average", lambda: (0.1, 2))
    monkeypatch.setattr("opcast.check.calibrate.default_datasets", lambda: [])
    monkeypatch.setattr("opcast.check.calibrate.check_intervals", lambda *a, **k: [dict(i) for i in intervals])

    def run(**changes):
        cfg = CalibrateConfig(
            out=tmp_path / "cal", archs=(TINY,), seqs=(64,), steps=1, **{"budget_s": 600.0, **changes}
        )
        return run_calibrate(cfg, clock=clock)

    return clock, stages, intervals, run, tmp_path / "cal"


def test_plan_stages_gives_collection_what_is_left_and_drops_the_validations_after_first():
    assert plan_stages(800, budget_s=840, after_s=40, anchors_s=5) == StagePlan(
        collect_s=800 - 67.2 - 40 - 5, fit_s=67.2, after_s=40
    )
    short = plan_stages(60, budget_s=60, after_s=40, anchors_s=5)  # 60 - 10 - 40 - 5 < 20: no validations after
    assert short == StagePlan(collect_s=45, fit_s=10, after_s=0)
    assert plan_stages(12, budget_s=20, after_s=40, anchors_s=0).collect_s == 0  # under 5 s: no collection
    assert plan_stages(-3, budget_s=20, after_s=0, anchors_s=0) == StagePlan(collect_s=0, fit_s=0, after_s=0)


def test_a_quiet_calibration_installs_the_set_and_stays_in_budget(setup):
    clock, stages, _, run, out = setup
    r = run()
    assert r.failure is None and r.models == str(out / "calibrated") and (out / "calibrated" / "meta.json").is_file()
    assert [c for c, _ in stages.calls] == [
        "measure_anchors",
        "run_validate",
        "bench_with_progress",
        "bench_with_progress",
        "measure_anchors",
        "fit_with_progress",
        "run_validate",
    ]
    assert r.checks[0].before is not None and r.checks[0].after is not None and r.budget_cut == ()
    assert clock.t - 1000.0 <= 600 and not (out / ".staging").exists()
    assert json.loads((out / "calibrate.json").read_text())["noise"]["end_verdict"]["noisy"] is False


@pytest.mark.parametrize("budget", [15.0, 20.0, 60.0, 300.0, 840.0])
def test_every_stage_overrunning_never_passes_the_budget(setup, budget):
    """Each stage would take 10x the whole budget: each is stopped at its deadline, and the fake
    clock (the sum of what every stage was allowed) never passes the budget."""
    clock, stages, _, run, out = setup
    stages.seconds = {
        k: 10 * budget for k in ("measure_anchors", "run_validate", "bench_with_progress", "fit_with_progress")
    }
    r = run(budget_s=budget)
    assert clock.t - 1000.0 <= budget + 1e-9, stages.calls
    assert (
        r.budget_cut and r.failure is not None and "--budget-s" in r.failure and "re-run the same command" in r.failure
    )
    assert all(t is not None and t > 0 for _, t in stages.calls)  # every child ran under a deadline
    assert r.models is None and not (out / "calibrated").exists()


def test_a_budget_too_short_to_measure_anything_is_refused_before_any_stage(setup):
    """Under FIT_MIN_S + COLLECT_SKIP_S the plan never collects: --budget-s 1 failed only after start-up."""
    _clock, stages, _, run, out = setup
    for budget in (0.001, 1.0, MIN_BUDGET_S - 0.01):
        with pytest.raises(OpcastError, match=rf"^--budget-s {budget:g} is below 15 s, the least in which calibrate"):
            run(budget_s=budget)
    assert MIN_BUDGET_S == FIT_MIN_S + COLLECT_SKIP_S == 15.0
    assert stages.calls == [] and not out.exists()


def test_the_budget_cuts_the_validations_after_but_keeps_the_set(setup):
    clock, stages, _, run, _out = setup
    stages.seconds = {"run_validate": 30.0, "bench_with_progress": 400.0, "measure_anchors": 3.0}
    r = run(budget_s=200.0)
    assert r.failure is None and r.models is not None
    assert any("collection stopped" in c for c in r.budget_cut)
    assert clock.t - 1000.0 <= 200.0
    assert "budget cut" in " ".join(r.notes)


def test_validations_before_stop_at_their_share(setup):
    _clock, stages, _, run, _out = setup
    stages.seconds = {"run_validate": 1000.0}
    r = run(budget_s=400.0)
    timeout = next(t for name, t in stages.calls if name == "run_validate")
    assert timeout == pytest.approx(0.25 * 400.0 - 0.0, abs=1e-6)  # the share starts after the anchors
    assert any("validate tiny (before) stopped" in c for c in r.budget_cut) and r.checks[0].before is None


def test_a_busy_machine_is_measured_again_then_refused(setup):
    _clock, stages, _, run, out = setup
    stages.anchors = [_anchors(spread_x=2.5)]
    r = run()
    assert [c for c, _ in stages.calls] == ["measure_anchors", "measure_anchors"]
    assert r.failure.startswith("the machine is busy (anchor gemm 512^3 varied 2.50x") and "--allow-busy" in r.failure
    assert r.models is None and not (out / "data").exists()


def test_a_busy_start_that_calms_down_goes_on(setup):
    _clock, stages, _, run, _out = setup
    stages.anchors = [_anchors(spread_x=2.5), _anchors()]
    r = run()
    assert r.failure is None and r.models is not None


def test_load_alone_refuses(setup, monkeypatch):
    _clock, _stages, _, run, _out = setup
    monkeypatch.setattr("opcast.check.calibrate.load_average", lambda: (3.9, 2))
    r = run()
    assert "load average 3.9 on 2 core(s)" in r.failure
    r = run(allow_busy=True)
    assert r.failure is None and any("--allow-busy" in n for n in r.notes)


def test_noisy_rows_fail_and_are_moved_aside_to_be_measured_again(setup):
    _clock, stages, _, run, out = setup
    stages.row_spread = 2.0
    r = run()
    assert r.failure.startswith("the timings were noisy (") and "measures them again" in r.failure
    assert list((out / "data" / "bench").glob("*.parquet")) == [] and len(list((out / "noisy").glob("*.parquet"))) == 2
    assert "fit_with_progress" not in [c for c, _ in stages.calls]


def test_anchor_drift_fails(setup):
    _clock, stages, _, run, _out = setup
    stages.anchors = [_anchors(), _anchors(median_ms=9.0)]
    r = run()
    assert "anchor gemm 512^3 took 5 ms at the start and 9 ms at the end" in r.failure


def test_a_wide_interval_fails_and_keeps_the_previous_set(setup):
    _clock, stages, intervals, run, out = setup
    (out / "calibrated").mkdir(parents=True)
    (out / "calibrated" / "meta.json").write_text('{"old": true}')
    intervals[0].update(low_s=3.6, high_s=203.0)
    r = run()
    assert r.failure.startswith(
        "calibration failed: the 90 % interval of tiny (batch 1 x seq 64) is [3.6 s, 203 s], 56.4x"
    )
    assert json.loads((out / "calibrated" / "meta.json").read_text()) == {"old": True}
    assert json.loads((out / "rejected" / "calibrated" / "meta.json").read_text())["new"] is True
    assert r.models is None and [c for c, _ in stages.calls][-1] == "fit_with_progress"  # no validation after
    assert not (out / ".staging").exists()


def test_allow_busy_keeps_a_wide_interval_as_a_note(setup):
    _clock, _stages, intervals, run, _out = setup
    intervals[0].update(low_s=3.6, high_s=203.0)
    r = run(allow_busy=True)
    assert r.failure is None and r.models is not None and any("56.4x" in n for n in r.notes)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe{}", b'{"k": 1' + b"0" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000],
    ids=["binary", "digits", "nested"],
)
def test_an_unreadable_before_cache_is_validated_again(setup, content):
    """validate-before.json in --out that is not JSON text is an empty cache, as invalid JSON is (a binary file,
    an integer of thousands of digits and a deep nesting were internal errors, exit 1)."""
    _, stages, _, run, out = setup
    out.mkdir(parents=True)
    (out / "validate-before.json").write_bytes(content)
    r = run()
    assert r.failure is None and [c for c, _ in stages.calls].count("run_validate") == 2


@pytest.mark.parametrize(
    ("signal", "code", "head"), [("SIGTERM", 143, "terminated (SIGTERM): "), ("SIGINT", 130, "interrupted: ")]
)
def test_a_signal_during_collection_exits_with_its_own_code_and_line(setup, capsys, signal, code, head):
    """SIGTERM during the collection (passed on to collect bench, which stops and returns what it
    measured) exited 130 with Ctrl-C's line; it is 143 and says 'terminated (SIGTERM)', as elsewhere."""
    from opcast.check.validate import arch_file
    from opcast.cli import main

    _, stages, _, _, out = setup
    stages.signal = signal
    arch = arch_file(TINY, out.parent / "archs")
    argv = ["calibrate", "--out", str(out), "--arch", str(arch), "--seq", "64", "--steps", "1", "--budget-s", "600"]
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(head) and "re-run the same command to resume" in err[-1], err
    assert [c for c, _ in stages.calls][-1] == "bench_with_progress"  # nothing after the stopped collection
    assert json.loads((out / "calibrate.json").read_text())["signal"] == signal


def test_a_check_that_cannot_fit_memory_is_refused_before_any_stage(setup):
    """--batch 100000000 failed both validations on memory only as notes, after a whole collection and
    fit in between; the predicted step's memory is checked first, as validate checks it."""
    from opcast.errors import OpcastError

    _, stages, _, run, out = setup
    with pytest.raises(OpcastError, match=r"batch 100000000 x seq 64 .* GiB by the prediction") as err:
        run(batches=(100_000_000,))
    assert "\n" not in str(err.value) and "--batch" in str(err.value)
    assert stages.calls == [] and not out.exists()


@pytest.mark.parametrize(("ops", "measured"), [((), None), (("gemm",), ("gemm",)), (("gemm", "gemm"), ("gemm",))])
def test_op_chooses_the_kinds_every_collection_measures(setup, ops, measured):
    """--op gemm spends the collection on GEMMs alone (the exact arch shapes and the samples); without it
    every kind the arch's training step prices is measured."""
    from opcast.check.calibrate import needed_ops

    _, stages, _, run, _ = setup
    assert run(ops=ops).failure is None
    assert len(stages.benches) == 2 and all(b.ops == (measured or needed_ops([TINY])) for b in stages.benches)


@pytest.mark.parametrize(
    ("op", "needle"),
    [("gem", "unknown op 'gem'"), ("all_reduce", "collect comm"), ("moe", "no microbenchmark")],
)
def test_op_is_checked_as_collect_bench_checks_it_before_any_stage(setup, op, needle):
    from opcast.errors import OpcastError

    _, stages, _, run, out = setup
    with pytest.raises(OpcastError, match=needle):
        run(ops=(op,))
    assert stages.calls == [] and not out.exists()
