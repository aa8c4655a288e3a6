"""Acceptance test of issue 15: the ``opcast`` console script over a table of hostile inputs.

Every case runs the real console script in a subprocess (no ``CliRunner``: the boundary in
``opcast.cli.main``, the interpreter's exit flush and the environment all take part). A bad
input must end with exit code 2, exactly one non-empty line on stderr and no ``Traceback``
anywhere; a bare group prints its help and exits 2; a valid edge case must give the right
answer. The malformed files are built in a module-scoped temporary folder, and all the cases
run concurrently (four at a time) in one module-scoped fixture, so the table takes well under a
minute; each test only reads its result. No case may start a real measurement: collect and
calibrate cases fail at validation and carry tiny budgets anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

CASE_TIMEOUT_S = 60  # a hang (or a measurement that should never have started) fails, not a stuck suite
ROOF = "--roofline"


def _opcast() -> list[str]:
    script = Path(sys.executable).with_name("opcast")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "opcast"]


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    """Command line after ``opcast``; ``{d}`` is the folder of the malformed files."""
    expect: str = "error"
    """``error`` (exit 2, one line), ``help`` (exit 2, the group's help) or ``ok`` (exit 0 and ``check``)."""
    needles: tuple[str, ...] = ()
    """Substrings the error line must contain (the file, the field, the fix)."""
    env: dict[str, str] = field(default_factory=dict)
    stdout_full: bool = False
    """Run with stdout on a full device: /dev/full where it is one, else a file that cannot grow
    past 1 KiB (``ulimit -f 1``: writes fail with EFBIG, as on a full disk)."""
    fsize_limit_kib: int | None = None
    """``ulimit -f``: writes beyond this many KiB fail with EFBIG (a full disk for the writers)."""
    check: Callable[[Result, Path], None] | None = None
    """For ``ok``: asserts the right answer; for ``error``: a further check (e.g. no temp file left)."""


# --------------------------------------------------------------------------- malformed files

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 1024,
    "vocab_size": 1000,
    "hidden_act": "silu",
}


def _hf(**changes: object) -> str:
    return json.dumps({**LLAMA, **changes})


DEEPSEEK = {
    **LLAMA,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "n_group": 4,
    "topk_group": 2,
}


def _write_dataset(path: Path, device: str = "H100-SXM") -> None:
    from opcast.schema import write_parquet

    rows = [
        {
            "run_id": "r",
            "source": "bench",
            "device": device,
            "timing_method": "cuda_event",
            "op": "gemm",
            "dtype": "bf16",
            "direction": "fwd",
            "b": 1,
            "m": 64 * i,
            "n": 64,
            "k": 64,
            "time_s_median": 1e-5 * i,
        }
        for i in range(1, 9)
    ]
    write_parquet(rows, path)


def _build_files(d: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    w = lambda name, text: (d / name).write_text(text, encoding="utf-8")  # noqa: E731
    # Hugging Face configs (--arch FILE)
    w("act_list.json", _hf(hidden_act=["silu"]))
    w("act_dict.json", _hf(hidden_act={"name": "silu"}))
    w("size_dict.json", _hf(hidden_size={"value": 256}))
    w("size_huge.json", _hf(vocab_size=10**40))
    w("topk_group.json", json.dumps({**DEEPSEEK, "topk_group": 5}))
    w("gemma3_text_list.json", json.dumps({"model_type": "gemma3", "text_config": [1]}))
    w("missing_key.json", json.dumps({k: v for k, v in LLAMA.items() if k != "intermediate_size"}))
    w("nested.json", "[" * 100_000 + "]" * 100_000)
    (d / "binary.json").write_bytes(bytes(range(256)) * 8)
    (d / "binary.csv").write_bytes(bytes(range(256)) * 8)
    w("digits.json", '{"model_type": "llama", "hidden_size": 1' + "0" * 5000 + "}")
    w("key_twice.json", '{"model_type": "llama", "hidden_size": 4096, "hidden_size": 1}')
    (d / "latin1.json").write_bytes('{"model_type": "llama", "name": "caf\xe9"}'.encode("latin-1"))
    (d / "config_dir").mkdir()
    w("config.json", json.dumps(LLAMA))
    # a torch that cannot be imported, first on PYTHONPATH (NO_TORCH): a command that rejects a bad input only
    # after importing torch fails with its ImportError instead of the one-line error
    (d / "notorch" / "torch").mkdir(parents=True)
    w("notorch/torch/__init__.py", 'raise ImportError("torch imported before the input was checked")\n')
    # hardware files (--gpu FILE)
    h100 = json.loads((Path(__file__).resolve().parents[2] / "data" / "hardware" / "H100-SXM.json").read_text())
    w("gpu_missing.json", json.dumps({k: v for k, v in h100.items() if k != "mem_bytes"}))
    w("gpu_dict.json", json.dumps({**h100, "peak_bf16_flops": {"dense": 1e15}}))
    w("gpu_nested.json", "[" * 100_000 + "]" * 100_000)
    (d / "gpu_binary.json").write_bytes(b"\x00\xff\xfe" * 300)
    w("gpu_ok.json", json.dumps({**h100, "name": "my-gpu", "aliases": []}))
    w("gpu_huge.json", json.dumps({**h100, "mem_bytes": 10**400}))
    # parquet datasets
    good = d / "good.parquet"
    _write_dataset(good)
    table = pq.read_table(good)
    meta = dict(table.schema.metadata)
    pq.write_table(
        table.replace_schema_metadata({**meta, b"opcast.schema_version": b"one"}), d / "version_text.parquet"
    )
    pq.write_table(
        table.replace_schema_metadata({**meta, b"opcast.schema_version": b"1e400"}), d / "version_inf.parquet"
    )
    pq.write_table(table.slice(0, 0), d / "no_rows.parquet")
    os.mkfifo(d / "fifo.csv")  # stands in for a device: run as root, --csv /dev/full replaced the node
    os.mkfifo(d / "fifo.json")  # no writer: a reader's open blocks
    # rows outside the op registry (another tool's writer): an op no kind, a gemm of negative m
    edited = lambda name, column, values: pq.write_table(  # noqa: E731
        table.set_column(table.schema.get_field_index(column), column, values), d / name
    )
    edited("op_unknown.parquet", "op", pa.array(["gemm"] * (len(table) - 1) + ["conv2d"]))
    edited("m_negative.parquet", "m", pa.array([-64] * len(table), pa.int64()))
    nullable_op = table.schema.field("op").with_nullable(True)  # a null op: no kind, yet no unknown one either
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("op"), nullable_op, pa.array(["gemm"] * (len(table) - 1) + [None])
        ),
        d / "op_null.parquet",
    )
    (d / "my_gpu_ds").mkdir()  # a device of no catalog entry, beside a run.json that is not text
    _write_dataset(d / "my_gpu_ds" / "part-0.parquet", device="my-gpu")
    (d / "my_gpu_ds" / "run.json").write_bytes(b"\xff\xfe{}")
    w("text.parquet", "this is not parquet\n")
    (d / "bad_parts").mkdir()
    shutil.copy(d / "version_text.parquet", d / "bad_parts" / "part-0.parquet")
    (d / "bad_parts" / "part-1.parquet").write_bytes(b"PAR1" + b"\x00" * 64)
    (d / "no_parts").mkdir()
    # csv tables for predict kernels
    gemm = {"op": "gemm", "dtype": "fp16", "direction": "fwd", "b": 1, "m": 4096, "n": 4096, "k": 4096}
    tc = ["true", "false", "no", "off", "0", "", "yes", "on", "1", "False"]
    pd.DataFrame([{**gemm, "tensor_cores": v} for v in tc]).to_csv(d / "tc_strings.csv", index=False)
    pd.DataFrame([{**gemm, "tensor_cores": "maybe"}]).to_csv(d / "tc_maybe.csv", index=False)
    pd.DataFrame([{**gemm, "dtype": "bf17"}]).to_csv(d / "dtype_bad.csv", index=False)
    pd.DataFrame([{**gemm, "direction": "sideways"}]).to_csv(d / "direction_bad.csv", index=False)
    pd.DataFrame([gemm, {**gemm, "m": "abc"}]).to_csv(d / "m_text.csv", index=False)
    pd.DataFrame([{"dtype": "bf16", "m": 1}]).to_csv(d / "no_op.csv", index=False)
    w("empty.csv", "")
    liger_row = {
        "kernel_name": "rms_norm",
        "kernel_provider": "liger",
        "kernel_operation_mode": "forward",
        "metric_name": "speed",
        "metric_unit": "ms",
        "x_name": "H",
        "x_label": "x",
        "x_value": 1024,
        "y_value_50": 0.1,
        "y_value_20": 0.09,
        "y_value_80": 0.11,
        "extra_benchmark_config_str": '{"M": 1' + "0" * 5000 + "}",
        "gpu_name": "NVIDIA A100-SXM4-80GB",
        "timestamp": "2024-09-03 15:31:39",
        "liger_version": "0.2.1",
    }
    pd.DataFrame([liger_row]).to_csv(d / "liger_digits.csv", index=False)
    label = d / "neusight_binary" / "scripts" / "asplos" / "label" / "Tesla_T4"
    label.mkdir(parents=True)
    (label / "bert_large-inf-512-8.json").write_bytes(b"\xff\xfe{}")
    (d / "neusight_binary" / "scripts" / "asplos" / "data" / "dataset").mkdir(parents=True)
    w("trace_digits.jsonl", '{"arrival_s": 0, "input_tokens": 1' + "0" * 5000 + ', "output_tokens": 5}\n')
    w("trace_e19.jsonl", '{"arrival_s": 0, "input_tokens": 1e19, "output_tokens": 5}\n')
    w("trace_twice.csv", "arrival_s,input_tokens,output_tokens,output_tokens\n0,10,5,500\n")
    w("dup_column.csv", "op,dtype,direction,b,m,n,k,m\ngemm,fp16,fwd,1,64,64,64,4096\n")
    w("ragged.csv", "op,dtype,direction,b,m,n,k\ngemm,fp16,fwd,1,64,64,64,5,6\n")
    (d / "latin1.csv").write_bytes("op,dtype,b,m,n,k\ngemm\xe9,bf16,1,64,64,64\n".encode("latin-1"))
    pd.DataFrame([gemm]).to_csv(d / "one_gemm.csv", index=False)
    pd.DataFrame([{**gemm, "m": 64 * (i + 1)} for i in range(4000)]).to_csv(d / "many_gemms.csv", index=False)
    (d / "kernels_out").mkdir()
    # model sets (--models)
    (d / "models_badmeta").mkdir()
    w("models_badmeta/meta.json", "{ not json")
    (d / "models_digits").mkdir()
    w("models_digits/meta.json", '{"version": 1' + "0" * 5000 + "}")
    (d / "models_listmeta").mkdir()
    w("models_listmeta/meta.json", "[]")
    # cluster files
    w("cluster_bad.json", json.dumps({"nodes": "two", "gpus_per_node": 8}))
    w("cluster_gpu.json", json.dumps({"nodes": 2, "gpus_per_node": 8, "gpu": "A100-SXM4-80GB"}))
    w("cluster_gpu_file.json", json.dumps({"nodes": 1, "gpus_per_node": 8, "gpu": "gpu_ok.json"}))
    dgx = json.loads((Path(__file__).resolve().parents[2] / "data" / "clusters" / "dgx-h100.json").read_text())
    w("cluster_bw_huge.json", json.dumps({**dgx, "name": "mine", "aliases": [], "nic_bw_bytes_per_s": 10**400}))
    # symbolic links that lead nowhere: ls lists them, the messages said 'no such file'
    (d / "loop_a.json").symlink_to("loop_b.json")
    (d / "loop_b.json").symlink_to("loop_a.json")
    (d / "dangling.json").symlink_to("nowhere.json")
    # a file where a folder is expected
    w("not_a_dir", "x")
    # a dataset folder holding one replayed nccl-tests log
    from opcast.collect.replay import run_replay

    run_replay("nccl-tests", REPLAY_FIXTURES / "all_reduce_perf_8xA100.txt", d / "replayed_once")


