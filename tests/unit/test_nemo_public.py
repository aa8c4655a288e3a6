"""benchmarks/nemo_public.py: the published NeMo / Megatron-Bridge rows, their mapping to ``opcast predict
train`` options, and one prediction through the library and the console script."""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "nemo_public.py"


def _with(row, **facts):
    """``row`` with these recipe facts changed."""
    import dataclasses

    return dataclasses.replace(row, recipe=dataclasses.replace(row.recipe, **facts))


@pytest.fixture(scope="module")
def nemo():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def rows(nemo):
    return {r.row: r for r in nemo.read_rows()}


def test_csv_has_every_column_and_each_row_is_predicted_or_skipped_for_a_reason(nemo, rows):
    with nemo.CSV_PATH.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    assert set(nemo.REQUIRED) <= set(header)
    assert len(rows) >= 30
    predicted = [r for r in rows.values() if not r.skip_reason]
    assert len(predicted) >= 25
    for r in rows.values():
        assert r.source_url.startswith("https://"), r.row
        if r.skip_reason:
            continue
        assert r.system in nemo.CLUSTERS and r.precision in nemo.PRECISIONS, r.row
        assert nemo.load_row_arch(r.arch).n_layers > 0  # a preset or a RECIPE_ARCHS file
    assert {r.system for r in predicted} == {"DGX-H100", "DGX-B200", "DGX-B300", "DGX-GB200", "DGX-GB300"}
    published = {"NVFP4": "nvfp4", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}
    block = [r for r in rows.values() if r.precision_published in published]
    assert len(block) >= 5 and all(r.precision == published[r.precision_published] for r in block)
    assert {r.precision for r in block if not r.skip_reason} == {"mxfp8", "nvfp4"}


def test_every_mapping_has_the_published_world_size(nemo, rows):
    for r in rows.values():
        if r.skip_reason:
            with pytest.raises(ValueError, match="skipped"):
                nemo.row_options(r)
            continue
        v = nemo.row_options(r)
        assert v["tp"] * v["pp"] * v["cp"] * v["dp"] == r.n_gpus, r.row
        assert v["global_batch"] % (v["micro_batch"] * v["dp"]) == 0, r.row
        if r.ga is not None:
            assert v["global_batch"] // (v["micro_batch"] * v["dp"]) == r.ga, r.row


def test_hand_checked_h100_row_with_tp_pp_and_interleaving(nemo, rows):
    # Megatron-Bridge 26.04.01, DGX-H100, Llama 3 70B FP8: 64 GPUs, GBS 256, MBS 1, 8192, TP 4, PP 8, VP 5
    v = nemo.row_options(rows["26.04.01-h100-llama3-70b-fp8"])
    assert v == {
        "arch": "llama3-70b",
        "cluster": "dgx-h100",
        "tp": 4,
        "pp": 8,
        "cp": 1,
        "dp": 2,
        "micro_batch": 1,
        "global_batch": 256,
        "seq": 8192,
        "precision": "fp8",
        "framework": "megatron",
        "fp8_recipe": "current",  # Megatron-Bridge's one per-tensor FP8 is fp8_cs
        "zero": 1,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "grad_reduce_in_fp32": False,  # v0.4.2 set_llama3_common_configs: cfg.ddp.grad_reduce_in_fp32 = False
        "sp": True,
        "tp_comm_overlap": True,
        "tp_comm_overlap_cfg": v["tp_comm_overlap_cfg"],  # its recipe's (test_recipe_tp_overlap_config_...)
        "schedule": "interleaved",
        "virtual_stages": 5,
        "overlap_p2p_comm": True,
    }


def test_each_fp8_row_gets_its_scaling_recipe(nemo, rows):
    recipes = {r.row: nemo.row_options(r).get("fp8_recipe") for r in rows.values() if not r.skip_reason}
    for r in rows.values():
        if r.skip_reason:
            continue
        if r.precision != "fp8":
            assert recipes[r.row] is None, r.row
        elif r.precision_published in ("FP8-CS", "FP8 (current scaling)") or r.container.startswith("NeMo 26.04"):
            assert recipes[r.row] == "current", r.row
        else:  # NeMo 24.07 and 25.02: delayed scaling (bf16_with_fp8_mixed)
            assert r.container in ("NeMo 24.07", "NeMo 25.02") and recipes[r.row] == "delayed", r.row
    assert list(recipes.values()).count("current") == 23 and list(recipes.values()).count("delayed") == 12


