"""`opcast predict` end to end through the CLI: JSON keys, traces, batch kernels, and one-line
errors with exit code 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from opcast.cli import main

TRAIN = [
    "predict",
    "train",
    "--arch",
    "gpt3-350m",
    "--gpu",
    "H100-SXM",
    "--tp",
    "2",
    "--pp",
    "2",
    "--dp",
    "2",
    "--micro-batch",
    "1",
    "--global-batch",
    "8",
    "--seq",
    "1024",
    "--sp",
    "--roofline",
]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "args", [["predict"], ["predict", "kernel"], ["predict", "kernels"], ["predict", "train"], ["predict", "infer"]]
)
def test_help_of_every_predict_command(args, capsys):
    assert main([*args, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_train_json_has_the_documented_keys(capsys):
    assert main([*TRAIN, "--json"]) == 0
    doc = _json(capsys)
    for key in (
        "iteration_time_s",
        "tokens_per_s",
        "mfu",
        "memory_per_gpu_bytes",
        "memory_breakdown_bytes",
        "fits",
        "breakdown_s",
        "ops",
        "cost_sources",
    ):
        assert key in doc, key
    assert set(doc["breakdown_s"]) >= {
        "forward",
        "backward",
        "recompute",
        "optimizer",
        "tp_comm",
        "pp_comm",
        "dp_comm_exposed",
        "pipeline_bubble",
    }
    assert sum(doc["breakdown_s"].values()) == pytest.approx(doc["iteration_time_s"])
    op = doc["ops"][0]
    assert {"kind", "params", "count", "time_s", "source"} <= set(op) and op["source"] in ("learned", "roofline")
    assert all(c["source"].startswith("alpha-beta") for c in doc["collectives"])
    assert doc["fits"] is True and doc["config"]["world_size"] == 8


def test_train_summary_trace_and_cluster(tmp_path, capsys):
    trace = tmp_path / "t.json"
    args = list(TRAIN)
    assert main([*args, "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "iteration" in out and "MFU" in out and "memory per GPU" in out
    events = json.loads(trace.read_text())["traceEvents"]
    stages = {e["pid"] for e in events if e["ph"] == "X"}
    assert stages == {0, 1} and any(e["name"].startswith("backward") for e in events)
    assert (
        main(
            [
                "predict",
                "train",
                "--arch",
                "gpt3-350m",
                "--gpu",
                "H100-SXM",
                "--cluster",
                "1x8",
                "--tp",
                "2",
                "--global-batch",
                "8",
                "--roofline",
                "--json",
            ]
        )
        == 0
    )
    assert _json(capsys)["config"]["dp"] == 4


def test_infeasible_train_lists_every_reason_on_one_line(capsys):
    code = main(
        [
            "predict",
            "train",
            "--arch",
            "llama2-7b",
            "--gpu",
            "H100-SXM",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--tp",
            "3",
            "--pp",
            "5",
            "--pp-layers",
            "6,6,6,6,6",  # pp=5 alone now splits 32 layers unevenly; a split that misses two layers is a reason
            "--dp",
            "2",
            "--micro-batch",
            "3",
            "--global-batch",
            "16",
            "--roofline",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("opcast: error: infeasible configuration (")
    for needle in ("tp=3 does not divide", "--pp-layers sums to 30", "= 30", "global_batch=16"):
        assert needle in err


def test_infeasible_json_still_prints_the_document(capsys):
    code = main(
        [
            "predict",
            "train",
            "--arch",
            "megatron-175b",
            "--gpu",
            "A100-SXM4-80GB",
            "--tp",
            "8",
            "--global-batch",
            "8",
            "--roofline",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 2 and doc["fits"] is False and doc["feasible"] is False and doc["memory_overflow_bytes"] > 0
    assert "does not fit" in captured.err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["predict", "train", "--arch", "llama2-7b", "--gpu", "H1000"], "unknown GPU 'H1000'"),
        (
            ["predict", "train", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--models", "/nonexistent/models"],
            "/nonexistent/models",
        ),
        (["predict", "train", "--arch", "no-such-arch", "--gpu", "H100-SXM"], "unknown arch"),
        (["predict", "train", "--arch", "llama2-7b"], "--gpu is required"),
        (["predict", "kernel", "--gpu", "H100-SXM", "--op", "gemm", "--param", "m=4"], "missing parameter"),
        (
            ["predict", "infer", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--tp", "3", "--roofline"],
            "tp=3 does not divide",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_plot_is_an_optional_extra(tmp_path, capsys):
    out = tmp_path / "b.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main([*TRAIN, "--plot", str(out)]) == 2
        assert "pip install matplotlib" in capsys.readouterr().err
        return
    assert main([*TRAIN, "--plot", str(out)]) == 0 and out.stat().st_size > 1000


def test_kernel_command(capsys):
    assert (
        main(
            [
                "predict",
                "kernel",
                "--gpu",
                "A100-SXM4-80GB",
                "--op",
                "gemm",
                "--param",
                "b=1",
                "--param",
                "m=4096",
                "--param",
                "n=4096",
                "--param",
                "k=4096",
                "--roofline",
                "--json",
            ]
        )
        == 0
    )
    doc = _json(capsys)
    assert doc["source"] == "roofline" and doc["roofline_bound"] == "compute" and doc["time_s"] > 0
    assert (
        main(
            [
                "predict",
                "kernel",
                "--gpu",
                "A100-SXM4-80GB",
                "--op",
                "all_reduce",
                "--param",
                "bytes=1048576",
                "--param",
                "world_size=8",
                "--param",
                "nodes=1",
                "--param",
                "gpus_per_node=8",
                "--json",
            ]
        )
        == 0
    )
    assert _json(capsys)["source"].startswith("alpha-beta/")


def test_kernels_fills_every_row(tmp_path, capsys):
    rows = pd.DataFrame(
        [
            {"op": "gemm", "dtype": "bf16", "direction": "fwd", "b": 1, "m": 1024, "n": 1024, "k": 1024},
            {"op": "layernorm", "dtype": "fp32", "direction": "bwd", "rows": 4096, "cols": 1024},
            {"op": "all_gather", "bytes": 1 << 20, "world_size": 8, "nodes": 1, "gpus_per_node": 8},
        ]
    )
    src = tmp_path / "in.csv"
    rows.to_csv(src, index=False)
    out = tmp_path / "out.parquet"
    assert main(["predict", "kernels", str(src), "--gpu", "H100-SXM", "--out", str(out), "--roofline"]) == 0
    got = pd.read_parquet(out)
    assert len(got) == 3 and (got["time_s_pred"] > 0).all()
    assert list(got["source_pred"])[:2] == ["roofline", "roofline"] and got["source_pred"][2].startswith("alpha-beta")
    bad = tmp_path / "bad.csv"
    pd.DataFrame([{"op": "gemm", "b": 1, "m": 2}]).to_csv(bad, index=False)
    assert main(["predict", "kernels", str(bad), "--gpu", "H100-SXM", "--out", str(out)]) == 2
    assert "row 0" in capsys.readouterr().err


def test_infer_json(capsys):
    assert (
        main(
            [
                "predict",
                "infer",
                "--arch",
                "llama2-7b",
                "--gpu",
                "H100-SXM",
                "--batch",
                "4",
                "--prompt-len",
                "256",
                "--gen-len",
                "32",
                "--roofline",
                "--json",
            ]
        )
        == 0
    )
    doc = _json(capsys)
    for key in ("ttft_s", "tpot_s", "total_latency_s", "tokens_per_s", "kv_cache_bytes", "fits"):
        assert key in doc


# --------------------------------------------------------------------------- issue 15: no silent wrong answers

GEMM_FP16 = {"op": "gemm", "dtype": "fp16", "direction": "fwd", "b": 1, "m": 4096, "n": 4096, "k": 4096}


def _kernels(tmp_path, rows, capsys, out_name="out.csv"):
    src = tmp_path / "in.csv"
    if rows is not None:
        pd.DataFrame(rows).to_csv(src, index=False)
    out = tmp_path / out_name
    code = main(["predict", "kernels", str(src), "--gpu", "H100-SXM", "--out", str(out), "--roofline"])
    return code, out, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    "word,tensor_cores",
    [
        ("true", True),
        ("TRUE", True),
        ("yes", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("False", False),
        ("no", False),
        ("off", False),
        ("0", False),
        ("", True),
    ],
)
def test_kernels_reads_tensor_cores_strictly(tmp_path, capsys, word, tensor_cores):
    # a second row keeps the column textual, as a blank cell or a word makes it
    code, out, _ = _kernels(
        tmp_path, [{**GEMM_FP16, "tensor_cores": word}, {**GEMM_FP16, "tensor_cores": "off"}], capsys
    )
    assert code == 0
    times = pd.read_csv(out)["time_s_pred"]
    # H100 fp16: 989 TFLOP/s on tensor cores, 67 on CUDA cores; the second row is always off
    assert (
        bool(times[0] < times[1] / 5) is tensor_cores and bool(times[0] == pytest.approx(times[1])) is not tensor_cores
    )


@pytest.mark.parametrize(
    "cell,needle",
    [
        ({"tensor_cores": "maybe"}, "row 0: tensor_cores='maybe' is not a boolean"),
        ({"tensor_cores": 2}, "row 0: tensor_cores=2 is not a boolean"),
        ({"dtype": "bf17"}, "row 0: unknown dtype 'bf17'"),
        ({"dtype": " bf16"}, "row 0: unknown dtype ' bf16'"),
        ({"direction": "sideways"}, "row 0: invalid gemm: direction 'sideways'"),
        ({"m": "4k"}, "row 0: invalid gemm: m='4k' is not an integer"),
        ({"m": -4096}, "row 0: invalid gemm: m=-4096 must be >= 1"),
        ({"m": 4096.5}, "row 0: invalid gemm: m=4096.5 is not an integer"),
        ({"k": float("nan")}, "row 0: invalid gemm: missing parameter k"),
        ({"n": "inf"}, "row 0: invalid gemm: n=inf is not an integer"),
        ({"op": ""}, "row 0: the op cell is blank"),
    ],
)
def test_kernels_names_the_bad_row(tmp_path, capsys, cell, needle):
    code, out, err = _kernels(tmp_path, [{**GEMM_FP16, **cell}], capsys)
    assert code == 2 and needle in err and "\n" not in err and not out.exists()


@pytest.mark.parametrize(
    "text,needle",
    [
        # pandas renamed the second m to m.1 and predicted with the first, silently
        ("op,dtype,b,m,n,k,m\ngemm,bf16,1,64,64,64,128\n", "column 'm' appears more than once"),
        # pandas took the first cells for an index and shifted the rest: the error blamed op 'bf16'
        ("op,dtype,b,m,n,k\ngemm,bf16,1,64,64,64,7,8\n", "the first row has more cells than the header"),
        ("op,dtype,b,m,n,k\ngemm,bf16,1,64,64,64\ngemm,bf16,1,64,64,64,7\n", "Expected 6 fields in line 3, saw 7"),
    ],
)
def test_kernels_refuses_a_csv_pandas_would_misread(tmp_path, capsys, text, needle):
    (tmp_path / "in.csv").write_text(text)
    args = ["predict", "kernels", str(tmp_path / "in.csv"), "--gpu", "H100-SXM", "--roofline"]
    assert main([*args, "--out", str(tmp_path / "o.csv")]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(tmp_path / "in.csv") in err and err.count("\n") == 1
    assert not (tmp_path / "o.csv").exists()


def test_kernels_refuses_an_empty_table_and_a_folder(tmp_path, capsys):
    (tmp_path / "empty.csv").write_text("op,dtype,b,m,n,k\n")
    assert (
        main(
            [
                "predict",
                "kernels",
                str(tmp_path / "empty.csv"),
                "--gpu",
                "H100-SXM",
                "--out",
                str(tmp_path / "o.csv"),
                "--roofline",
            ]
        )
        == 2
    )
    assert "holds no rows" in capsys.readouterr().err
    assert main(["predict", "kernels", str(tmp_path), "--gpu", "H100-SXM", "--out", str(tmp_path / "o.csv")]) == 2
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_failed_write_leaves_no_temp_file_and_keeps_the_old_output(tmp_path, capsys, monkeypatch, suffix):
    import errno

    code, out, _ = _kernels(tmp_path, [GEMM_FP16], capsys, out_name=f"out{suffix}")
    assert code == 0
    before = out.read_bytes()

    def disk_full(self, path, *args, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv" if suffix == ".csv" else "to_parquet", disk_full)
    code, out, err = _kernels(tmp_path, None, capsys, out_name=f"out{suffix}")
    assert code == 2 and "No space left on device" in err and "\n" not in err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.csv", f"out{suffix}"])


def test_an_interrupted_write_leaves_no_temp_file(tmp_path, capsys, monkeypatch):
    from opcast.predict.batch import write_rows

    def interrupted(self, path, *args, **kwargs):
        open(path, "wb").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_rows(pd.DataFrame([GEMM_FP16]), tmp_path / "o.csv")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM"],
        ["predict", "infer", "--arch", "gpt3-125m", "--gpu", "H100-SXM"],
        [
            "predict",
            "kernel",
            "--gpu",
            "H100-SXM",
            "--op",
            "gemm",
            "--param",
            "b=1",
            "--param",
            "m=8",
            "--param",
            "n=8",
            "--param",
            "k=8",
        ],
        ["search", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "8", "--seq", "1024"],
        ["explore", "infer", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--vary", "mem_bw_bytes_per_s=1,2"],
        ["compare", "infer", "--arch", "gpt3-125m", "--gpus", "A100-SXM4-80GB,H100-SXM"],
    ],
)
def test_models_with_roofline_is_refused(args, capsys):
    assert main([*args, "--models", "models/default", "--roofline"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--models models/default and --roofline contradict each other" in err and "\n" not in err


def test_an_infeasible_config_names_every_class_of_reason(capsys):
    argv = [
        "predict",
        "train",
        "--arch",
        "llama2-7b",
        "--gpu",
        "T4",
        "--tp",
        "3",
        "--pp",
        "5",
        "--pp-layers",
        "6,6,6,6,6",
    ]
    assert main([*argv, "--roofline"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opcast: error: infeasible configuration (4 reasons): T4 has no bf16 peak")
    for needle in (
        "tp=3 does not divide n_heads=32",
        "--pp-layers sums to 30, llama2-7b has n_layers=32",
        "world size 15",
    ):
        assert needle in err
    # a device without the precision still has its memory sized
    assert main(["predict", "infer", "--arch", "llama2-70b", "--gpu", "T4", "--roofline"]) == 2
    err = capsys.readouterr().err.strip()
    assert "(2 reasons): T4 has no bf16 peak" in err and "does not fit: stage 0 needs 128.8 GiB" in err
    # a bad value does not hide the other degrees' reasons
    assert (
        main(
            [
                "predict",
                "train",
                "--arch",
                "llama2-7b",
                "--gpu",
                "H100-SXM",
                "--tp",
                "0",
                "--pp",
                "40",
                "--precision",
                "fp9",
                "--roofline",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    for needle in ("tp=0 must be a positive integer", "pp=40", "precision='fp9'"):
        assert needle in err


# --------------------------------------------------------------------------- one options layer (issue 16)

FLAGS_BEFORE_ISSUE_16 = {  # every flag each command took before the options layer: none may disappear
    "predict kernel": "--analytic --direction --dtype --gpu --json --models --op --param --roofline --set "
    "--tensor-cores "
    "--no-tensor-cores",
    "predict kernels": "--analytic --gpu --models --out --roofline --set",
    "predict train": "--analytic --arch --attention --cluster --coverage --cp --dp --ep --global-batch --gpu "
    "--gpus-per-node "
    "--interval-mode --json --micro-batch --models --nodes --overlap-grad-reduce --plot --pp --precision "
    "--recompute --roofline --schedule --seq --set --sp --tensor-cores --no-tensor-cores --tp --trace "
    "--virtual-stages --zero",
    "predict infer": "--analytic --arch --attention --batch --gen-len --gpu --gpus-per-node --json --models --nodes "
    "--pp "
    "--precision --prompt-len --roofline --set --tensor-cores --no-tensor-cores --tp",
    "search": "--allow-straddling --arch --attention --csv --fix --global-batch --gpu --gpu-hour-price --gpus "
    "--gpus-per-node "
    "--json --max-mem --max-tp --models --objective --overlap-grad-reduce --no-overlap-grad-reduce --precision "
    "--roofline --seq --top --tp-within-node --workers",
    "explore train": "--analytic --arch --attention --cp --csv --dp --ep --global-batch --gpu --gpus-per-node --json "
    "--micro-batch --models --nodes --overlap-grad-reduce --plot --pp --precision --recompute --roofline "
    "--schedule --seq --set --sp --tensor-cores --no-tensor-cores --tp --vary --virtual-stages --zero",
    "explore infer": "--analytic --arch --attention --batch --csv --gen-len --gpu --gpus-per-node --json --models "
    "--nodes "
    "--plot --pp --precision --prompt-len --roofline --set --tensor-cores --no-tensor-cores --tp --vary",
    "compare train": "--analytic --arch --attention --cp --csv --dp --ep --global-batch --gpus --gpus-per-node --json "
    "--micro-batch --models --nodes --overlap-grad-reduce --plot --pp --precision --recompute --roofline "
    "--schedule --seq --set --sp --tensor-cores --no-tensor-cores --tp --virtual-stages --zero",
    "compare infer": "--analytic --arch --attention --batch --csv --gen-len --gpus --gpus-per-node --json --models "
    "--nodes "
    "--plot --pp --precision --prompt-len --roofline --set --tensor-cores --no-tensor-cores --tp",
}


def _options_by_command() -> dict[str, dict[str, object]]:
    """Command path -> {flag: the click option} for every prediction command."""
    import typer.main

    from opcast.cli import app

    root = typer.main.get_command(app)
    out = {}
    for path in FLAGS_BEFORE_ISSUE_16:
        cmd = root
        for word in path.split():
            cmd = cmd.commands[word]
        if path == "search":  # a group since `search serve`: `opcast search --arch ...` routes to `search train`
            cmd = cmd.commands["train"]
        out[path] = {flag: p for p in cmd.params for flag in (*p.opts, *p.secondary_opts) if flag.startswith("--")}
    return out


def test_every_command_keeps_its_flags_and_search_gains_set_and_analytic():
    options = _options_by_command()
    for path, flags in FLAGS_BEFORE_ISSUE_16.items():
        missing = set(flags.split()) - set(options[path])
        assert not missing, f"{path} lost {sorted(missing)}"
    assert {"--set", "--analytic"} <= set(options["search"])


@pytest.mark.parametrize(
    "flag",
    [
        "--arch",
        "--set",
        "--models",
        "--roofline",
        "--analytic",
        "--json",
        "--tensor-cores",
        "--tp",
        "--pp",
        "--precision",
        "--attention",
        "--seq",
        "--gpus-per-node",
        "--overlap-grad-reduce",
        "--micro-batch",
        "--recompute",
    ],
)
def test_a_shared_option_reads_the_same_in_every_command(flag):
    """The drift issue 16 found (--tensor-cores, --arch, --seq said different things in different
    commands): an option declared once has one help text wherever it appears."""
    seen = {path: opts[flag] for path, opts in _options_by_command().items() if flag in opts}
    assert len(seen) >= 2, flag
    helps = {p.help for p in seen.values()}
    assert len(helps) == 1, f"{flag}: {helps}"


def test_option_checks_run_before_any_work_and_report_together(capsys):
    # the arch does not exist either, but the option problems are found first, all in one line
    assert (
        main(
            [
                "predict",
                "train",
                "--arch",
                "no-such-arch",
                "--gpu",
                "H100-SXM",
                "--coverage",
                "1.5",
                "--interval-mode",
                "sideways",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--coverage 1.5 must lie in (0, 1)" in err and "--interval-mode 'sideways'" in err
    assert "unknown arch" not in err
    assert (
        main(["predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--cluster", "1x8", "--nodes", "1"]) == 2
    )
    assert "either --cluster or --nodes" in capsys.readouterr().err


def test_json_output_is_what_rich_print_json_wrote_without_the_highlighting(capsys):
    import io
    import math

    import numpy as np
    from rich.console import Console

    from opcast.cli_common import print_json

    doc = {
        "gpu": "H100-SXM[mem_bw_bytes_per_s=x2]",
        "µs": [1.0, 1e-7, 3, None, True],
        "nan": math.nan,
        "np": np.float64(0.1),
        "n": np.int64(7),
        "nested": {"a": {"b": [1, {"c": "naïve"}]}},
        "empty": {},
    }
    print_json(doc)
    ours = capsys.readouterr().out
    buf = io.StringIO()
    Console(file=buf, width=160).print_json(json.dumps(doc, default=float))
    assert ours == buf.getvalue()
    assert "\x1b" not in ours


def test_predict_train_imports_neither_torch_nor_xgboost(tmp_path):
    """The light predict path, through the real console script's entry point in a fresh
    interpreter (the embedded learned models: numpy trees, no xgboost)."""
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        "from opcast.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['predict', 'train', '--arch', 'llama2-7b', '--gpu', 'A100-SXM4-80GB', '--nodes', '1',\n"
        "               '--gpus-per-node', '8', '--tp', '2', '--global-batch', '64', '--seq', '4096', '--json'])\n"
        "print(rc, sorted(m for m in ('torch', 'xgboost', 'matplotlib', 'sklearn') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.stdout.split("\n")[0] == "0 []", done.stdout + done.stderr


def test_names_the_user_chose_print_as_text_not_markup(tmp_path, capsys):
    # rich read '[/x]' in a --models folder (a note) or a device file's GPU name (search's header) as a
    # closing tag: MarkupError, an internal error (exit 1) after half the report was printed
    from pathlib import Path

    models = tmp_path / "m[" / "x]"
    models.parent.mkdir()
    models.symlink_to(Path("models/default").resolve())
    kernel = ["predict", "kernel", "--gpu", "H100-SXM", "--op", "gemm", "--param", "b=1", "--param", "m=64"]
    assert main([*kernel, "--param", "n=64", "--param", "k=64", "--models", str(models)]) == 0
    assert f"note: learned models from {models} where" in capsys.readouterr().out
    assert main(["predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--models", str(models)]) == 0
    assert f"({models}); collectives" in capsys.readouterr().out
    spec = json.loads(Path("data/hardware/H100-SXM.json").read_text())
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({**spec, "name": "x[/y]", "aliases": []}))
    search = ["search", "--arch", "gpt3-125m", "--gpu", str(gpu), "--gpus", "8", "--global-batch", "8"]
    assert main([*search, "--seq", "1024", "--roofline", "--top", "1"]) == 0
    assert "gpt3-125m on x[/y]: GPUs 8" in capsys.readouterr().out