REPLAY_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    _build_files(d)
    return d


# --------------------------------------------------------------------------- checks of valid edges


def _kernels_tc_check(result: Result, d: Path) -> None:
    got = pd.read_csv(d / "kernels_out" / "tc.csv", keep_default_na=False)
    t = dict(zip(range(len(got)), got["time_s_pred"].astype(float)))
    on, off = t[0], t[1]
    # fp16 on H100 tensor cores (989 TFLOP/s dense) vs CUDA cores (67 TFLOP/s): a big GEMM is far slower
    assert off > 5 * on, (on, off)
    for i in (2, 3, 4, 9):  # no, off, 0, False
        assert t[i] == pytest.approx(off), i
    for i in (5, 6, 7, 8):  # blank (fp16 default: tensor cores), yes, on, 1
        assert t[i] == pytest.approx(on), i


def _json_check(**expected: object) -> Callable[[Result, Path], None]:
    def check(result: Result, d: Path) -> None:
        doc = json.loads(result.out)
        for key, value in expected.items():
            assert doc[key] == value, (key, doc[key])

    return check


def _no_tmp_left(result: Result, d: Path) -> None:
    left = [p.name for p in (d / "kernels_out").iterdir() if p.name.endswith(".tmp")]
    assert not left, left


def _still_a_fifo(path: Path) -> None:
    assert stat.S_ISFIFO(path.stat().st_mode), f"{path} was replaced"


def _nothing_at(path: Path) -> None:
    assert not path.exists(), f"{path} was written"


def _still_all_reduce(result: Result, d: Path) -> None:
    got = pd.read_parquet(d / "replayed_once" / "nccl-tests.parquet")
    assert set(got["op"]) == {"all_reduce"} and len(got) == 25


def _dataset_predicted(result: Result, d: Path) -> None:
    got = pd.read_parquet(d / "kernels_out" / "ds.parquet")
    assert len(got) == 8 and (got["time_s_pred"] > 0).all() and got["time_s_pred"].is_monotonic_increasing
    assert set(got["source_pred"]) == {"roofline"}


def _no_rows(result: Result, d: Path) -> None:
    assert json.loads(result.out) == []


def _notes_say(result: Result, text: str) -> None:
    assert any(text in note for note in json.loads(result.out)["notes"]), result.out[-2000:]


def _no_slo_named(result: Result, d: Path) -> None:
    assert "SLO" not in result.err, result.err


def _arch_list_check(result: Result, d: Path) -> None:
    names = {row["name"] for row in json.loads(result.out)}
    assert {"llama2-7b", "gpt3-175b", "mixtral-8x7b"} <= names


def _arch_show_check(result: Result, d: Path) -> None:
    doc = json.loads(result.out)
    assert (doc["hidden"], doc["n_layers"], doc["activation"]) == (256, 2, "silu")


# --------------------------------------------------------------------------- the table