def test_hand_checked_fsdp_and_multi_rack_gb200_rows(nemo, rows):
    # NeMo 25.04, DGX-GB200, Llama 3 70B FP8 with FSDP: 64 GPUs of one NVL72 rack, TP = PP = CP = 1
    v = nemo.row_options(rows["25.04-gb200-llama3-70b"])
    assert v["cluster"] == "gb200-nvl72" and v["zero"] == 3 and v["dp"] == 64
    assert not {"sp", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "schedule"} & v.keys()
    # Megatron-Bridge 25.11, 256 GB200: four racks of 64, 405B split counting embedding and loss as layers
    v = nemo.row_options(rows["25.11-gb200-llama3.1-405b-fp8cs"])
    assert (v["cluster"], v["gpus_per_node"]) == ("gb200-nvl72:4", 64) and "gpu" not in v and "nodes" not in v
    assert (v["tp"], v["pp"], v["cp"], v["dp"], v["virtual_stages"]) == (4, 16, 1, 4, 4)
    assert v["pp_partition"] == "megatron:embedding,loss"


def test_bad_rows_are_refused_with_the_reason(nemo, rows, tmp_path):
    good = rows["25.11-h100-llama3-8b-fp8cs"]
    with nemo.CSV_PATH.open(newline="", encoding="utf-8") as f:
        rec = next(r for r in csv.DictReader(f) if r["row"] == good.row)
    with pytest.raises(ValueError, match="GA 7"):
        nemo.parse_row({**rec, "ga": "7"}, "x")
    with pytest.raises(ValueError, match="does not divide"):
        nemo.parse_row({**rec, "tp": "3"}, "x")
    with pytest.raises(ValueError, match="system 'DGX-X99'"):
        nemo.parse_row({**rec, "system": "DGX-X99"}, "x")
    assert nemo.parse_row({**rec, "system": "DGX-X99", "skip_reason": "no cluster"}, "x").skip_reason


