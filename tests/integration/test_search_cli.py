"""`opcast search` end to end through the CLI: the table, --json, --csv, and one-line errors with
exit code 2 (nothing fits, a bad request)."""

from __future__ import annotations

import csv
import json

from opcast.cli import main

SMALL = [
    "search",
    "--arch",
    "gpt3-125m",
    "--gpu",
    "H100-SXM",
    "--gpus",
    "8",
    "--global-batch",
    "16",
    "--seq",
    "1024",
    "--roofline",
]


def test_help(capsys):
    assert main(["search", "--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage" in out and "--objective" in out and "--fix" in out


def test_table_summary_and_csv(tmp_path, capsys):
    out_csv = tmp_path / "all.csv"
    assert main([*SMALL, "--top", "3", "--csv", str(out_csv), "--fix", "recompute=none,full"]) == 0
    out = capsys.readouterr().out
    assert "top 3 of" in out and "tokens/s" in out and "MFU" in out and "main cost" in out
    assert "considered" in out and "pruned" in out and "configurations/s" in out
    assert "sequence parallelism needs tp > 1" in out  # a pruning reason with its count
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) > 10 and rows[0]["rank"] == "1"
    speeds = [float(r["tokens_per_s"]) for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    assert {r["recompute"] for r in rows} <= {"none", "full"}


def test_json_document(capsys):
    assert main([*SMALL, "--top", "2", "--objective", "cost", "--max-tp", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["objective"] == "cost" and len(doc["top"]) == 2
    assert doc["considered"] == doc["predicted"] + doc["pruned_total"]
    assert doc["pruned"]["max_tp"]["count"] > 0 and "reason" in doc["pruned"]["max_tp"]
    assert [w["world_size"] for w in doc["space"]["worlds"]] == [1, 2, 4, 8]
    first = doc["top"][0]
    assert first["config"]["tp"] <= 2 and first["memory_per_gpu_bytes"] > 0 and 0 < first["mfu"] < 1
    assert doc["top"][0]["gpu_hours_per_million_tokens"] <= doc["top"][1]["gpu_hours_per_million_tokens"]
    assert set(doc["seconds"]) == {"enumerate", "compile", "kernels", "compose", "rank", "total"}


def test_nothing_fits_is_one_line_with_the_reasons(capsys):
    code = main(
        [
            "search",
            "--arch",
            "llama2-70b",
            "--gpu",
            "H100-SXM",
            "--gpus",
            "2",
            "--global-batch",
            "4",
            "--seq",
            "4096",
            "--roofline",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and err.startswith("opcast: error: nothing fits")
    assert "optimizer states alone exceed the memory limit" in err


def test_bad_requests_list_every_problem(capsys):
    code = main([*SMALL, "--objective", "fastest", "--fix", "tp=x", "--fix", "colour=red", "--max-mem", "-1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    for part in ("objective='fastest'", "tp='x'", "colour", "max_mem"):
        assert part in err
    assert main([*SMALL, "--fix", "tp=3"]) == 2
    assert "--fix tp=3 is never searched: it does not divide the world size searched" in capsys.readouterr().err


def test_non_finite_numbers_and_models_with_roofline_are_refused_in_one_line(capsys):
    code = main([*SMALL, "--gpu-hour-price", "inf", "--max-mem", "inf", "--models", "models/default"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    for part in (
        "--gpu-hour-price inf must be a finite number",
        "max_mem=inf GiB must be a positive finite number",
        "--models models/default and --roofline contradict each other",
    ):
        assert part in err
    assert main([*SMALL, "--workers", "0"]) == 2
    assert "workers=0 must be a whole number of processes from 1 to 1024" in capsys.readouterr().err


def test_a_full_disk_under_csv_leaves_no_temp_file(tmp_path, capsys, monkeypatch):
    import csv as csv_module
    import errno

    def disk_full(self, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv_module.DictWriter, "writerows", disk_full)
    assert main([*SMALL, "--csv", str(tmp_path / "all.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write" in err and "No space left on device" in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def _predict_train(doc: dict, extra: list[str], capsys) -> dict:
    """`predict train --json` of a search's first configuration, with the same kernel options."""
    c = doc["top"][0]["config"]
    args = [
        "predict",
        "train",
        "--arch",
        doc["arch"],
        "--gpu",
        "H100-SXM",
        "--nodes",
        str(c["nodes"]),
        "--gpus-per-node",
        str(c["gpus_per_node"]),
        "--global-batch",
        str(c["global_batch"]),
        "--seq",
        str(c["seq"]),
        "--micro-batch",
        str(c["micro_batch"]),
        "--recompute",
        c["recompute"],
        "--zero",
        str(c["zero"]),
        "--schedule",
        c["schedule"],
        "--virtual-stages",
        str(c["virtual_stages"]),
        "--overlap-grad-reduce",
        *[f"--{k}={c[k]}" for k in ("tp", "pp", "dp", "cp", "ep")],
        *(["--sp"] if c["sp"] else []),
        *extra,
        "--json",
    ]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_set_means_what_it_means_in_predict_train(capsys):
    """--set makes the same hypothetical GPU as in predict train: the search's best configuration
    on it predicts the same iteration time there, and differs from the unmodified GPU's."""
    base = main([*SMALL, "--top", "1", "--json"]) == 0 and json.loads(capsys.readouterr().out)
    assert main([*SMALL, "--top", "1", "--set", "mem_bw_bytes_per_s=x4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"] == "H100-SXM[mem_bw_bytes_per_s=x4]"
    assert doc["top"][0]["tokens_per_s"] > base["top"][0]["tokens_per_s"]
    same = _predict_train(doc, ["--roofline", "--set", "mem_bw_bytes_per_s=x4"], capsys)
    assert same["gpu"] == doc["gpu"]
    assert same["iteration_time_s"] == doc["top"][0]["iteration_time_s"]
    assert main([*SMALL, "--set", "colour=x2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "colour" in err and "\n" not in err


def test_analytic_means_what_it_means_in_predict_train(capsys):
    """--analytic: learned models answer only inside the hardware they were fitted on, as in predict
    train (a GPU with 4x the SMs of an H100 is outside every fitted range)."""
    learned = [a for a in SMALL if a != "--roofline"] + ["--top", "1", "--set", "sm_count=x4", "--json"]
    assert main(learned) == 0
    flagged = json.loads(capsys.readouterr().out)
    assert main([*learned, "--analytic"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert flagged["cost_sources"]["learned_out_of_range"] == "flagged"
    assert doc["cost_sources"]["learned_out_of_range"] == "roofline"
    assert doc["kernels_by_source"] != flagged["kernels_by_source"]
    same = _predict_train(doc, ["--set", "sm_count=x4", "--analytic"], capsys)
    assert same["iteration_time_s"] == doc["top"][0]["iteration_time_s"]


def test_framework_means_what_it_means_in_predict_train(capsys):
    """--framework prices the framework's kernels and memory in the search as in predict train: the search's best
    configuration under Megatron predicts the same iteration time and memory there, and differs from the default's."""
    args = ["search", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "16"]
    args += ["--seq", "2048", "--roofline", "--fix", "tp=1", "--fix", "pp=1", "--fix", "zero=1"]
    args += ["--fix", "micro_batch=1"]
    assert main([*args, "--top", "1", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert base["space"]["framework"] is None
    assert main([*args, "--top", "1", "--framework", "megatron", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["space"]["framework"] == "megatron" and doc["top"][0]["config"]["framework"] == "megatron"
    first = doc["top"][0]
    assert first["iteration_time_s"] != base["top"][0]["iteration_time_s"]
    assert first["memory_per_gpu_bytes"] > base["top"][0]["memory_per_gpu_bytes"]  # the fp32 main_grad
    same = _predict_train(doc, ["--roofline", "--framework", "megatron"], capsys)
    assert same["iteration_time_s"] == first["iteration_time_s"]
    assert same["memory_per_gpu_bytes"] == first["memory_per_gpu_bytes"]


def test_megatron_overlaps_mean_what_they_mean_in_predict_train(capsys):
    """--tp-comm-overlap, --overlap-p2p-comm and --overlap-param-gather apply where a configuration can run them
    (sequence parallelism, the interleaved schedule, ZeRO 1 or 2), and the best configuration predicts the same in
    predict train with the same switches."""
    args = ["search", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--gpus", "16", "--global-batch", "32"]
    args += ["--seq", "4096", "--roofline", "--fix", "tp=2", "--fix", "sp=on", "--fix", "pp=2", "--fix", "zero=1"]
    args += ["--fix", "schedule=interleaved", "--fix", "micro_batch=1", "--framework", "megatron"]
    assert main([*args, "--top", "1", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)["top"][0]
    on = ["--tp-comm-overlap", "--overlap-p2p-comm", "--overlap-param-gather"]
    assert main([*args, *on, "--top", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = doc["top"][0]
    assert doc["space"]["tp_comm_overlap"] and doc["space"]["overlap_p2p_comm"] and doc["space"]["overlap_param_gather"]
    c = first["config"]
    assert c["tp_comm_overlap"] and c["overlap_p2p_comm"] and c["overlap_param_gather"]
    assert first["iteration_time_s"] < base["iteration_time_s"]  # the overlaps hide traffic
    same = _predict_train(doc, ["--roofline", "--framework", "megatron", *on], capsys)
    assert same["iteration_time_s"] == first["iteration_time_s"]


def test_megatron_pipeline_split_finds_nvidias_405b_layout(capsys):
    """--pp-partition megatron:embedding,loss searches the pipeline NeMo runs Llama 3.1 405B with (126 + 2 layers over
    pp 8 x vp 8, the first and last ranks one layer short), which the even split cannot hold (8 does not divide 126),
    and predict train prices the best configuration the same."""
    args = ["search", "--arch", "llama3-405b", "--gpu", "H100-SXM", "--gpus", "1024", "--global-batch", "512"]
    args += ["--seq", "8192", "--roofline", "--fix", "tp=8", "--fix", "pp=8", "--fix", "cp=2", "--fix", "sp=on"]
    args += ["--fix", "virtual_stages=8", "--fix", "micro_batch=1", "--fix", "zero=1", "--fix", "recompute=none"]
    assert main([*args, "--top", "1", "--json"]) == 2  # even splits only: neither pp 8 nor vp 8 divides 126
    assert "--fix virtual_stages=8 is never searched: it does not divide the 126 layers" in capsys.readouterr().err
    split = ["--pp-partition", "megatron:embedding,loss"]
    assert main([*args, *split, "--top", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = doc["top"][0]
    assert first["config"]["pp_layers"] == [15, 16, 16, 16, 16, 16, 16, 15]
    same = _predict_train(doc, ["--roofline", *split], capsys)
    assert same["iteration_time_s"] == first["iteration_time_s"]
    assert same["memory_per_gpu_bytes"] == first["memory_per_gpu_bytes"]
    assert main([*args, "--pp-partition", "megatron:first=15,last=15"]) == 2
    assert "the search splits evenly (auto) or as Megatron-LM counting the embedding" in capsys.readouterr().err