TRAIN = ("predict", "train", "--gpu", "H100-SXM", ROOF)
INFER = ("predict", "infer", "--gpu", "H100-SXM", ROOF)
SEARCH_SERVE = (
    *("search", "serve", "--gpu", "H100-SXM", ROOF, "--gpus", "2"),
    *("--rate", "5", "--num-requests", "20", "--objective", "throughput"),
)
"""A small ``search serve`` on two H100s; a case adds its --arch and the bad input."""
KERNEL = (
    "predict",
    "kernel",
    "--gpu",
    "H100-SXM",
    "--op",
    "gemm",
    "--param",
    "b=1",
    "--param",
    "m=64",
    "--param",
    "n=64",
    "--param",
    "k=64",
)
SEARCH = ("search", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "8", "--seq", "1024")
BENCH = (
    "collect",
    "bench",
    "--out",
    "{d}/bench_out",
    "--budget-s",
    "0.5",
    "--samples",
    "2",
    "--op",
    "gemm",
    "--dtype",
    "fp32",
    "--rep-s",
    "0.01",
    "--warmup-s",
    "0.01",
)
CALIB = ("calibrate", "--out", "{d}/calib_out", "--budget-s", "15", "--steps", "1")  # the least it takes
VALIDATE = ("validate", "--batch", "1", "--seq", "16", "--layers", "1", "--steps", "1", "--warmup", "0")
SERVE = ("predict", "serve", "--arch", "gpt3-125m", "--gpu", "H100-SXM", ROOF, "--rate", "5", "--num-requests", "20")
NO_TORCH = {"PYTHONPATH": "{d}/notorch"}
"""Env of a case whose bad input must be refused before torch is imported (seconds of start-up)."""
EXPLORE = ("explore", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM")
KERNELS = ("predict", "kernels", "--gpu", "H100-SXM", ROOF, "--out", "{d}/kernels_out/out.csv")


def _c(id: str, *args: str, **kw: object) -> Case:
    return Case(id=id, args=tuple(args), **kw)  # type: ignore[arg-type]


CASES: list[Case] = [
    # ---- the command line itself: typos, unknown flags, missing options, wrong types, bare groups
    _c("typo-root", "predcit"),
    _c("typo-predict", "predict", "trian", "--arch", "gpt3-125m"),
    _c("typo-collect", "collect", "bnech"),
    _c("unknown-flag", *TRAIN, "--arch", "gpt3-125m", "--tensor-paralel", "2"),
    _c(
        "search-nodes-spelled-as-predict",
        *SEARCH,
        "--nodes",
        "2",
        needles=("No such option: --nodes", "total GPU count as --gpus"),
    ),
    _c("missing-required", "predict", "infer", "--arch", "gpt3-125m", needles=("--gpu",)),
    _c("tp-abc", *TRAIN, "--arch", "gpt3-125m", "--tp", "abc", needles=("--tp",)),
    _c("bare-root", expect="help"),
    _c("bare-predict", "predict", expect="help"),
    _c("bare-train", "train", expect="help"),
    _c("bare-explore", "explore", expect="help"),
    # ---- numbers: zero, negative, nan, inf
    _c("train-tp-zero", *TRAIN, "--arch", "gpt3-125m", "--tp", "0", needles=("tp=0",)),
    _c("train-seq-negative", *TRAIN, "--arch", "gpt3-125m", "--seq", "-1", needles=("seq=-1",)),
    _c(
        "train-recompute-module-typo",
        *TRAIN,
        "--arch",
        "deepseek-v3",
        "--recompute",
        "selective:mla_up_prj",
        needles=("'mla_up_prj' is not a recompute module", "mla_up_proj"),
    ),
    _c("train-coverage-nan", *TRAIN, "--arch", "gpt3-125m", "--coverage", "nan", needles=("--coverage",)),
    _c(
        "search-gpus-zero",
        "search",
        "--arch",
        "gpt3-125m",
        "--gpu",
        "H100-SXM",
        "--gpus",
        "0",
        "--global-batch",
        "8",
        "--seq",
        "1024",
        ROOF,
        needles=("gpus=0",),
    ),
    _c("search-price-inf", *SEARCH, ROOF, "--gpu-hour-price", "inf", needles=("--gpu-hour-price",)),
    _c("search-workers-zero", *SEARCH, ROOF, "--workers", "0", needles=("workers",)),
    _c("search-framework-typo", *SEARCH, ROOF, "--framework", "megatorn", needles=("megatorn", "megatron")),
    _c(
        "search-pp-partition-unsearched",
        *SEARCH,
        ROOF,
        "--pp-partition",
        "uniform",
        needles=("--pp-partition uniform", "megatron:embedding,loss", "predict train"),
    ),
    _c(
        "search-param-gather-without-grad-overlap",
        *SEARCH,
        ROOF,
        "--overlap-param-gather",
        "--no-overlap-grad-reduce",
        needles=("--overlap-param-gather needs --overlap-grad-reduce",),
    ),
    _c("search-fix-unreached", *SEARCH, ROOF, "--fix", "tp=2,3", needles=("--fix tp=3 is never searched", "8 GPUs")),
    _c("search-fix-ep-dense", *SEARCH, ROOF, "--fix", "ep=2", needles=("--fix ep=2 is never searched", "gpt3-125m")),
    _c(
        "search-csv-fifo",
        *SEARCH,
        ROOF,
        "--csv",
        "{d}/fifo.csv",
        needles=("fifo.csv is not a regular file",),
        check=lambda r, d: _still_a_fifo(d / "fifo.csv"),
    ),
    _c(
        "search-csv-suffix",
        *SEARCH,
        ROOF,
        "--csv",
        "{d}/table.json",
        needles=("--csv", "table.json: give a file name ending in .csv"),
        check=lambda r, d: _nothing_at(d / "table.json"),
    ),
    _c("search-top-huge", *SEARCH, ROOF, "--top", "100000", needles=("--top 100000 is past the 1,000", "--csv")),
    # counts under 2**63 whose divisors the search would enumerate for minutes
    _c(
        "search-gpus-huge",
        *SEARCH,
        ROOF,
        "--gpus",
        "963761198400",
        "--gpus-per-node",
        "1",
        needles=("--gpus 963761198400 is past",),
    ),
    _c(
        "search-fix-twice",
        *SEARCH,
        ROOF,
        "--fix",
        "tp=1",
        "--fix",
        "tp=2",
        needles=("--fix tp is given twice", "--fix tp=V,V"),
    ),
    _c(
        "search-global-batch-huge",
        *SEARCH,
        ROOF,
        "--global-batch",
        "963761198400",
        needles=("--global-batch 963761198400",),
    ),
    _c(
        "train-world-past-int64",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--nodes",
        str(2**62),
        "--gpus-per-node",
        "8",
        needles=("past 2**63",),
    ),
    _c(
        "kernel-param-nan",
        "predict",
        "kernel",
        "--gpu",
        "H100-SXM",
        "--op",
        "gemm",
        "--param",
        "b=1",
        "--param",
        "m=nan",
        "--param",
        "n=64",
        "--param",
        "k=64",
        ROOF,
        needles=("m=",),
    ),
    _c(
        "kernel-param-twice",
        *KERNEL,
        ROOF,
        "--param",
        "m=4096",
        needles=("--param m is given twice ('64', then '4096')",),
    ),
    _c("kernel-set-nan", *KERNEL, ROOF, "--set", "mem_bw_bytes_per_s=nan", needles=("mem_bw_bytes_per_s",)),
    _c(
        "explore-vary-negative",
        *EXPLORE,
        "--vary",
        "mem_bw_bytes_per_s=1,-2",
        ROOF,
        needles=("mem_bw_bytes_per_s",),
    ),
    _c(
        "explore-vary-overflows",
        *EXPLORE,
        "--vary",
        "peak_bf16_flops=1,1e300",
        ROOF,
        needles=("the factor 1e+300 takes peak_bf16_flops past its largest value", "give a factor below"),
    ),
    _c(
        "compare-unknown-gpu",
        "compare",
        "infer",
        "--arch",
        "gpt3-125m",
        "--gpus",
        "H100-SXM,H1000",
        ROOF,
        needles=("H1000",),
    ),
    _c(
        "compare-too-many-gpus",
        "compare",
        "train",
        "--arch",
        "gpt3-125m",
        "--gpus",
        ",".join(f"H100-SXM[sm_count={i}]" for i in range(1, 5000)),
        ROOF,
        needles=("--gpus names 4999 GPUs (> 4096, each a full prediction)",),
    ),
    _c(
        "serve-block-size-huge",
        *SERVE,
        "--block-size",
        "100000000",
        needles=("--block-size 100000000 must lie in [1, 256] tokens",),
    ),
    # ---- infeasible configurations: every reason of every class in the one line
    _c(
        "train-infeasible-every-class",
        "predict",
        "train",
        "--arch",
        "llama2-7b",
        "--gpu",
        "T4",
        "--tp",
        "3",
        "--pp",
        "40",
        ROOF,
        needles=("T4 has no bf16 peak", "tp=3", "pp=40"),
    ),
    _c(
        "infer-infeasible-every-class",
        "predict",
        "infer",
        "--arch",
        "llama2-7b",
        "--gpu",
        "T4",
        "--tp",
        "3",
        "--pp",
        "40",
        ROOF,
        needles=("T4 has no bf16 peak", "tp=3", "pp=40"),
    ),
    _c(
        "train-infeasible-device-and-memory",
        "predict",
        "train",
        "--arch",
        "llama2-70b",
        "--gpu",
        "T4",
        ROOF,
        needles=("T4 has no bf16 peak", "does not fit"),
    ),
    _c(
        "train-precision-bad", *TRAIN, "--arch", "gpt3-125m", "--precision", "fp9", "--tp", "5", needles=("fp9", "tp=5")
    ),
    # ---- --models with --roofline: refused wherever both are taken
    _c(
        "models-roofline-train", *TRAIN, "--arch", "gpt3-125m", "--models", "models", needles=("--models", "--roofline")
    ),
    _c(
        "models-roofline-kernels",
        *KERNELS,
        "{d}/one_gemm.csv",
        "--models",
        "models",
        needles=("--models", "--roofline"),
    ),
    _c("models-roofline-search", *SEARCH, ROOF, "--models", "models", needles=("--models", "--roofline")),
    _c(
        "models-roofline-explore",
        "explore",
        "infer",
        "--arch",
        "gpt3-125m",
        "--gpu",
        "H100-SXM",
        "--vary",
        "mem_bw_bytes_per_s=1,2",
        ROOF,
        "--models",
        "models",
        needles=("--models", "--roofline"),
    ),
    _c(
        "models-roofline-compare",
        "compare",
        "train",
        "--arch",
        "gpt3-125m",
        "--gpus",
        "A100-SXM4-80GB,H100-SXM",
        ROOF,
        "--models",
        "models",
        needles=("--models", "--roofline"),
    ),
    # ---- malformed arch configs (--arch FILE); the value variants are unit tests (tests/unit/test_archs.py)
    _c("arch-act-list", "arch", "show", "{d}/act_list.json", needles=("act_list.json", "hidden_act")),
    _c("arch-act-dict", *TRAIN, "--arch", "{d}/act_dict.json", needles=("act_dict.json", "hidden_act")),
    _c("arch-size-dict", *INFER, "--arch", "{d}/size_dict.json", needles=("size_dict.json", "hidden_size")),
    _c(
        "infer-engine-version",
        *INFER,
        "--arch",
        "gpt-oss-20b",
        "--engine",
        "vllm",
        "--engine-version",
        "0.x",
        needles=("--engine-version '0.x'", "MAJOR.MINOR"),
    ),
    _c("infer-kv-dtype", *INFER, "--arch", "gpt3-125m", "--kv-dtype", "fp4", needles=("kv_dtype='fp4'", "fp8")),
    _c(
        "infer-kv-dtype-no-fp8",
        "predict",
        "infer",
        "--gpu",
        "A100-SXM4-80GB",
        ROOF,
        "--arch",
        "gpt3-125m",
        "--kv-dtype",
        "fp8",
        needles=("kv_dtype=fp8 needs a GPU with fp8", "A100"),
    ),
    # vLLM's compile-time fusions: a name or limit it does not take, or another engine
    _c(
        "infer-fusions-name",
        *INFER,
        "--arch",
        "gpt3-125m",
        "--engine",
        "vllm",
        "--fusions",
        "allreduce_rms,fuse_everything",
        needles=("--fusions 'fuse_everything'", "allreduce_rms, attn_quant"),
    ),
    _c(
        "serve-fusions-limit",
        "predict",
        "serve",
        "--gpu",
        "H100-SXM",
        "--arch",
        "gpt3-125m",
        ROOF,
        "--engine",
        "vllm",
        "--rate",
        "5",
        "--num-requests",
        "20",
        "--fusions",
        "allreduce_rms:-8",
        needles=("--fusions 'allreduce_rms:-8'", "positive number of MiB"),
    ),
    _c(
        "infer-fusions-engine",
        *INFER,
        "--arch",
        "gpt3-125m",
        "--engine",
        "trtllm",
        "--fusions",
        "attn_quant",
        needles=("vLLM's compile passes", "--engine vllm"),
    ),
    _c(
        "search-serve-fusions-engine",
        *SEARCH_SERVE,
        "--arch",
        "gpt3-125m",
        "--engine",
        "sglang",
        "--fusions",
        "allreduce_rms",
        needles=("vLLM's compile passes", "--engine vllm"),
    ),
    # how MXFP4 experts run: a name vLLM lacks, a model without them, Marlin under TensorRT-LLM, MXFP8 on Hopper
    _c(
        "infer-mxfp4-moe-name",
        *INFER,
        "--arch",
        "gpt-oss-20b",
        "--engine",
        "vllm",
        "--mxfp4-moe",
        "cutlass",
        needles=("--mxfp4-moe 'cutlass'", "marlin, bf16, mxfp8"),
    ),
    _c(
        "infer-mxfp4-moe-dense",
        *INFER,
        "--arch",
        "gpt3-125m",
        "--engine",
        "vllm",
        "--mxfp4-moe",
        "marlin",
        needles=("applies to MXFP4 experts", "gpt3-125m has none"),
    ),
    _c(
        "serve-mxfp4-moe-marlin-trtllm",
        "predict",
        "serve",
        "--gpu",
        "H100-SXM",
        "--arch",
        "gpt-oss-20b",
        ROOF,
        "--engine",
        "trtllm",
        "--rate",
        "5",
        "--num-requests",
        "20",
        "--mxfp4-moe",
        "marlin",
        needles=("--mxfp4-moe marlin", "not trtllm's"),
    ),
    _c(
        "search-serve-mxfp4-moe-mxfp8-hopper",
        *SEARCH_SERVE,
        "--arch",
        "gpt-oss-20b",
        "--mxfp4-moe",
        "mxfp8",
        needles=("--mxfp4-moe mxfp8 needs block-scaled", "H100-SXM lacks"),
    ),
    # TensorRT-LLM on an AMD GPU: refused by every command that takes --engine, before any pricing
    *(
        _c(
            f"{name}-trtllm-on-amd",
            *cmd,
            "--arch",
            "gpt3-125m",
            "--gpu",
            "MI300X",
            ROOF,
            "--engine",
            "trtllm",
            *extra,
            needles=("engine=trtllm runs on NVIDIA GPUs only", "MI300X", "--engine vllm or sglang"),
        )
        for name, cmd, extra in (
            ("infer", ("predict", "infer"), ()),
            ("serve", ("predict", "serve"), ("--rate", "5", "--num-requests", "20")),
            (
                "search-serve",
                ("search", "serve"),
                ("--gpus", "2", "--rate", "5", "--num-requests", "20", "--objective", "throughput"),
            ),
        )
    ),
    _c(
        "serve-moe-dispatcher",
        "predict",
        "serve",
        "--arch",
        "qwen3-30b-a3b",
        "--gpu",
        "H100-SXM",
        "--rate",
        "1",
        "--num-requests",
        "10",
        "--moe-dispatcher",
        "deepep",
        needles=("moe_dispatcher='deepep'", "alltoall, flex"),
    ),
    _c(
        "train-clocks",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--clocks",
        "turbo",
        needles=("clocks='turbo'", "sustained, boost"),
    ),
    _c("search-clocks", *SEARCH, "--clocks", "boost-ish", needles=("clocks='boost-ish'", "sustained, boost")),
    _c("arch-size-huge", *TRAIN, "--arch", "{d}/size_huge.json", needles=("size_huge.json", "vocab_size")),
    _c("arch-topk-group", "arch", "show", "{d}/topk_group.json", needles=("topk_group.json", "topk_group=5 exceeds")),
    _c("arch-missing-key", "arch", "show", "{d}/missing_key.json", needles=("missing_key.json", "intermediate_size")),
    _c("arch-nested", "arch", "show", "{d}/nested.json", needles=("nested.json",)),
    # a Gemma 3 text_config that is no object was read as a flat config: eight keys 'missing', one twice
    _c(
        "arch-gemma3-text-config-list",
        "arch",
        "show",
        "{d}/gemma3_text_list.json",
        needles=("gemma3_text_list.json", "text_config=[1] must be a JSON object"),
    ),
    _c("arch-digits", *TRAIN, "--arch", "{d}/digits.json", needles=("digits.json", "more than 4300 digits")),
    _c("arch-empty", *TRAIN, "--arch", "", needles=("--arch is empty",)),
    # it said '--arch is empty' of the positional NAME, which has no such option
    _c("arch-show-empty", "arch", "show", "", needles=("the NAME of opcast arch show is empty", "a preset name")),
    _c(
        "arch-key-twice",
        *TRAIN,
        "--arch",
        "{d}/key_twice.json",
        needles=("key_twice.json", "'hidden_size' more than once"),
    ),
    _c("arch-binary", "arch", "show", "{d}/binary.json", needles=("binary.json", "UTF-8")),
    _c("arch-latin1", "arch", "show", "{d}/latin1.json", needles=("latin1.json", "UTF-8")),
    _c("arch-directory", "arch", "show", "{d}/config_dir", needles=("config_dir",)),
    _c("arch-valid-hf", "arch", "show", "{d}/config.json", expect="ok", check=_arch_show_check),
    _c("validate-arch-nested", *VALIDATE, "--arch", "{d}/nested.json", needles=("nested.json",), env=NO_TORCH),
    _c(
        "bench-arch-act-dict",
        *BENCH,
        "--arch",
        "{d}/act_dict.json",
        needles=("act_dict.json", "hidden_act"),
        env=NO_TORCH,
    ),
    _c("calibrate-arch-binary", *CALIB, "--arch", "{d}/binary.json", needles=("binary.json",), env=NO_TORCH),
    # ---- malformed hardware files (--gpu FILE, hardware show FILE); more in tests/unit/test_hardware.py
    _c("gpu-missing-key", *KERNEL, ROOF, "--gpu", "{d}/gpu_missing.json", needles=("gpu_missing.json", "mem_bytes")),
    _c(
        "gpu-dict",
        *TRAIN[:2],
        "--arch",
        "gpt3-125m",
        "--gpu",
        "{d}/gpu_dict.json",
        ROOF,
        needles=("gpu_dict.json", "peak_bf16_flops"),
    ),
    _c("gpu-nested", "hardware", "show", "{d}/gpu_nested.json", needles=("gpu_nested.json",)),
    _c("gpu-binary", "hardware", "show", "{d}/gpu_binary.json", needles=("gpu_binary.json", "UTF-8")),
    _c("gpu-directory", "hardware", "show", "{d}/config_dir", needles=("config_dir",)),
    _c(
        "gpu-mem-past-float",
        *TRAIN[:2],
        "--arch",
        "gpt3-125m",
        "--gpu",
        "{d}/gpu_huge.json",
        ROOF,
        needles=("gpu_huge.json", "'mem_bytes' is too large", "below 2**63"),
    ),
    _c("gpu-valid-file", "hardware", "show", "{d}/gpu_ok.json", expect="ok", check=_json_check(name="my-gpu")),
    _c(
        "cluster-bad", *TRAIN, "--arch", "gpt3-125m", "--cluster", "{d}/cluster_bad.json", needles=("cluster_bad.json",)
    ),
    _c(
        "cluster-gpu-beside-another-gpu",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--cluster",
        "{d}/cluster_gpu.json",
        needles=("names gpu A100-SXM4-80GB, --gpu names H100-SXM", "give one GPU"),
    ),
    # a device file named relative to the cluster file was looked up in the working directory
    _c(
        "cluster-gpu-file-beside",
        "predict",
        "train",
        "--arch",
        "gpt3-125m",
        "--cluster",
        "{d}/cluster_gpu_file.json",
        ROOF,
        "--json",
        expect="ok",
        check=_json_check(gpu="my-gpu"),
    ),
    _c(
        "cluster-nodes-past-int64",
        *SEARCH[:5],
        *SEARCH[7:],
        "--cluster",
        "1" + "0" * 30 + "x8",
        ROOF,
        needles=("below 2**63",),
    ),
    _c(
        "cluster-bw-past-float",
        *TRAIN[:2],
        "--arch",
        "gpt3-125m",
        "--cluster",
        "{d}/cluster_bw_huge.json",
        ROOF,
        needles=("cluster_bw_huge.json", "'nic_bw_bytes_per_s' must be a positive number"),
    ),
    # ---- parquet datasets
    _c("parquet-version-text", "collect", "info", "{d}/version_text.parquet", needles=("version_text.parquet",)),
    _c("parquet-version-inf", "train", "eval", "{d}/version_inf.parquet", needles=("version_inf.parquet",)),
    _c("parquet-text", "train", "fit", "{d}/text.parquet", "--out", "{d}/fit_out", needles=("text.parquet",)),
    _c(
        "parquet-csv-given",
        "train",
        "fit",
        "{d}/one_gemm.csv",
        "--out",
        "{d}/fit_csv_out",
        needles=("one_gemm.csv", "not a readable parquet file", "opcast collect replay"),
        check=lambda r, d: _nothing_at(d / "fit_csv_out"),
    ),
    _c("parquet-bad-parts", "collect", "info", "{d}/bad_parts", needles=("bad_parts",)),
    _c("parquet-no-rows-info", "collect", "info", "{d}/no_rows.parquet", "--json", expect="ok", check=_no_rows),
    _c(
        "parquet-no-rows-fit",
        "train",
        "fit",
        "{d}/no_rows.parquet",
        "--out",
        "{d}/fit_no_rows_out",
        needles=("no_rows.parquet", "holds no rows"),
    ),
    _c("parquet-empty-dir", "train", "eval", "{d}/no_parts", needles=("no_parts",)),
    _c(
        "parquet-op-unknown-eval", "train", "eval", "{d}/op_unknown.parquet", needles=("op_unknown.parquet", "'conv2d'")
    ),
    _c(
        "parquet-op-null-info",
        "collect",
        "info",
        "{d}/op_null.parquet",
        needles=("op_null.parquet", "column op (op kind (opcast.ops registry)) is null in 1 row(s)"),
    ),
    _c(
        "parquet-m-negative-info",
        "collect",
        "info",
        "{d}/m_negative.parquet",
        needles=("m_negative.parquet", "m is -64"),
    ),
    _c(
        "parquet-m-negative-eval", "train", "eval", "{d}/m_negative.parquet", needles=("m_negative.parquet", "m is -64")
    ),
    _c("dataset-device-file", "collect", "info", "/dev/null", needles=("/dev/null is not a regular file or a folder",)),
    _c(
        "fit-run-json-binary",
        "train",
        "fit",
        "{d}/my_gpu_ds",
        "--out",
        "{d}/fit_my_gpu_out",
        needles=("'my-gpu' of the dataset is neither in the hardware catalog",),
        check=lambda r, d: _nothing_at(d / "fit_my_gpu_out"),
    ),
    # ---- tables for predict kernels
    _c("kernels-tc-maybe", *KERNELS, "{d}/tc_maybe.csv", needles=("row 0", "tensor_cores")),
    _c("kernels-dtype-bad", *KERNELS, "{d}/dtype_bad.csv", needles=("row 0", "bf17")),
    _c("kernels-direction-bad", *KERNELS, "{d}/direction_bad.csv", needles=("row 0", "sideways")),
    _c("kernels-m-text", *KERNELS, "{d}/m_text.csv", needles=("row 1", "abc")),
    _c("kernels-no-op", *KERNELS, "{d}/no_op.csv", needles=("op",)),
    _c("kernels-dup-column", *KERNELS, "{d}/dup_column.csv", needles=("dup_column.csv", "'m' appears more than once")),
    _c("kernels-ragged-row", *KERNELS, "{d}/ragged.csv", needles=("ragged.csv", "more cells than the header")),
    _c("kernels-empty-csv", *KERNELS, "{d}/empty.csv", needles=("empty.csv",)),
    _c("kernels-latin1-csv", *KERNELS, "{d}/latin1.csv", needles=("latin1.csv",)),
    _c("kernels-text-parquet", *KERNELS, "{d}/text.parquet", needles=("text.parquet",)),
    _c(
        "kernels-out-bad-suffix",
        "predict",
        "kernels",
        "{d}/one_gemm.csv",
        "--gpu",
        "H100-SXM",
        ROOF,
        "--out",
        "{d}/kernels_out/out.txt",
        needles=(".csv",),
    ),
    _c(
        "kernels-tc-strings",
        "predict",
        "kernels",
        "{d}/tc_strings.csv",
        "--gpu",
        "H100-SXM",
        ROOF,
        "--out",
        "{d}/kernels_out/tc.csv",
        expect="ok",
        check=_kernels_tc_check,
    ),
    _c(
        "kernels-dataset-parquet",
        "predict",
        "kernels",
        "{d}/good.parquet",
        "--gpu",
        "H100-SXM",
        ROOF,
        "--out",
        "{d}/kernels_out/ds.parquet",
        expect="ok",
        check=_dataset_predicted,
    ),
    _c(
        "kernels-full-disk",
        "predict",
        "kernels",
        "{d}/many_gemms.csv",
        "--gpu",
        "H100-SXM",
        ROOF,
        "--out",
        "{d}/kernels_out/full.csv",
        fsize_limit_kib=16,
        needles=("full.csv",),
        check=_no_tmp_left,
    ),
    _c(
        "search-csv-full-disk",
        *SEARCH,
        ROOF,
        "--csv",
        "{d}/kernels_out/search.csv",
        fsize_limit_kib=1,
        needles=("search.csv",),
        check=_no_tmp_left,
    ),
    # ---- model sets (--models)
    _c("models-missing", *KERNEL, "--models", "{d}/no_such_models", needles=("no_such_models",)),
    _c("models-file", *KERNEL, "--models", "{d}/one_gemm.csv", needles=("one_gemm.csv",)),
    _c(
        "models-bad-meta",
        "train",
        "eval",
        "{d}/good.parquet",
        "--models",
        "{d}/models_badmeta",
        needles=("models_badmeta",),
    ),
    _c(
        "models-list-meta",
        *INFER[:2],
        "--gpu",
        "H100-SXM",
        "--arch",
        "gpt3-125m",
        "--models",
        "{d}/models_listmeta",
        needles=("models_listmeta",),
    ),
    # ---- collect, train, validate, calibrate: fail at validation, before any measurement
    _c(  # refused before torch's start-up and before the --out folder (and its writer's lock file) is made
        "bench-op-typo",
        "collect",
        "bench",
        "--out",
        "{d}/bench_typo",
        "--op",
        "gem",
        "--budget-s",
        "1",
        env=NO_TORCH,
        needles=("unknown op 'gem'", "known ops: gemm"),
        check=lambda r, d: _nothing_at(d / "bench_typo"),
    ),
    _c("bench-max-point-negative", *BENCH, "--max-point-s", "-1", needles=("--max-point-s",)),
    _c("bench-rep-nan", *BENCH, "--rep-s", "nan", needles=("--rep-s",)),
    _c(  # a timing protocol typo: refused before torch's start-up, and no folder is made
        "bench-timing-typo",
        "collect",
        "bench",
        "--out",
        "{d}/bench_timing",
        "--timing",
        "neusite",
        env=NO_TORCH,
        needles=("--timing takes opcast or neusight, got 'neusite'",),
        check=lambda r, d: _nothing_at(d / "bench_timing"),
    ),
    _c("bench-budget-nan", *BENCH, "--budget-s", "nan", needles=("--budget-s",)),
    _c(  # a --tp no arch can split by measured none of its shapes, without a word
        "bench-tp-fits-no-arch",
        *BENCH,
        "--arch",
        "llama2-7b",
        "--tp",
        "3",
        env=NO_TORCH,
        needles=("--tp 3 fits none of the --arch models", "n_heads=32", "choose tp in 1, 2, 4, 8"),
    ),
    _c("bench-tp-without-arch", *BENCH, "--tp", "2", env=NO_TORCH, needles=("give --arch too",)),
    _c("bench-local-world-zero", *BENCH, env={"LOCAL_WORLD_SIZE": "0"}, needles=("LOCAL_WORLD_SIZE",)),
    _c("bench-rank-abc", *BENCH, env={"RANK": "abc", "WORLD_SIZE": "2"}, needles=("RANK",)),
    _c(
        "comm-rank-abc",
        "collect",
        "comm",
        "--out",
        "{d}/comm_out",
        "--iters",
        "1",
        "--max-bytes",
        "1024",
        env={"RANK": "abc", "WORLD_SIZE": "2"},
        needles=("RANK",),
    ),
    # ---- collect comm: its options are checked outside torchrun (they were hidden behind 'must run under torchrun')
    *(
        _c(f"comm-{what}", "collect", "comm", "--out", "{d}/comm_out", *args, needles=needles, env=NO_TORCH)
        for what, args, needles in [
            ("op-typo", ("--op", "all_reduse"), ("all_reduse",)),
            ("op-not-a-collective", ("--op", "gemm"), ("gemm is not a collective",)),
            ("backend-bad", ("--backend", "mpi"), ("--backend 'mpi'",)),
            ("dtype-bad", ("--dtype", "fp9"), ("'fp9'",)),
            ("sizes-reversed", ("--min-bytes", "100", "--max-bytes", "10"), ("--min-bytes (100)",)),
            ("out-dev-null", ("--out", "/dev/null"), ("--out /dev/null is a file",)),  # was 'must run under torchrun'
            ("out-under-a-file", ("--out", "{d}/good.parquet/x"), ("which is a file",)),
            ("gloo-fp8", ("--dtype", "fp8"), ("--backend gloo has no fp8 collectives",)),  # failed after launch
            ("iters-huge", ("--iters", "1000000000000"), ("--iters takes 1 to 10,000", "1000000000000")),
            ("warmup-iters-huge", ("--warmup-iters", "10001"), ("--warmup-iters 0 to 10,000", "10001")),
            ("iters-zero", ("--iters", "0"), ("--iters takes 1 to 10,000",)),
            ("max-bytes-huge", ("--max-bytes", str(10**30)), (f"--max-bytes {10**30}", "8 GiB")),
            ("max-bytes-past-8gib", ("--max-bytes", str(2**33 + 1)), (f"--max-bytes {2**33 + 1}",)),
            ("cluster-unknown", ("--cluster", "nope"), ("cluster 'nope'",)),
            (
                "cluster-dev-null",
                ("--cluster", "/dev/null"),
                ("/dev/null is not a regular file", "the cluster file"),
            ),  # 'unknown cluster'
            ("cluster-folder", ("--cluster", "{d}"), ("is a folder",)),
        ]
    ),
    _c(
        "replay-unknown-source",
        "collect",
        "replay",
        "foo",
        "{d}/one_gemm.csv",
        "--out",
        "{d}/replay_out",
        needles=("foo",),
    ),
    _c(
        "replay-symlink-loop",
        "collect",
        "replay",
        "nccl-tests",
        "{d}/loop_a.json",
        "--out",
        "{d}/replay_out",
        needles=("loop_a.json is a loop of symbolic links",),
    ),
    _c("gpu-symlink-loop", "hardware", "show", "{d}/loop_a.json", needles=("is a loop of symbolic links",)),
    _c(
        "arch-symlink-dangling",
        "arch",
        "show",
        "{d}/dangling.json",
        needles=("dangling.json is a symbolic link to 'nowhere.json', which does not exist",),
    ),
    _c(
        "replay-kineto-nested",
        "collect",
        "replay",
        "kineto",
        "{d}/nested.json",
        "--out",
        "{d}/replay_out",
        "--device",
        "H100-SXM",
        needles=("nested.json",),
    ),
    _c(
        "replay-kineto-digits",
        "collect",
        "replay",
        "kineto",
        "{d}/digits.json",
        "--out",
        "{d}/replay_digits_out",
        "--device",
        "H100-SXM",
        needles=("digits.json", "thousands of digits"),
        check=lambda r, d: _nothing_at(d / "replay_digits_out"),
    ),
    _c(
        "models-digits-meta",
        *INFER[:2],
        "--gpu",
        "H100-SXM",
        "--arch",
        "gpt3-125m",
        "--models",
        "{d}/models_digits",
        needles=("models_digits", "meta.json", "thousands of digits"),
    ),
    _c("info-missing", "collect", "info", "{d}/nope.parquet", needles=("nope.parquet",)),
    _c(
        "fit-estimator-bad",
        "train",
        "fit",
        "{d}/good.parquet",
        "--out",
        "{d}/fit_out",
        "--estimator",
        "foo",
        needles=("foo",),
    ),
    _c("fit-out-is-file", "train", "fit", "{d}/good.parquet", "--out", "{d}/not_a_dir", needles=("not_a_dir",)),
    # ---- train adapt: a bad --gpu file was reported as 'no rows of that device in the datasets'
    *(
        _c(f"adapt-gpu-{what}", "train", "adapt", "{d}/good.parquet", "--gpu", gpu, "--out", "{d}/adapt_out", needles=n)
        for what, gpu, n in [
            ("dev-null", "/dev/null", ("/dev/null is not a regular file",)),
            ("folder", "{d}", ("is a folder",)),
            ("binary", "{d}/gpu_binary.json", ("gpu_binary.json", "not UTF-8")),
            ("unknown", "no-such-gpu", ("unknown GPU 'no-such-gpu'",)),
        ]
    ),
    # ---- an empty or blank path is refused, not taken as the current folder (Path("") is ".")
    _c("fit-out-empty", "train", "fit", "{d}/good.parquet", "--out", "", needles=("--out", "empty path")),
    _c("calibrate-out-empty", *CALIB, "--out", "", needles=("--out", "empty path"), env=NO_TORCH),
    _c("bench-out-empty", *BENCH, "--out", "", needles=("--out", "empty path"), env=NO_TORCH),
    _c("eval-models-blank", "train", "eval", "{d}/good.parquet", "--models", " ", needles=("--models", "blank path")),
    _c("eval-dataset-empty", "train", "eval", "", needles=("dataset", "empty path")),
    # ---- rich's :emoji: codes are not rendered in messages: the input is printed as given
    _c("emoji-code-in-a-path", "train", "eval", "{d}/a:fire:b.parquet", needles=("a:fire:b.parquet",)),
    _c("emoji-code-in-a-name", "hardware", "show", "x:smile:y", needles=("'x:smile:y'",)),
    # the message said 'cuda' for cuda:99, and an index of 5,000 digits was int()'s ValueError (exit 1)
    # a setting of a derived GPU name was refused as '--set ...', an option the user never gave
    _c(
        "hardware-show-derived-fraction",
        "hardware",
        "show",
        "H100-SXM[sm_count=1.5]",
        needles=("GPU 'H100-SXM[sm_count=1.5]' (sm_count=1.5): sm_count is a whole number",),
    ),
    # 'local' was matched exactly: 'LOCAL' was an unknown GPU (and a name starting with cuda skipped the catalog)
    _c("hardware-show-local-any-case", "hardware", "show", " LOCAL", expect="ok", check=_json_check(vendor="cpu")),
    _c(
        "hardware-show-derived-memory-1-byte",
        "hardware",
        "show",
        "H100-SXM[mem_bytes=1]",
        needles=("'mem_bytes' must be at least 1 MiB (1048576 bytes), got 1",),
    ),
    _c("hardware-show-cuda-prefix", "hardware", "show", "cudafoo", needles=("unknown GPU 'cudafoo'",)),
    _c("hardware-show-cuda-index", "hardware", "show", "cuda:99", needles=("cuda:99",)),
    _c("hardware-show-cuda-digits", "hardware", "show", "cuda:" + "9" * 5000, needles=("cuda:9999",)),
    _c(
        "validate-batch-zero",
        *VALIDATE[:2],
        "0",
        *VALIDATE[3:],
        "--arch",
        "gpt3-125m",
        needles=("batch",),
        env=NO_TORCH,
    ),
    _c("validate-device-bad", *VALIDATE, "--arch", "gpt3-125m", "--device", "tpu", needles=("tpu",), env=NO_TORCH),
    _c(  # flash attention in fp32 (the defaults) was refused first, as if the device were there
        "validate-device-absent",
        *VALIDATE,
        "--arch",
        "gpt3-125m",
        "--device",
        "cuda:99",
        needles=("--device cuda:99",),
        check=lambda r, d: None if "flash attention" not in r.err else pytest.fail(r.err),
    ),
    _c("calibrate-estimator-bad", *CALIB, "--estimator", "foo", needles=("foo",)),
    _c(  # --op is collect bench's: refused as it refuses it, before torch and before --out is made
        "calibrate-op-typo",
        *CALIB,
        "--out",
        "{d}/calib_op",
        "--op",
        "gem",
        needles=("unknown op 'gem'", "known ops: gemm"),
        env=NO_TORCH,
        check=lambda r, d: _nothing_at(d / "calib_op"),
    ),
    *(  # the set would be installed where calibrate keeps its noisy parts or its rejected sets
        _c(f"calibrate-name-{n}", *CALIB, "--name", n, needles=(f"--name '{n}'", "calibrate's own"), env=NO_TORCH)
        for n in ("noisy", "rejected", "validate-before.json")
    ),
    _c("calibrate-op-collective", *CALIB, "--op", "all_reduce", needles=("all_reduce", "collect comm"), env=NO_TORCH),
    # ---- step counts past MAX_STEPS: 1e11 steps were accepted and would have run for millennia
    _c(
        "validate-steps-huge",
        *VALIDATE,
        "--arch",
        "gpt3-125m",
        "--steps",
        "100000000000",
        needles=("--steps 100000000000", "at most 1,000"),
        env=NO_TORCH,
    ),
    _c(
        "validate-warmup-huge",
        *VALIDATE,
        "--arch",
        "gpt3-125m",
        "--warmup",
        "5000",
        needles=("--warmup 5000", "at most 1,000"),
        env=NO_TORCH,
    ),
    _c(  # a validated check past the machine's memory: refused before anything is measured or written
        "calibrate-batch-huge",
        *CALIB,
        "--out",
        "{d}/calib_big",
        "--batch",
        "100000000",
        needles=("batch 100000000", "GiB by the prediction", "--batch"),
        check=lambda r, d: _nothing_at(d / "calib_big"),
    ),
    _c(
        "calibrate-steps-huge",
        *CALIB,
        "--steps",
        "100000000000",
        needles=("--steps 100000000000", "at most 1,000"),
        env=NO_TORCH,
    ),
    _c("calibrate-budget-nan", "calibrate", "--out", "{d}/calib_out", "--budget-s", "nan", needles=("--budget-s",)),
    _c(
        "calibrate-budget-tiny",
        "calibrate",
        "--out",
        "{d}/calib_out",
        "--budget-s",
        "1",
        needles=("--budget-s 1 is below 15 s", "give --budget-s 15 or more"),
        env=NO_TORCH,
        check=lambda r, d: _nothing_at(d / "calib_out"),
    ),
    # ---- sizes past int64, counts the code divided by, and a --plot folder (issue: the bad-input sweep)
    _c(
        "kernel-param-past-int64",
        *KERNEL[:9],
        "m=1e40",
        *KERNEL[10:],
        needles=("m='1e40' is too large", "below 2**63"),
    ),
    # integers are read exactly: 2**63 - 1 passed through float became 2**63 and was refused as too large
    _c(
        "kernel-param-int64-max",
        *KERNEL[:9],
        f"m={2**63 - 1}",
        *KERNEL[10:],
        ROOF,
        "--json",
        expect="ok",
        check=_json_check(params={"b": 1, "m": 2**63 - 1, "n": 64, "k": 64, "impl": "cublas"}),
    ),
    _c("kernel-param-int64-past", *KERNEL[:9], f"m={2**63}", *KERNEL[10:], needles=(f"m='{2**63}' is too large",)),
    _c(
        "infer-context-past-int64-learned",
        "predict",
        "infer",
        "--arch",
        "llama2-7b",
        "--gpu",
        "H100-SXM",
        "--prompt-len",
        "5000000000000000000",
        "--gen-len",
        "5000000000000000000",
        needles=("does not fit",),
    ),
    _c("infer-gen-len-billion", *INFER, "--arch", "llama2-7b", "--gen-len", "1000000000", needles=("does not fit",)),
    _c(
        "train-nodes-past-int64",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--nodes",
        "1" + "0" * 20,
        needles=("--nodes", "2**63"),
    ),
    _c("serve-requests-past-int64", *SERVE, "--num-requests", "1" + "0" * 20, needles=("--num-requests", "2**63")),
    _c(  # held 11.8 GB after 60 s and would have run for hours
        "serve-requests-1e8",
        *SERVE,
        "--num-requests",
        "100000000",
        needles=("--num-requests 100000000: at most 10,000,000 requests",),
    ),
    _c("serve-replicas-past-int64", *SERVE, "--replicas", "1" + "0" * 20, needles=("--replicas", "2**63")),
    _c(
        "serve-trace-column-twice",
        *SERVE[:-4],
        "--trace-file",
        "{d}/trace_twice.csv",
        needles=("trace_twice.csv", "names output_tokens more than once"),
    ),
    _c(
        "serve-trace-digits",
        *SERVE[:-4],
        "--trace-file",
        "{d}/trace_digits.jsonl",
        needles=("trace_digits.jsonl", "line 1", "more than 4300 digits"),
    ),
    _c(
        "serve-trace-tokens-past-int64",
        *SERVE[:-4],
        "--trace-file",
        "{d}/trace_e19.jsonl",
        needles=("trace_e19.jsonl", "line 1", "input_tokens 1e+19 is too large", "2**63"),
    ),
    _c("serve-input-len-past-int64", *SERVE, "--input-len", "1" + "0" * 20, needles=("--input-len", "2**63")),
    # str.isdigit passed '²' (int() then raised ValueError) and int() refused more than 4,300 digits: exit 1
    _c(
        "train-pp-layers-superscript",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--pp",
        "2",
        "--pp-layers",
        "\u00b2,10",
        needles=("--pp-layers", "positive integers"),
    ),
    _c("infer-cluster-digits", *INFER, "--arch", "gpt3-125m", "--cluster", "1" * 5000 + "x8", needles=("below 2**63",)),
    _c("infer-engine-version-superscript", *INFER, "--arch", "gpt3-125m", "--engine-version", "0.\u00b2"),
    _c("search-serve-tp-superscript", "search", "serve", *SERVE[2:], "--gpus", "2", "--tp", "\u00b2"),
    # without SLOs, a search where nothing fits said 'meets no SLO' and 'try ... looser SLOs'
    _c(
        "search-serve-nothing-fits-no-slo",
        "search",
        "serve",
        "--arch",
        "llama3-405b",
        *SERVE[4:],
        "--gpus",
        "1",
        "--objective",
        "throughput",
        needles=("no deployment of llama3-405b on up to 1 x H100-SXM fits", "does not fit in memory"),
        check=_no_slo_named,
    ),
    # requests past llama2-7b's 4,096 positions were simulated without a word (vLLM refuses such prompts unless
    # rope scaling or --max-model-len extends the context, which opcast cannot see): a note, not a refusal
    _c(
        "serve-request-past-max-positions",
        "predict",
        "serve",
        "--arch",
        "llama2-7b",
        *SERVE[4:],
        "--input-len",
        "5000",
        "--json",
        expect="ok",
        check=lambda r, d: _notes_say(r, "the longest request (prompt + output) = 5,128 exceeds max_seq=4,096"),
    ),
    # vLLM refuses fewer batched tokens than sequences a step; they were clamped without a word
    _c(
        "serve-seqs-past-tokens",
        *SERVE,
        "--max-num-seqs",
        "4096",
        "--max-num-batched-tokens",
        "256",
        needles=("max_num_batched_tokens 256 is below max_num_seqs 4,096", "--max-num-seqs <= 256"),
    ),
    _c(
        "search-serve-seqs-past-tokens",
        "search",
        "serve",
        *SERVE[2:],
        "--gpus",
        "1",
        "--objective",
        "throughput",
        "--max-num-seqs",
        "64,16384",
        needles=("--max-num-seqs 16384 exceeds every --max-num-batched-tokens tried (2048,8192)",),
    ),
    _c(
        "search-serve-ep-dense",
        "search",
        "serve",
        *SERVE[2:],
        "--gpus",
        "2",
        "--ep",
        "2",
        "--objective",
        "throughput",
        needles=("--ep 2: gpt3-125m is dense",),
    ),
    # each event passed over every replica and the report kept per-replica arrays: 1e8 replicas held 6 GB, hung
    _c("serve-replicas-past-gpus", *SERVE, "--replicas", "100000000", needles=("past the 2,097,152",)),
    # read to the end before: /dev/zero held 10+ GB within 20 s
    _c("arch-dev-zero", *TRAIN, "--arch", "/dev/zero", needles=("/dev/zero is not a regular file",)),
    _c("serve-trace-dev-zero", *SERVE[:-4], "--trace-file", "/dev/zero", needles=("/dev/zero is not a regular file",)),
    # a FIFO with no writer: opening it to read blocked for ever
    _c("hardware-show-fifo", "hardware", "show", "{d}/fifo.json", needles=("fifo.json is not a regular file",)),
    _c("arch-show-fifo", "arch", "show", "{d}/fifo.json", needles=("fifo.json is not a regular file", "arch config")),
    _c("serve-trace-fifo", *SERVE[:-4], "--trace-file", "{d}/fifo.json", needles=("fifo.json is not a regular file",)),
    _c("serve-tp-zero", *SERVE, "--tp", "0", needles=("tp=0 must be a positive integer",)),
    _c("serve-seed-negative", *SERVE, "--seed", "-1", needles=("--seed -1 must be >= 0",)),
    _c("serve-rate-past-clock", *SERVE, "--rate", "1e-30", needles=("--rate 1e-30 spreads 20 requests",)),
    _c(
        "explore-vary-empty-factor",
        *EXPLORE,
        "--vary",
        "mem_bw_bytes_per_s=1,,2",
        ROOF,
        needles=("empty factor",),
    ),
    _c(
        "search-serve-top-negative",
        "search",
        "serve",
        *SERVE[2:],
        "--gpus",
        "2",
        "--slo-ttft-s",
        "1",
        "--top",
        "-1",
        needles=("--top -1 must be >= 0",),
    ),
    _c(
        "compare-tp-zero",
        "compare",
        "train",
        "--arch",
        "gpt3-125m",
        "--gpus",
        "H100-SXM,B200",
        "--tp",
        "0",
        "--roofline",
        needles=("cannot run on any of --gpus", "tp=0 must be a positive integer"),
    ),
    _c(
        "compare-empty-gpu-name",
        "compare",
        "train",
        "--arch",
        "gpt3-125m",
        "--gpus",
        "H100-SXM,,B200",
        "--roofline",
        needles=("empty name between commas",),
    ),
    _c(
        "plot-folder",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--plot",
        "{d}/config_dir",
        needles=("is a folder", "config_dir/plot.png"),
        check=lambda r, d: _nothing_at(d / "config_dir.png"),
    ),
    _c(  # the options naming files to write are checked before the work (the grid was computed first)
        "explore-csv-under-a-file",
        *EXPLORE,
        "--vary",
        "peak_flops=1,2",
        ROOF,
        "--csv",
        "{d}/act_list.json/grid.csv",
        needles=("--csv", "lies under", "act_list.json, which is a file"),
    ),
    _c(
        "compare-csv-and-plot-one-file",
        "compare",
        "train",
        "--arch",
        "gpt3-125m",
        "--gpus",
        "A100,H100-SXM",
        ROOF,
        "--csv",
        "{d}/same.csv",
        "--plot",
        "{d}/same.csv",
        needles=("--csv and --plot both name", "give each output its own file"),
        check=lambda r, d: _nothing_at(d / "same.csv"),
    ),
    _c(
        "train-trace-under-a-file",
        *TRAIN,
        "--arch",
        "gpt3-125m",
        "--trace",
        "{d}/act_list.json/t.json",
        needles=("--trace", "which is a file"),
    ),
    _c(
        "search-csv-folder",
        *SEARCH,
        ROOF,
        "--csv",
        "{d}/config_dir",
        needles=("--csv", "is a folder"),
    ),
    _c(
        "kernels-out-suffix",
        "predict",
        "kernels",
        "{d}/act_list.json",
        "--gpu",
        "H100-SXM",
        "--out",
        "{d}/kernels.txt",
        needles=("--out", "ending in .parquet or .csv"),
    ),
    _c(
        "explore-vary-unknown-field",
        *EXPLORE,
        "--vary",
        "hbm_bw=1,2",
        ROOF,
        needles=("--vary 'hbm_bw=1,2': unknown field 'hbm_bw'",),
    ),
    _c(  # said 'cannot write afile/x/nccl-tests.parquet: Not a directory'
        "replay-out-under-a-file",
        "collect",
        "replay",
        "nccl-tests",
        "tests/fixtures/replay/all_reduce_perf_8xA100.txt",
        "--out",
        "{d}/act_list.json/replayed",
        needles=("--out", "lies under", "act_list.json, which is a file; choose a folder"),
    ),
    _c(  # said 'cannot write to ...: Not a directory', after torch's start-up
        "bench-out-a-file",
        "collect",
        "bench",
        "--out",
        "{d}/act_list.json",
        "--op",
        "gemm",
        "--budget-s",
        "1",
        env=NO_TORCH,
        needles=("--out", "act_list.json is a file; give a folder"),
    ),
    _c(
        "replay-device-empty",
        "collect",
        "replay",
        "nccl-tests",
        "tests/fixtures/replay/all_reduce_perf_8xA100.txt",
        "--out",
        "{d}/replay_out",
        "--device",
        " ",
        needles=("--device is empty",),
        check=lambda r, d: _nothing_at(d / "replay_out"),
    ),
    _c(
        "replay-world-size-zero",
        "collect",
        "replay",
        "nccl-tests",
        "tests/fixtures/replay/all_reduce_perf_8xA100.txt",
        "--out",
        "{d}/replay_out",
        "--world-size",
        "0",
        needles=("--world-size 0 must be >= 1",),
        check=lambda r, d: _nothing_at(d / "replay_out"),
    ),
    _c(
        "replay-second-log-same-out",
        "collect",
        "replay",
        "nccl-tests",
        "tests/fixtures/replay/all_gather_perf_2x8xH100.log",
        "--out",
        "{d}/replayed_once",
        needles=("nccl-tests.parquet already holds the rows replayed from another input", "give another --out"),
        check=_still_all_reduce,
    ),
    _c(
        "replay-nodes-contradict-log",
        "collect",
        "replay",
        "nccl-tests",
        "tests/fixtures/replay/all_reduce_perf_8xA100.txt",
        "--out",
        "{d}/replay_out",
        "--nodes",
        "3",
        needles=("all 25 rows read were skipped", "world size 8 does not split evenly over 3 nodes"),
        check=lambda r, d: _nothing_at(d / "replay_out"),
    ),
    _c(
        "replay-aiter-binary-csv",
        "collect",
        "replay",
        "aiter",
        "{d}/binary.csv",
        "--out",
        "{d}/replay_out",
        needles=("binary.csv: not UTF-8 text",),
        check=lambda r, d: _nothing_at(d / "replay_out"),
    ),
    _c(
        "replay-liger-config-digits",
        "collect",
        "replay",
        "liger",
        "{d}/liger_digits.csv",
        "--out",
        "{d}/replay_out",
        needles=("liger_digits.csv:2", "integer of thousands of digits"),
        check=lambda r, d: _nothing_at(d / "replay_out"),
    ),
    _c(
        "replay-neusight-binary-label",
        "collect",
        "replay",
        "neusight",
        "{d}/neusight_binary",
        "--out",
        "{d}/replay_out",
        needles=("bert_large-inf-512-8.json: not UTF-8 text",),
        check=lambda r, d: _nothing_at(d / "replay_out"),
    ),
    # ---- output: a full stdout
    _c("stdout-full-hardware-list", "hardware", "list", stdout_full=True, needles=("output",)),
    _c("stdout-full-predict-json", *TRAIN, "--arch", "gpt3-125m", "--json", stdout_full=True, needles=("output",)),
    _c("stdout-full-search", *SEARCH, ROOF, "--json", stdout_full=True, needles=("output",)),
    # ---- valid edges with their answers
    _c(
        "valid-infer-T4-fp16",
        "predict",
        "infer",
        "--arch",
        "gpt3-125m",
        "--gpu",
        "T4",
        "--precision",
        "fp16",
        ROOF,
        "--json",
        expect="ok",
        check=_json_check(fits=True),
    ),
    _c("valid-arch-list", "arch", "list", "--json", expect="ok", check=_arch_list_check),
    _c("valid-hardware-alias", "hardware", "show", "nvidia h100 sxm", expect="ok", check=_json_check(name="H100-SXM")),
]


# --------------------------------------------------------------------------- running the cases


def _argv(case: Case, d: Path) -> list[str]:
    return [a.replace("{d}", str(d)) for a in case.args]


def _run(case: Case, d: Path) -> Result:
    unset = (
        "OPCAST_DEBUG",
        "PYTHONUNBUFFERED",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    )
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update({"COLUMNS": "120", **{k: v.replace("{d}", str(d)) for k, v in case.env.items()}})
    cmd = [*_opcast(), *_argv(case, d)]
    limit_kib = case.fsize_limit_kib
    if case.stdout_full:
        full = Path("/dev/full")
        if full.is_char_device():
            stdout = open(full, "w")  # noqa: SIM115
        else:  # no /dev/full here (never create one): a file that cannot grow
            limit_kib = 1
            stdout = open(d / f"stdout-{case.id}.txt", "w")  # noqa: SIM115
    else:
        stdout = subprocess.PIPE
    if limit_kib is not None:  # writes past the limit fail with EFBIG instead of killing (SIGXFSZ ignored)
        cmd = ["bash", "-c", f'ulimit -f {limit_kib}; trap "" XFSZ; exec "$@"', "bash", *cmd]
    try:
        proc = subprocess.run(
            cmd,
            stdout=stdout,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            timeout=CASE_TIMEOUT_S,
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired as exc:
        return Result(-1, "", f"timed out after {CASE_TIMEOUT_S} s: {exc}")
    finally:
        if case.stdout_full:
            stdout.close()  # type: ignore[union-attr]
    out = "" if case.stdout_full else proc.stdout.decode(errors="replace")
    return Result(proc.returncode, out, proc.stderr.decode(errors="replace"))


@pytest.fixture(scope="module")
def results(files: Path) -> dict[str, Result]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {c.id: pool.submit(_run, c, files) for c in CASES}
        return {k: f.result() for k, f in futures.items()}


def test_the_table_is_large_and_covers_every_command():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(CASES) >= 70
    heads = {" ".join(a for a in c.args[:2] if not a.startswith("-") and "{" not in a) for c in CASES}
    for command in (
        "collect bench",
        "collect comm",
        "collect replay",
        "collect info",
        "train fit",
        "train eval",
        "train adapt",
        "predict train",
        "predict infer",
        "predict kernel",
        "predict kernels",
        "explore train",
        "explore infer",
        "compare train",
        "compare infer",
        "hardware list",
        "hardware show",
        "arch list",
        "arch show",
    ):
        assert command in heads, command
    for command in ("search", "validate", "calibrate"):
        assert any(c.args[:1] == (command,) for c in CASES), command


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, results: dict[str, Result], files: Path):
    r = results[case.id]
    where = f"exit {r.code}\nstderr: {r.err[-3000:]}\nstdout: {r.out[-1000:]}"
    assert "Traceback" not in r.err and "Traceback" not in r.out, where
    if case.expect == "help":
        assert r.code == 2 and "Usage" in r.out + r.err and "Commands" in r.out + r.err, where
        return
    if case.expect == "ok":
        assert r.code == 0, where
        case.check(r, files)  # type: ignore[misc]
        return
    lines = r.err.splitlines()
    assert r.code == 2, where
    assert len(lines) == 1 and lines[0].strip() and lines[0].startswith("opcast: error: "), where
    for needle in case.needles:
        assert needle in lines[0], f"{needle!r} not in the message\n{where}"
    if case.check is not None:
        case.check(r, files)