def test_one_row_in_process_matches_the_console_script(nemo, rows):
    row = rows["24.07-h100-llama2-7b"]
    pred = nemo.predict_row(row)
    assert pred.feasible and pred.tokens_per_s_per_gpu is not None
    assert 0.5 < pred.tokens_per_s_per_gpu / row.tokens_per_s_per_gpu < 2  # a sane prediction, not a tuned one
    assert abs(sum(pred.shares.values()) - 1) < 1e-6 and pred.fp8_gemm.endswith(")")
    words = shlex.split(nemo.cli_command(nemo.row_options(row)))
    assert words[:3] == ["opcast", "predict", "train"]
    out = subprocess.run(
        [sys.executable, "-m", "opcast", *words[1:], "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    cli_tokens = json.loads(out.stdout)["tokens_per_s"]
    assert cli_tokens / row.n_gpus == pytest.approx(pred.tokens_per_s_per_gpu, rel=1e-9)


def test_script_writes_the_report_and_keeps_its_reading(nemo, tmp_path):
    with nemo.CSV_PATH.open(newline="", encoding="utf-8") as f:
        wanted = ("25.11-h100-llama3-8b-fp8cs", "25.11-gb300-llama3-8b-fp8cs")
        recs = [r for r in csv.DictReader(f) if r["row"] in wanted]
    recs[1]["skip_reason"] = "a skipped row (test)"
    small = tmp_path / "rows.csv"
    with small.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(recs[0]))
        writer.writeheader()
        writer.writerows(recs)
    out = tmp_path / "report.md"
    out.write_text("old\n\n## Reading\n\nhand-written note\n", encoding="utf-8")
    assert nemo.main(["--csv", str(small), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "| 25.11-h100-llama3-8b-fp8cs |" in text and "| skipped |" in text
    assert "| DGX-H100, FP8 per-tensor | 1 |" in text and "hand-written note" in text and "old" not in text


def test_script_rejects_a_bad_csv_in_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("row,source_url\nx,https://example.org\n", encoding="utf-8")
    out = subprocess.run([sys.executable, str(SCRIPT), "--csv", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "missing columns" in out.stderr and "Traceback" not in out.stderr


def test_recipe_offloading_is_passed_and_the_runs_nvidia_made_are_not_refused(nemo, rows):
    recipes = nemo.read_recipes()
    assert set(recipes) <= set(rows)  # every recipe entry names a published row
    for name, recipe in recipes.items():
        assert rows[name].recipe == recipe
        if recipe.recipe_source:
            assert recipe.recipe_source.startswith("https://github.com/") and "/blob/" in recipe.recipe_source
    # the GB200 FSDP rows whose recipes offload (NeMo 25.07 405B: 95 layers; Megatron-Bridge 70B FP8-CS: 40)
    for name, layers in (
        ("25.07-gb200-llama3.1-405b", 95),
        ("25.11-gb200-llama3-70b-fp8cs", 40),
        ("26.04.01-gb200-llama3-70b-fp8", 40),
    ):
        assert nemo.row_options(rows[name])["offload_activations"] == layers
        pred = nemo.predict_row(rows[name])
        assert pred.feasible, pred.reasons
    assert "offload_activations" not in nemo.row_options(rows["25.04-gb200-llama3-70b"])


HEADER = (
    "row,offload_layers,recipe_source,recipe_setting,tp_overlap_cfg,tp_overlap_source,tp_overlap_setting,"
    "dp_overlap,dp_overlap_source,dp_overlap_setting,recompute,recompute_source,recompute_setting,"
    "cuda_graphs,cuda_graphs_source,cuda_graphs_setting,grad_reduce,grad_reduce_source,grad_reduce_setting\n"
)
PAD = "," * 12
"""The twelve fact columns after ``tp_overlap_setting``, empty."""


def test_a_bad_recipe_entry_is_refused(nemo, tmp_path):
    bad = tmp_path / "recipes.csv"
    bad.write_text(HEADER + f"x,-3,https://example.org/a,y,,,{PAD}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="offload_layers"):
        nemo.read_recipes(bad)
    bad.write_text(HEADER + f"x,3,file:///a,y,,,{PAD}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="https URL"):
        nemo.read_recipes(bad)
    bad.write_text(HEADER + f"x,,,,,,{PAD}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="sets nothing"):
        nemo.read_recipes(bad)


# A recipe's userbuffers config as the recipes CSV holds it: Megatron-Bridge v0.2.0 comm_overlap.py
# userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192, read by hand (qkv_dgrad Bulk num_sm 4, qkv_wgrad Bulk 24,
# fc1_dgrad Bulk 2, fc1_wgrad Bulk 4, all without margin; four RingExchange(aggregate=False); proj_fprop and
# fc2_fprop RingExchange(num_sm=1, set_sm_margin=True)).
H100_70B_FP8 = (
    "qkv_fprop=ring_exchange:sm1:nomargin,fc1_fprop=ring_exchange:sm1:nomargin,proj_dgrad=ring_exchange:sm1:nomargin,"
    "fc2_dgrad=ring_exchange:sm1:nomargin,proj_fprop=ring_exchange:sm1:margin,fc2_fprop=ring_exchange:sm1:margin,"
    "qkv_dgrad=bulk:sm4:nomargin,qkv_wgrad=bulk:sm24:nomargin,fc1_dgrad=bulk:sm2:nomargin,fc1_wgrad=bulk:sm4:nomargin"
)


def test_recipe_tp_overlap_column_parses_and_covers_every_tp_row(nemo, rows):
    from opcast.predict.tp_overlap import TE_DEFAULTS, parse_configs

    recipes = nemo.read_recipes()
    assert set(recipes) <= set(rows)  # every entry names a published row
    overlap = {n: r for n, r in recipes.items() if r.tp_overlap}
    tp_rows = {n for n, r in rows.items() if r.tp > 1 and not r.skip_reason}
    assert set(overlap) == tp_rows  # every predicted TP > 1 row says what its recipe sets, and only those
    for name, recipe in overlap.items():
        assert rows[name].recipe == recipe
        at_commit = r"https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+"
        assert re.fullmatch(at_commit, recipe.tp_overlap_source), name
        if recipe.tp_overlap not in nemo.TP_OVERLAP_KEYWORDS:
            assert set(parse_configs(recipe.tp_overlap)) == set(TE_DEFAULTS), name  # all ten GEMMs written out
    assert rows["25.11-h100-llama3-70b-fp8cs"].recipe.tp_overlap == H100_70B_FP8
    assert rows["26.04.01-h100-llama3-70b-fp8"].recipe.tp_overlap == H100_70B_FP8  # the same config at v0.4.2
    # Megatron-Bridge turns TP overlap off for NVFP4; NeMo 24.07's runs name no recipe
    assert {n for n, r in overlap.items() if r.tp_overlap == nemo.TP_OVERLAP_OFF} == {
        "26.04.01-gb200-llama3-70b-nvfp4",
        "26.04.01-gb200-llama3.1-405b-nvfp4",
        "26.04.01-h100-qwen3-235b-a22b-fp8",  # qwen3_235b_a22b_pretrain_config_h100: tp_comm_overlap=False
    }
    assert {n for n, r in overlap.items() if r.tp_overlap == nemo.TP_OVERLAP_UNKNOWN} == {
        n for n in tp_rows if n.startswith("24.07-")
    }
    note = nemo.tp_overlap_note(list(rows.values()))
    assert f"the {len(tp_rows)} predicted TP > 1 rows" in note and "4 not established" in note


def test_a_row_with_a_recipe_config_passes_it_to_the_command(nemo, rows):
    row = rows["25.11-h100-llama3-70b-fp8cs"]
    v = nemo.row_options(row)
    assert v["tp_comm_overlap"] is True and v["tp_comm_overlap_cfg"] == H100_70B_FP8
    words = shlex.split(nemo.cli_command(v))
    assert words[words.index("--tp-comm-overlap-cfg") + 1] == H100_70B_FP8
    pred = nemo.predict_row(row)
    out = subprocess.run(
        [sys.executable, "-m", "opcast", *words[1:], "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tokens_per_s"] / row.n_gpus == pytest.approx(pred.tokens_per_s_per_gpu, rel=1e-9)
    # the recipe's config prices differently from TE's defaults (fewer comm SMs, ring exchange for proj / fc2)
    default = nemo.predict_row(_with(row, tp_overlap=nemo.TP_OVERLAP_UNKNOWN))
    assert default.tokens_per_s_per_gpu != pytest.approx(pred.tokens_per_s_per_gpu, rel=1e-6)
    # off: sequence parallel stays, no overlap; unknown: TE's defaults
    off = nemo.row_options(rows["26.04.01-gb200-llama3-70b-nvfp4"])
    assert off["sp"] is True and "tp_comm_overlap" not in off and "tp_comm_overlap_cfg" not in off
    unknown = nemo.row_options(rows["24.07-h100-llama2-70b"])
    assert unknown["tp_comm_overlap"] is True and "tp_comm_overlap_cfg" not in unknown


def test_a_bad_tp_overlap_entry_is_refused_in_one_line(nemo, rows, tmp_path):
    bad = tmp_path / "recipes.csv"
    src = "https://github.com/o/r/blob/" + "0" * 40 + "/f.py"
    for cfg, match in (
        ("qkv_wgrad=pipeline:sm4", "qkv_wgrad: method 'pipeline'"),
        ("proj_fprop=ring_exchange:split4", "bad field 'split4'"),
        ("nonsense", "give GEMM=METHOD"),
    ):
        bad.write_text(HEADER + f'25.11-h100-llama3-70b-fp8cs,,,,"{cfg}",{src},a config{PAD}\n', encoding="utf-8")
        with pytest.raises(ValueError, match=match):
            nemo.read_recipes(bad)
    bad.write_text(HEADER + f"25.11-h100-llama3-70b-fp8cs,,,,off,{src},{PAD}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="tp_overlap_setting"):
        nemo.read_recipes(bad)
    bad.write_text(HEADER + f"24.07-h100-llama2-7b,,,,off,{src},turned off{PAD}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="runs TP 1"):
        nemo.read_rows(recipes=bad)
    # through the script: one line on stderr, exit 2, nothing predicted
    line = f'25.11-h100-llama3-70b-fp8cs,,,,"qkv_wgrad=bulk:sm",{src},a config{PAD}\n'
    bad.write_text(HEADER + line, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--recipes", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "bad field 'sm'" in out.stderr and "Traceback" not in out.stderr


def test_recipe_dp_overlap_recompute_and_cuda_graph_columns_parse(nemo, rows):
    recipes = nemo.read_recipes()
    at_commit = r"https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+"
    read = {n for n, r in recipes.items() if r.dp_overlap}
    predicted = {n for n, r in rows.items() if not r.skip_reason}
    # every predicted row whose container names a recipe says all three; NeMo 24.07's are not established
    assert read == {n for n in predicted if not n.startswith("24.07-")}
    for name in read:
        r = rows[name].recipe
        assert r.recompute and r.cuda_graphs, name
        for src in (r.dp_overlap_source, r.recompute_source, r.cuda_graphs_source):
            assert re.fullmatch(at_commit, src), name
    # v0.2.0 turns param-gather overlap off for the 405B MXFP8 functions, v0.4.2 for the GB200 405B NVFP4 V2
    assert {n for n in read if rows[n].recipe.dp_overlap != nemo.DP_OVERLAP_BOTH} == {
        "25.11-b200-llama3.1-405b-mxfp8",
        "26.04.01-gb200-llama3.1-405b-nvfp4",
        "26.04.01-gb300-kimi-k2-mxfp8",  # Muon: no distributed optimizer, overlap_param_gather False
    }
    assert rows["25.11-b200-llama3.1-405b-mxfp8"].recipe.dp_overlap == nemo.DP_OVERLAP_GRAD
    assert rows["25.11-b200-llama3-8b-mxfp8"].recipe.dp_overlap == nemo.DP_OVERLAP_BOTH  # its 8B function does not
    modules = {n: rows[n].recipe.recompute for n in read if rows[n].recipe.recompute.startswith("selective:")}
    assert {n: rows[n].recipe.recompute for n in read if rows[n].recipe.recompute != "none"} == {
        "25.11-h100-llama3-8b-fp8cs": "full-block:5",
        **modules,
    }
    assert modules == {  # the MoE presets' recompute_modules, read by hand (v0.4.2)
        "26.04.01-gb200-gpt-oss-120b-bf16": "selective:layernorm+moe_act",
        "26.04.01-b200-gpt-oss-120b-bf16": "selective:layernorm+moe_act",
        "26.04.01-h100-gpt-oss-120b-bf16": "selective:layernorm+moe_act",
        "26.04.01-gb300-deepseek-v3-mxfp8": "selective:mla_up_proj",
        "26.04.01-gb200-deepseek-v3-mxfp8": "selective:mlp",
        "26.04.01-b300-deepseek-v3-mxfp8": "selective:mla_up_proj",
        "26.04.01-b200-deepseek-v3-mxfp8": "selective:mla_up_proj+mlp",
        "26.04.01-gb300-kimi-k2-mxfp8": "selective:mla_up_proj",
    }
    assert rows["26.04.01-gb200-llama3.1-405b-nvfp4"].recipe.recompute == "none"  # V2 clears V1's recompute_num_layers
    assert rows["25.11-gb200-llama3-8b-fp8cs"].recipe.cuda_graphs == "local:full_iteration"
    assert rows["25.04-gb200-llama3-70b"].recipe.cuda_graphs == "off"
    note = nemo.recipe_facts_note(list(rows.values()))
    assert f"of the {len(predicted)} predicted rows" in note and "param-gather overlap off in 3" in note
    assert "7 not established (24.07-h100-gpt3-175b-128" in note and "partial and not expressible" in note


def test_a_row_with_param_gather_overlap_off_does_not_get_the_flag(nemo, rows):
    for name in ("25.11-b200-llama3.1-405b-mxfp8", "26.04.01-gb200-llama3.1-405b-nvfp4"):
        v = nemo.row_options(rows[name])
        assert v["overlap_grad_reduce"] is True and "overlap_param_gather" not in v, name
        words = shlex.split(nemo.cli_command(v))
        assert "--overlap-grad-reduce" in words and "--overlap-param-gather" not in words, name
    both = nemo.row_options(rows["25.11-b200-llama3.1-405b-fp8cs"])
    assert both["overlap_grad_reduce"] is True and both["overlap_param_gather"] is True
    unknown = nemo.row_options(rows["24.07-h100-llama2-7b"])  # not established: both, as before
    assert unknown["overlap_grad_reduce"] is True and unknown["overlap_param_gather"] is True
    none = nemo.row_options(_with(rows["25.11-b200-llama3.1-405b-fp8cs"], dp_overlap="none"))
    assert "overlap_grad_reduce" not in none and "overlap_param_gather" not in none
    fsdp = nemo.row_options(rows["25.11-gb200-llama3-70b-fp8cs"])  # ZeRO-3: the flags belong to --zero 1/2
    assert fsdp["zero"] == 3 and "overlap_grad_reduce" not in fsdp
    # the exposed weight all-gather makes the row slower than with the overlap
    row = rows["25.11-b200-llama3.1-405b-mxfp8"]
    off = nemo.predict_row(row)
    on = nemo.predict_row(_with(row, dp_overlap=nemo.DP_OVERLAP_BOTH))
    assert off.tokens_per_s_per_gpu < on.tokens_per_s_per_gpu


def test_recipe_recompute_is_passed_where_opcast_can_express_it(nemo, rows):
    row = rows["25.11-h100-llama3-70b-fp8cs"]
    assert "recompute" not in nemo.row_options(row)  # none: the command's default
    for mode in ("selective", "full"):
        v = nemo.row_options(_with(row, recompute=mode))
        assert v["recompute"] == mode and f"--recompute {mode}" in nemo.cli_command(v)
    assert "recompute" not in nemo.row_options(rows["25.11-h100-llama3-8b-fp8cs"])  # full-block:5: not expressible
    # Megatron-Core's recompute modules are passed as they are spelled
    v = nemo.row_options(rows["26.04.01-b200-deepseek-v3-mxfp8"])
    assert v["recompute"] == "selective:mla_up_proj+mlp" and "--recompute selective:mla_up_proj+mlp" in (
        nemo.cli_command(v)
    )


def test_a_bad_fact_entry_is_refused_in_one_line(nemo, tmp_path):
    bad = tmp_path / "recipes.csv"
    src = "https://github.com/o/r/blob/" + "0" * 40 + "/f.py"
    lead = "25.11-h100-llama3-70b-fp8cs,,,,,,"
    for facts, match in (
        (f"maybe,{src},x,,,,,,,,,", "dp_overlap 'maybe' is not one of grad"),
        (f",,,partial,{src},x,,,,,,", "recompute 'partial' is not one of none"),
        (f",,,full-block:0,{src},x,,,,,,", "recompute 'full-block:0'"),
        (f",,,selective:,{src},x,,,,,,", "nor selective:MODULE"),
        (f",,,selective:mlp+,{src},x,,,,,,", "nor selective:MODULE"),
        (f",,,,,,yes,{src},x,,,", "cuda_graphs 'yes' is not off"),
        (f",,,,,,,,,fp16,{src},x", "grad_reduce 'fp16' is not one of fp32, bf16"),
        (f"grad,{src},,,,,,,,,,", "dp_overlap_setting"),
        (",,,none,http://example.org,x,,,,,,", "https URL"),
    ):
        bad.write_text(HEADER + f"{lead},{facts}\n", encoding="utf-8")
        with pytest.raises(ValueError, match=match):
            nemo.read_recipes(bad)
    bad.write_text(HEADER + f"25.11-gb200-llama3-70b-fp8cs,40,{src},x,,,,,,,full,{src},x,,,,,,\n", encoding="utf-8")
    with pytest.raises(ValueError, match="both recompute full and offload_layers"):
        nemo.read_rows(recipes=bad)
    # through the script: one line on stderr, exit 2, nothing predicted
    bad.write_text(HEADER + f"{lead},,,,,,,sometimes,{src},x,,,\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--recipes", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "cuda_graphs 'sometimes'" in out.stderr and "Traceback" not in out.stderr


def test_recipe_gradient_reduction_is_passed_and_unread_rows_keep_megatrons_default(nemo, rows):
    """Every row whose recipe was read reduces gradients in bf16 (NeMo 2.x perf scripts and Megatron-Bridge's
    set_llama*_common_configs set grad_reduce_in_fp32 = False after the precision preset): passed as
    --no-grad-reduce-in-fp32; NeMo 24.07's rows (no recipe) keep megatron's fp32 and are counted."""
    pred = [r for r in rows.values() if not r.skip_reason]
    read = [r for r in pred if r.recipe.grad_reduce]
    assert read and all(r.recipe.grad_reduce == "bf16" for r in read)
    for r in read:
        assert nemo.row_options(r)["grad_reduce_in_fp32"] is False, r.row
        assert r.recipe.grad_reduce_source.startswith("https://github.com/"), r.row
    unread = [r for r in pred if not r.recipe.grad_reduce]
    assert unread and all(
        r.row.startswith("24.07-") and "grad_reduce_in_fp32" not in nemo.row_options(r) for r in unread
    )
    assert f"gradient reduction read for {len(read)} (bf16 in {len(read)})" in nemo.recipe_facts_note(pred)


def test_hand_checked_moe_rows_and_their_recipe_facts(nemo, rows):
    """Megatron-Bridge v0.4.2's Qwen3 MoE presets read by hand: 30B-A3B on 8 GPUs (EP 8, DP 8), 235B-A22B V2 with
    the 405B's embedding + loss pipeline split; set_qwen3_common_configs clears the 30B recipe's full recompute and
    sets bf16 gradient reduction; CUDA graphs per preset (GB200 MXFP8 30B drops the FP8-CS preset's attn scope)."""
    v = nemo.row_options(rows["26.04.01-gb300-qwen3-30b-a3b-mxfp8"])
    assert (v["tp"], v["pp"], v["dp"], v["ep"], v["micro_batch"]) == (1, 1, 8, 8, 8)
    assert v["cluster"] == "gb300-nvl72" and v["grad_reduce_in_fp32"] is False and "recompute" not in v
    assert "sp" not in v and "pp_partition" not in v and v["overlap_param_gather"] is True
    v = nemo.row_options(rows["26.04.01-b300-qwen3-235b-a22b-mxfp8"])
    assert v["cluster"] == "dgx-b300" and v["pp_partition"] == "megatron:embedding,loss" and v["ep"] == 8
    moe = {n: r.recipe for n, r in rows.items() if r.ep > 1 and r.arch.startswith("qwen3")}
    assert len(moe) == 10 and all(r.recompute == "none" and r.grad_reduce == "bf16" for r in moe.values())
    attn = "transformer_engine:attn+moe_router+moe_preprocess"
    assert {n: r.cuda_graphs for n, r in moe.items() if r.cuda_graphs != "off"} == {
        "26.04.01-gb300-qwen3-30b-a3b-mxfp8": "transformer_engine:moe_router+moe_preprocess",
        "26.04.01-gb200-qwen3-30b-a3b-mxfp8": "transformer_engine:moe_router+moe_preprocess",
        "26.04.01-b300-qwen3-30b-a3b-mxfp8": "transformer_engine:moe_router+moe_preprocess",
        "26.04.01-b200-qwen3-30b-a3b-mxfp8": attn,
        "26.04.01-gb300-qwen3-235b-a22b-mxfp8": attn,
        "26.04.01-gb200-qwen3-235b-a22b-mxfp8": attn,
    }
    # H100 235B: TP 2 without TP overlap (the recipe's CommOverlapConfig(tp_comm_overlap=False)), EP 32 over DP 16:
    # Megatron folds TP into the expert group (expert_tensor_parallel_size 1), as --etp 1 does
    row = rows["26.04.01-h100-qwen3-235b-a22b-fp8"]
    v = nemo.row_options(row)
    assert v["sp"] is True and "tp_comm_overlap" not in v and v["virtual_stages"] == 4 and v["fp8_recipe"] == "current"
    assert v["etp"] == 1 and "etp" not in nemo.row_options(rows["26.04.01-b300-qwen3-235b-a22b-mxfp8"])  # tp 1
    assert v["overlap_moe_ep_comm"] is True  # its preset's moe_a2a_overlap (MOE_A2A_OVERLAP); the others' off
    assert nemo.predict_row(row).feasible
    moe_rows = [r for r in rows.values() if r.ep > 1 and r.arch.startswith("qwen3")]
    lines = nemo.summary_table(moe_rows, {r.row: nemo.predict_row(r) for r in moe_rows})
    assert "all dense" not in "".join(lines)  # only the groups that have rows
    h100 = next(line for line in lines if line.startswith("| MoE: DGX-H100, FP8 per-tensor |"))
    assert h100.startswith("| MoE: DGX-H100, FP8 per-tensor | 2 |") and h100.endswith("| 0 |")
    assert any(line.startswith("| all MoE | 10 |") for line in lines)


def test_megatron_pipeline_layouts_give_each_ranks_layers(nemo):
    """Megatron-Core's pipeline_model_parallel_layout strings, counted by hand: virtual stage i on rank i % PP."""
    ds = "Et*4|(t*4|)*14tmL"  # DeepSeek-V3's 61 layers in 16 virtual stages: 4 each, the last one 1 + MTP + loss
    assert nemo.layout_rank_layers(ds, pp=2, vp=8) == (32, 29)  # rank 1: seven chunks of 4 and the last one
    assert nemo.layout_rank_layers(ds, pp=4, vp=4) == (16, 16, 16, 13)
    assert nemo.layout_rank_layers(ds, pp=8, vp=2) == (8, 8, 8, 8, 8, 8, 8, 5)
    assert nemo.layout_rank_layers("Et*8|(t*8|)*6t*5mL", pp=8, vp=1) == (8, 8, 8, 8, 8, 8, 8, 5)
    assert nemo.layout_rank_layers("Et|(tt|)*30mL", pp=8, vp=4) == (7, 8, 8, 8, 8, 8, 8, 6)  # H100's, 32 stages
    with pytest.raises(ValueError, match="16 stages, PP x VP = 8"):
        nemo.layout_rank_layers(ds, pp=8, vp=1)
    with pytest.raises(ValueError, match="only E, t, m, L"):
        nemo.layout_rank_layers("Et*4|x", pp=2, vp=1)


def test_hand_checked_gpt_oss_deepseek_and_kimi_rows(nemo, rows):
    """Megatron-Bridge v0.4.2's GPT-OSS, DeepSeek-V3 and Kimi K2 presets read by hand (26.04.01 rows)."""
    import dataclasses

    from opcast.archs import load_arch

    # the recipes train GPT-OSS and DeepSeek-V3 on mock data with a 32,000-token NullTokenizer
    goss = nemo.load_row_arch("gpt-oss-120b-vocab32000")
    assert goss == dataclasses.replace(load_arch("gpt-oss-120b"), name="gpt-oss-120b-vocab32000", vocab=32000)
    ds = nemo.load_row_arch("deepseek-v3-vocab32000")
    assert (ds.n_layers, ds.n_experts, ds.vocab, ds.kv_lora_rank) == (61, 256, 32000, 512)
    kimi = nemo.load_row_arch("kimi-k2")
    assert (kimi.n_experts, kimi.n_heads, kimi.vocab, kimi.dense_layers) == (384, 64, 163840, 1)
    assert kimi.params_total() == pytest.approx(1.03e12, rel=0.01)  # Moonshot: 1T total, 32B activated
    assert kimi.active_params_total() == pytest.approx(32.9e9, rel=0.02)

    v = nemo.row_options(rows["26.04.01-gb200-gpt-oss-120b-bf16"])
    assert (v["arch"], v["precision"], v["ep"], v["dp"], v["micro_batch"]) == (
        "gpt-oss-120b-vocab32000.json",
        "bf16",
        64,
        64,
        4,
    )
    assert v["overlap_moe_ep_comm"] is True and "fp8_recipe" not in v
    assert v["recompute"] == "selective:layernorm+moe_act"
    v = nemo.row_options(rows["26.04.01-h100-gpt-oss-120b-bf16"])
    assert (v["pp"], v["ep"], v["dp"]) == (4, 8, 16) and "pp_layers" not in v and "pp_partition" not in v
    assert "overlap_moe_ep_comm" not in v  # only the GB200 preset sets moe_a2a_overlap
    # DeepSeek-V3: the recipe's layouts; B300 runs its own exactly, the VP rows run theirs under 1F1B
    v = nemo.row_options(rows["26.04.01-b300-deepseek-v3-mxfp8"])
    assert v["pp_layers"] == "8,8,8,8,8,8,8,5" and "schedule" not in v and v["ep"] == 8
    v = nemo.row_options(rows["26.04.01-b200-deepseek-v3-mxfp8"])
    assert v["pp_layers"] == "8,8,8,8,8,8,8,5" and "schedule" not in v and "virtual_stages" not in v
    assert "overlap_moe_ep_comm" not in v  # its moe_a2a_overlap needs the interleaved schedule in opcast
    assert nemo.row_options(rows["26.04.01-gb200-deepseek-v3-mxfp8"])["pp_layers"] == "16,16,16,13"
    # Kimi K2: Muon keeps no distributed optimizer and does not overlap the weight gather
    v = nemo.row_options(rows["26.04.01-gb300-kimi-k2-mxfp8"])
    assert v["overlap_grad_reduce"] is True and "overlap_param_gather" not in v and v["pp_layers"] == "16,16,16,13"
    note = nemo.approximation_note(list(rows.values()))
    assert "5 of the" in note and "Muon priced as Adam" in note and "combined 1F1B not priced" in note
    assert "26.04.01-b300-deepseek-v3-mxfp8 (its MTP layer not priced)" in note
    assert "gpt-oss" not in note  # the GPT-OSS rows run as their recipes do
    new = [r for r in rows.values() if r.arch in nemo.RECIPE_ARCHS or r.arch == "kimi-k2"]
    assert len(new) == 10 and all(r.ep > 1 and r.recipe.grad_reduce == "bf16" for r in new)
    assert ds == dataclasses.replace(load_arch("deepseek-v3"), name="deepseek-v3-vocab32000", vocab=32000)
    gpt_oss = [r for r in new if r.arch.startswith("gpt-oss")]
    lines = nemo.summary_table(gpt_oss[:1], {gpt_oss[0].row: nemo.predict_row(gpt_oss[0])})
    assert any(line.startswith("| MoE: DGX-GB300, BF16 | 1 |") for line in lines)


def test_a_recipe_arch_row_matches_the_console_script(nemo, rows, tmp_path):
    """A row whose arch no preset names runs through ``opcast predict train --arch NAME.json`` with the file
    write_recipe_arch writes, and gives what the library gives."""
    row = rows["26.04.01-b300-deepseek-v3-mxfp8"]
    pred = nemo.predict_row(row)
    assert pred.feasible and pred.tokens_per_s_per_gpu is not None
    words = shlex.split(nemo.cli_command(nemo.row_options(row)))
    assert "--arch" in words and words[words.index("--arch") + 1] == "deepseek-v3-vocab32000.json"
    nemo.write_recipe_arch(row.arch, tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "opcast", *words[1:], "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    cli_tokens = json.loads(out.stdout)["tokens_per_s"]
    assert cli_tokens / row.n_gpus == pytest.approx(pred.tokens_per_s_per_gpu, rel=1e-9)
