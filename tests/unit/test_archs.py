"""Arch presets, Hugging Face config import, parameter counts and the Megatron-TP op lists."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from opcast.archs import (
    ArchSpec,
    arch_from_hf_config,
    layer_ops,
    list_archs,
    load_arch,
    model_ops,
    padded_vocab,
)
from opcast.errors import OpcastError
from opcast.ops import get_op

PUBLISHED = Path(__file__).resolve().parents[2].parent / "shared" / "published"
NEUSIGHT_CONFIGS = PUBLISHED / "neusight" / "scripts" / "asplos" / "data" / "DLmodel_configs"

PRESETS = [
    "gpt3-125m",
    "gpt3-350m",
    "gpt3-760m",
    "gpt3-1.3b",
    "gpt3-2.7b",
    "gpt3-6.7b",
    "gpt3-13b",
    "gpt3-175b",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "gpt-neox-20b",
    "mixtral-8x7b",
    "mistral-7b",
    "qwen2-7b",
    "qwen2-72b",
    "megatron-22b",
    "megatron-175b",
    "megatron-530b",
    "megatron-1t",
    "mpt-125m",
    "mpt-350m",
    "mpt-760m",
    "mpt-1b",
    "mpt-3b",
    "mpt-7b",
    "mpt-13b",
    "mpt-30b",
    "mpt-70b",
    "qwen3-8b",
    "qwen3-32b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "glm-4.5",
    "glm-4.5-air",
    "gemma-3-12b",
    "gemma-3-27b",
    "deepseek-v3",
    "kimi-k2",
]

# Op kinds and parameter names of the shared op registry (the brief's contract).
OP_PARAMS = {
    "gemm": {"b", "m", "n", "k"},
    "attention": {"batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "impl"},
    "layernorm": {"rows", "cols"},
    "rmsnorm": {"rows", "cols"},
    "elementwise": {"numel", "fn"},
    "rope": {"tokens", "heads", "head_dim"},
    "embedding": {"tokens", "vocab", "hidden"},
    "cross_entropy": {"tokens", "vocab"},
}
ELEMENTWISE_FNS = {"gelu", "silu", "relu", "mul", "add", "dropout"}


def _arch(**overrides: object) -> ArchSpec:
    base = dataclasses.asdict(load_arch("llama3-8b"))
    base.update(overrides)
    return ArchSpec(**base)


# --------------------------------------------------------------------------- presets


def test_every_preset_loads_under_its_file_name() -> None:
    assert sorted(list_archs()) == sorted(PRESETS)
    for name in PRESETS:
        arch = load_arch(name)
        assert arch.name == name
        assert arch.source


@pytest.mark.parametrize(
    ("name", "published", "rel_tol"),
    [
        ("llama2-7b", 6.74e9, 0.01),  # Touvron et al. 2023, model card "7B" (6.74B on HF)
        ("llama3-8b", 8.03e9, 0.01),  # Meta-Llama-3-8B model card
        ("llama3-70b", 70.6e9, 0.01),  # Meta-Llama-3-70B model card
        ("llama3-405b", 405e9, 0.01),  # Llama 3 herd, Table 3
        ("gpt3-175b", 174.6e9, 0.015),  # Brown et al. 2020; Narayanan et al. 2021 Sec. 5.1
        ("gpt-neox-20b", 20.55e9, 0.01),  # Black et al. 2022
        ("mixtral-8x7b", 46.7e9, 0.01),  # Jiang et al. 2024
        ("mistral-7b", 7.24e9, 0.01),  # mistralai/Mistral-7B-v0.1 model card (7.24B)
        ("qwen2-7b", 7.62e9, 0.01),  # Qwen/Qwen2-7B model card (7.62B)
        ("qwen2-72b", 72.7e9, 0.01),  # Qwen/Qwen2-72B model card (72.7B)
        ("megatron-530b", 529.6e9, 0.005),  # Narayanan et al. 2021, Table 1
        ("megatron-1t", 1008.0e9, 0.005),  # Narayanan et al. 2021, Table 1
        ("qwen3-8b", 8.2e9, 0.01),  # Qwen/Qwen3-8B model card
        ("qwen3-32b", 32.8e9, 0.01),  # Qwen/Qwen3-32B model card
        ("qwen3-30b-a3b", 30.5e9, 0.01),  # Qwen/Qwen3-30B-A3B model card
        ("qwen3-235b-a22b", 235e9, 0.01),  # Qwen/Qwen3-235B-A22B model card
        ("gpt-oss-20b", 20.91e9, 0.001),  # gpt-oss model card, Table 1 (20.91B)
        ("gpt-oss-120b", 116.83e9, 0.001),  # gpt-oss model card, Table 1 (116.83B)
        ("glm-4.5", 355e9, 0.01),  # GLM-4.5 report, Table 1 (its MTP layer, ~1 %, not modelled)
        ("glm-4.5-air", 106e9, 0.01),  # GLM-4.5 report, Table 1
    ],
)
def test_params_total_matches_published(name: str, published: float, rel_tol: float) -> None:
    assert load_arch(name).params_total() == pytest.approx(published, rel=rel_tol)


@pytest.mark.parametrize(
    ("name", "nominal"),
    [
        ("gpt3-125m", 125e6),
        ("gpt3-350m", 350e6),
        ("gpt3-760m", 760e6),
        ("gpt3-1.3b", 1.3e9),
        ("gpt3-2.7b", 2.7e9),
        ("gpt3-6.7b", 6.7e9),
        ("gpt3-13b", 13e9),
        ("megatron-22b", 22e9),
    ],
)
def test_gpt3_family_matches_nominal_size(name: str, nominal: float) -> None:
    # Table 2.1 of Brown et al. 2020 gives rounded names; 2 % covers the rounding.
    assert load_arch(name).params_total() == pytest.approx(nominal, rel=0.02)


def test_exact_counts_match_hugging_face_totals() -> None:
    assert load_arch("llama2-7b").params_total() == 6_738_415_616
    assert load_arch("llama3-8b").params_total() == 8_030_261_248
    assert load_arch("mixtral-8x7b").params_total() == 46_702_792_704


def test_mixtral_active_params() -> None:
    arch = load_arch("mixtral-8x7b")
    assert arch.active_params_total() == pytest.approx(12.9e9, rel=0.01)  # Jiang et al. 2024: 12.9B active
    assert load_arch("llama2-7b").active_params_total() == load_arch("llama2-7b").params_total()


@pytest.mark.parametrize("name", ["megatron-22b", "megatron-175b", "megatron-530b", "megatron-1t", "gpt3-175b"])
def test_gpt_counts_follow_narayanan_formula(name: str) -> None:
    a = load_arch(name)
    l, h, v, s = a.n_layers, a.hidden, a.vocab, a.max_seq
    formula = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))  # arXiv 2104.04473 Sec. 5.1
    assert a.params_total() == pytest.approx(formula + 2 * h, rel=1e-12)  # + final LayerNorm


def test_per_layer_and_embedding_counts_by_hand() -> None:
    a = load_arch("llama2-7b")  # 4 h^2 attention + 3 h f MLP + 2 RMSNorm weights
    assert a.params_per_layer() == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert a.embedding_params() == 32000 * 4096
    g = load_arch("gpt3-125m")  # 12 h^2 + 13 h; word + learned position tables
    assert g.params_per_layer() == 12 * 768**2 + 13 * 768
    assert g.embedding_params() == (50257 + 2048) * 768


@pytest.mark.parametrize(
    "spelling", ["Llama-2-7b", "llama2_7b", "LLAMA2-7B", "meta-llama/Llama-2-7b-hf", " llama2-7b "]
)
def test_preset_names_are_normalised(spelling: str) -> None:
    assert load_arch(spelling).name == "llama2-7b"


def test_other_spellings() -> None:
    assert load_arch("Meta-Llama-3-8B").name == "llama3-8b"
    assert load_arch("mistralai/Mixtral-8x7B-v0.1").name == "mixtral-8x7b"
    assert load_arch("GPT-NeoX-20B").name == "gpt-neox-20b"
    assert load_arch("gpt3-1.3b").name == "gpt3-1.3b" and load_arch("GPT3-13B").name == "gpt3-13b"


# --------------------------------------------------------------------------- preset JSON files


def _preset_dict(name: str = "llama2-7b") -> dict:
    return dataclasses.asdict(load_arch(name))


def test_preset_json_path_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**_preset_dict(), "name": "mine"}))
    assert load_arch(path).name == "mine"
    assert load_arch(str(path)) == load_arch(path)


def test_preset_json_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**_preset_dict(), "n_layer": 3}))
    with pytest.raises(OpcastError, match=r"bad\.json.*unknown key 'n_layer'"):
        load_arch(path)


def test_preset_json_missing_key_names_file_and_key(tmp_path: Path) -> None:
    data = _preset_dict()
    del data["vocab"]
    path = tmp_path / "short.json"
    path.write_text(json.dumps(data))
    with pytest.raises(OpcastError, match=r"short\.json.*missing key 'vocab'"):
        load_arch(path)


def test_preset_json_bad_value_and_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "typed.json"
    path.write_text(json.dumps({**_preset_dict(), "hidden": "4096", "norm": "batchnorm"}))
    with pytest.raises(OpcastError, match=r"typed\.json.*hidden='4096' is not an integer.*norm='batchnorm'"):
        load_arch(path)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(OpcastError, match="not valid JSON"):
        load_arch(broken)


def test_unknown_name_and_missing_path() -> None:
    with pytest.raises(OpcastError, match=r"unknown arch 'llama9-1b'; choose one of .*llama2-7b"):
        load_arch("llama9-1b")
    with pytest.raises(OpcastError, match="no such file"):
        load_arch("/nonexistent/config.json")


def test_a_config_of_inconsistent_shapes_says_which_keys_to_fix(tmp_path) -> None:
    # it named the arch's fields only (n_kv_heads=3 does not divide n_heads=4), with no fix and no config key
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 3}
    cfg |= {"num_hidden_layers": 2, "intermediate_size": 512, "max_position_embeddings": 64, "vocab_size": 10}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(OpcastError) as err:
        load_arch(str(path))
    assert "n_kv_heads num_key_value_heads" in str(err.value) and "\n" not in str(err.value)
    assert "n_kv_heads=3 does not divide n_heads=4; fix these keys of the config (n_heads is" in str(err.value)


def test_archspec_rejects_inconsistent_shapes() -> None:
    with pytest.raises(OpcastError, match="n_kv_heads=6 does not divide n_heads=32"):
        _arch(n_kv_heads=6)
    with pytest.raises(OpcastError, match="experts_top_k=3 exceeds n_experts=2"):
        _arch(n_experts=2, experts_top_k=3)
    with pytest.raises(OpcastError, match="n_layers=0 must be >= 1"):
        _arch(n_layers=0)
    with pytest.raises(OpcastError, match="gated_mlp=1 is not true/false"):
        _arch(gated_mlp=1)
    with pytest.raises(OpcastError, match="name is empty"):
        _arch(name=" ")


# --------------------------------------------------------------------------- Hugging Face configs

LLAMA2_7B_HF = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
MIXTRAL_HF = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}
NEOX_20B_HF = {
    "model_type": "gpt_neox",
    "hidden_size": 6144,
    "intermediate_size": 24576,
    "num_attention_heads": 64,
    "num_hidden_layers": 44,
    "max_position_embeddings": 2048,
    "vocab_size": 50432,
    "hidden_act": "gelu_fast",
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
}

_SHAPE_FIELDS = (
    "n_layers",
    "hidden",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "max_seq",
    "norm",
    "activation",
    "gated_mlp",
    "position",
    "tied_embeddings",
    "linear_bias",
    "parallel_residual",
    "n_experts",
    "experts_top_k",
)


@pytest.mark.parametrize(
    ("cfg", "preset"),
    [
        (LLAMA2_7B_HF, "llama2-7b"),
        (MIXTRAL_HF, "mixtral-8x7b"),
        (NEOX_20B_HF, "gpt-neox-20b"),
    ],
)
def test_hf_config_matches_preset(cfg: dict, preset: str) -> None:
    arch, ref = arch_from_hf_config(cfg, "x"), load_arch(preset)
    assert {f: getattr(arch, f) for f in _SHAPE_FIELDS} == {f: getattr(ref, f) for f in _SHAPE_FIELDS}
    assert arch.family == cfg["model_type"] and arch.name == "x"


def test_hf_gpt2_small_exact_count() -> None:
    cfg = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_positions": 1024,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
        "n_inner": None,
    }
    arch = arch_from_hf_config(cfg, "gpt2")
    assert (arch.ffn_hidden, arch.head_dim, arch.position, arch.tied_embeddings) == (3072, 64, "learned", True)
    assert arch.params_total() == 124_439_808  # GPT2LMHeadModel("gpt2")


def test_hf_llama_gqa_tied_with_head_dim() -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    }  # Llama-3.2-1B
    arch = arch_from_hf_config(cfg, "llama3.2-1b")
    assert (arch.n_kv_heads, arch.head_dim, arch.tied_embeddings, arch.gated_mlp) == (8, 64, True, True)
    assert arch.params_total() == 1_235_814_400


def test_hf_llama_defaults_kv_heads_to_heads() -> None:
    cfg = {k: v for k, v in LLAMA2_7B_HF.items() if k != "num_key_value_heads"}
    assert arch_from_hf_config(cfg, "x").n_kv_heads == 32


def test_hf_mistral() -> None:
    cfg = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "vocab_size": 32000,
        "hidden_act": "silu",
        "sliding_window": 4096,
    }  # Mistral-7B-v0.1
    arch = arch_from_hf_config(cfg, "mistral-7b")
    assert arch.family == "mistral" and arch.params_total() == 7_241_732_096
    assert arch.sliding_window == 4096 and arch.windowed_layers == 32  # every block windowed (v0.1)


def test_hf_qwen2_omits_only_qkv_bias() -> None:
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }  # Qwen2-0.5B
    arch = arch_from_hf_config(cfg, "qwen2-0.5b")
    assert arch.linear_bias is False and "QKV biases not counted" in arch.source
    qkv_bias = arch.n_layers * (arch.n_heads + 2 * arch.n_kv_heads) * arch.head_dim
    assert arch.params_total() + qkv_bias == 494_032_768  # Qwen2-0.5B on Hugging Face


def test_hf_opt() -> None:
    cfg = {
        "model_type": "opt",
        "hidden_size": 2048,
        "ffn_dim": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 24,
        "max_position_embeddings": 2048,
        "vocab_size": 50272,
        "activation_function": "relu",
        "word_embed_proj_dim": 2048,
    }  # facebook/opt-1.3b
    arch = arch_from_hf_config(cfg, "opt-1.3b")
    assert (arch.activation, arch.position, arch.tied_embeddings, arch.linear_bias) == ("relu", "learned", True, True)
    assert arch.params_total() + 2 * 2048 == 1_315_758_080  # HF adds 2 offset rows to the position table


def test_hf_errors_are_one_line() -> None:
    with pytest.raises(OpcastError, match=r"model_type='bert' is not supported; supported: gpt2, gpt_neox, llama"):
        arch_from_hf_config({"model_type": "bert"}, "bert")
    cfg = {k: v for k, v in LLAMA2_7B_HF.items() if k != "intermediate_size"}
    with pytest.raises(OpcastError, match="missing key 'intermediate_size'"):
        arch_from_hf_config(cfg, "x")
    with pytest.raises(OpcastError, match="hidden_act='gelu_10' is not supported"):
        arch_from_hf_config({**LLAMA2_7B_HF, "hidden_act": "gelu_10"}, "x")
    with pytest.raises(OpcastError, match="not a multiple of the 7 attention heads"):
        arch_from_hf_config({**LLAMA2_7B_HF, "num_attention_heads": 7}, "x")
    with pytest.raises(OpcastError, match="n_embd='768' is not an integer"):
        arch_from_hf_config(
            {"model_type": "gpt2", "n_embd": "768", "n_layer": 2, "n_head": 12, "n_positions": 64, "vocab_size": 10},
            "x",
        )
    with pytest.raises(OpcastError, match="num_local_experts"):
        arch_from_hf_config({k: v for k, v in MIXTRAL_HF.items() if k != "num_local_experts"}, "x")


def test_load_hf_config_from_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Llama-2-7b-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA2_7B_HF))
    assert load_arch(folder).name == "Llama-2-7b-hf"
    assert load_arch(folder / "config.json").params_total() == 6_738_415_616
    with pytest.raises(OpcastError, match=r"no config.json"):
        load_arch(tmp_path)


def test_a_config_json_without_model_type_or_an_empty_name_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA2_7B_HF.items() if k != "model_type"}))
    with pytest.raises(
        OpcastError, match=r"config\.json: a Hugging Face config without model_type .* add \"model_type\""
    ):
        load_arch(path)
    for empty in ("", "  "):  # Path("") is the current folder: it was 'folder has no config.json'
        with pytest.raises(OpcastError, match="--arch is empty"):
            load_arch(empty)


def test_neusight_configs() -> None:
    if not NEUSIGHT_CONFIGS.is_dir():
        pytest.skip(f"published NeuSight configs not found at {NEUSIGHT_CONFIGS}")
    loaded = 0
    for path in sorted(NEUSIGHT_CONFIGS.glob("*.json")):
        cfg = json.loads(path.read_text())
        if cfg["model_type"] not in ("gpt2", "opt"):
            with pytest.raises(OpcastError, match="is not supported"):
                load_arch(path)
            continue
        arch = load_arch(path)
        hidden = cfg.get("n_embd", cfg.get("hidden_size"))
        assert arch.name == path.stem and arch.hidden == hidden
        assert arch.n_layers == cfg.get("n_layer", cfg.get("num_hidden_layers"))
        assert arch.ffn_hidden == cfg.get("ffn_dim", 4 * hidden) and arch.vocab == cfg["vocab_size"]
        loaded += 1
    assert loaded >= 8
    gpt3_67 = load_arch(NEUSIGHT_CONFIGS / "gpt3_67.json")
    assert gpt3_67.params_total() == load_arch("gpt3-6.7b").params_total()


# --------------------------------------------------------------------------- parallel validation


def test_validate_parallel_names_the_factors() -> None:
    arch = load_arch("llama3-8b")
    with pytest.raises(
        OpcastError,
        match=r"tp=3 does not divide n_heads=32 \(nor n_kv_heads=8, ffn_hidden=14336\); "
        r"choose tp in 1, 2, 4, 8, 16, 32",
    ):
        arch.validate_parallel(tp=3)
    with pytest.raises(OpcastError, match=r"pp=5 does not divide n_layers=32; choose pp in 1, 2, 4, 8, 16, 32"):
        arch.validate_parallel(pp=5)
    with pytest.raises(OpcastError) as info:
        load_arch("mixtral-8x7b").validate_parallel(tp=3, pp=5, ep=3)
    message = str(info.value)
    assert "\n" not in message
    assert all(
        part in message for part in ("tp=3", "pp=5", "ep=3 does not divide n_experts=8; choose ep in 1, 2, 4, 8")
    )


def test_validate_parallel_accepts_kv_replication() -> None:
    arch = load_arch("llama3-8b")
    arch.validate_parallel(tp=16, pp=4)  # 16 is a multiple of the 8 kv heads: Megatron replicates them
    odd = _arch(n_heads=48, n_kv_heads=6, head_dim=128, hidden=6144, ffn_hidden=24576)
    with pytest.raises(OpcastError, match=r"tp=4 does not divide n_kv_heads=6"):
        odd.validate_parallel(tp=4)
    odd.validate_parallel(tp=12)
    assert odd.tp_choices() == [1, 2, 3, 6, 12, 24, 48]
    with pytest.raises(OpcastError, match="tp=0 must be a positive integer"):
        arch.validate_parallel(tp=0)


# --------------------------------------------------------------------------- op lists


def test_llama2_7b_layer_ops_tp2_by_hand() -> None:
    t = 2 * 1024  # batch 2, seq 1024
    assert layer_ops(load_arch("llama2-7b"), tp=2, batch=2, seq=1024) == [
        ("rmsnorm", {"rows": t, "cols": 4096}),
        ("gemm", {"b": 1, "m": t, "n": 3 * 4096 // 2, "k": 4096}),  # QKV, column-parallel
        ("rope", {"tokens": t, "heads": (32 + 32) // 2, "head_dim": 128}),
        (
            "attention",
            {
                "batch": 2,
                "heads": 16,
                "kv_heads": 16,
                "seq_q": 1024,
                "seq_kv": 1024,
                "head_dim": 128,
                "causal": True,
                "impl": "flash",
            },
        ),
        ("gemm", {"b": 1, "m": t, "n": 4096, "k": 4096 // 2}),  # out-proj, row-parallel
        ("elementwise", {"numel": t * 4096, "fn": "add"}),
        ("rmsnorm", {"rows": t, "cols": 4096}),
        ("gemm", {"b": 1, "m": t, "n": 2 * 11008 // 2, "k": 4096}),  # gate+up, column-parallel
        ("elementwise", {"numel": t * 11008 // 2, "fn": "silu"}),
        ("elementwise", {"numel": t * 11008 // 2, "fn": "mul"}),
        ("gemm", {"b": 1, "m": t, "n": 4096, "k": 11008 // 2}),  # down, row-parallel
        ("elementwise", {"numel": t * 4096, "fn": "add"}),
    ]


def test_sequence_parallel_shards_norms_and_residuals() -> None:
    ops = layer_ops(load_arch("llama2-7b"), tp=4, batch=1, seq=2048, sp=True)
    assert [p for k, p in ops if k == "rmsnorm"] == [{"rows": 512, "cols": 4096}] * 2
    assert [p["numel"] for k, p in ops if p.get("fn") == "add"] == [512 * 4096] * 2
    assert all(p["m"] == 2048 for k, p in ops if k == "gemm")  # GEMMs see the all-gathered sequence
    with pytest.raises(OpcastError, match="tp=4 to divide seq=1001"):
        layer_ops(load_arch("llama2-7b"), tp=4, batch=1, seq=1001, sp=True)


def test_gqa_kv_replication_shapes() -> None:
    ops = dict(layer_ops(load_arch("llama3-8b"), tp=16, batch=1, seq=128)[1:4])
    assert ops["gemm"]["n"] == (2 + 2 * 1) * 128  # 2 query heads, one replicated k and v head
    assert (ops["attention"]["heads"], ops["attention"]["kv_heads"]) == (2, 1)
    assert ops["rope"]["heads"] == 3


def test_gpt_style_dropouts_and_parallel_residual() -> None:
    fns = [p.get("fn") for _, p in layer_ops(load_arch("gpt3-175b"), tp=8, batch=1, seq=2048)]
    assert fns.count("dropout") == 2 and "gelu" in fns and "mul" not in fns
    neox = [k if k != "elementwise" else p["fn"] for k, p in layer_ops(load_arch("gpt-neox-20b"), batch=1, seq=64)]
    assert neox == ["layernorm", "gemm", "rope", "attention", "gemm", "layernorm", "gemm", "gelu", "gemm", "add", "add"]
    assert "dropout" not in [p.get("fn") for _, p in layer_ops(load_arch("llama2-7b"), batch=1, seq=64)]


def test_moe_layer_ops() -> None:
    ops = layer_ops(load_arch("mixtral-8x7b"), tp=2, batch=1, seq=4096)
    gemms = [p for k, p in ops if k == "gemm"]
    assert gemms[2] == {"b": 1, "m": 4096, "n": 8, "k": 4096}  # router
    assert gemms[3] == {"b": 8, "m": 4096 * 2 // 8, "n": 14336, "k": 4096}  # gate+up per expert
    assert gemms[4] == {"b": 8, "m": 1024, "n": 4096, "k": 14336 // 2}  # down per expert
    odd = layer_ops(load_arch("mixtral-8x7b"), batch=1, seq=5)
    # 5 tokens reach 8 (1 - (6/8)^5) = 6.1 -> 7 experts (routed_experts), ceil(5 * 2 / 7) = 2 rows each
    assert [(p["b"], p["m"]) for k, p in odd if k == "gemm" and p["b"] > 1] == [(7, 2), (7, 2)]


def test_vocab_padding_follows_megatron() -> None:
    assert padded_vocab(50257) == 50304
    assert padded_vocab(50257, tp=8) == 51200
    assert padded_vocab(32000, tp=1) == 32000
    assert padded_vocab(32000, tp=3) == 32256
    assert padded_vocab(51200, tp=8) == 51200
    ops = model_ops(load_arch("gpt3-175b"), tp=8, batch=1, seq=2048)
    assert ops[0] == ("embedding", {"tokens": 2048, "vocab": 51200 // 8, "hidden": 12288})
    assert ops[-2] == ("gemm", {"b": 1, "m": 2048, "n": 6400, "k": 12288})
    assert ops[-1] == ("cross_entropy", {"tokens": 2048, "vocab": 6400})
    assert ("embedding", {"tokens": 2048, "vocab": 2048, "hidden": 12288}) in ops  # learned positions
    llama = model_ops(load_arch("llama3-8b"), tp=2, batch=1, seq=16)
    assert [k for k, _ in llama] == ["embedding", "rmsnorm", "gemm", "cross_entropy"]


def _all_ops() -> list[tuple[str, dict]]:
    ops = []
    for name in PRESETS:
        arch = load_arch(name)
        for tp in [t for t in arch.tp_choices() if t <= 8]:
            for sp in (False, True):
                # 840 = 2^3 * 3 * 5 * 7: every tp up to 8 divides it (mpt-30b's 56 heads admit tp=7)
                ops += layer_ops(arch, tp=tp, batch=2, seq=840, sp=sp, attention_impl="sdpa")
                ops += model_ops(arch, tp=tp, batch=2, seq=840, sp=sp)
    return ops


def test_op_dicts_use_registry_names_and_ints() -> None:
    for kind, params in _all_ops():
        assert kind in OP_PARAMS and set(params) == OP_PARAMS[kind], (kind, params)
        for key, value in params.items():
            if key == "causal":
                assert value is True
            elif key in ("impl", "fn"):
                assert isinstance(value, str)
            else:
                assert type(value) is int and value >= 1, (kind, key, value)
        if kind == "elementwise":
            assert params["fn"] in ELEMENTWISE_FNS


def test_ops_validate_against_the_op_registry() -> None:
    for kind, params in _all_ops():
        get_op(kind).validate(params)


def test_op_list_bad_inputs() -> None:
    arch = load_arch("gpt3-125m")
    with pytest.raises(OpcastError, match="batch=0 must be a positive integer"):
        layer_ops(arch, batch=0, seq=16)
    with pytest.raises(OpcastError, match="seq=4096 exceeds max_seq=2048"):
        model_ops(arch, batch=1, seq=4096)
    with pytest.raises(OpcastError, match="tp=5 does not divide n_heads=12"):
        layer_ops(arch, tp=5, batch=1, seq=16)
    with pytest.raises(OpcastError, match="attention_impl"):
        layer_ops(arch, batch=1, seq=16, attention_impl="")


# ---------------------------------------------------------------------- malformed configs (issue 15)


@pytest.mark.parametrize(
    "key,value",
    [
        ("hidden_act", ["silu"]),
        ("hidden_act", {"name": "silu"}),
        ("hidden_act", 3),
        ("hidden_size", {"value": 4096}),
        ("num_hidden_layers", [32]),
        ("intermediate_size", "11008"),
        ("num_attention_heads", True),
        ("num_hidden_layers", -2),
        ("num_hidden_layers", 0),
        ("hidden_size", 4096.5),
        ("hidden_size", float("nan")),
        ("vocab_size", 10**40),
        ("max_position_embeddings", float("inf")),
        ("num_key_value_heads", "8"),
        ("head_dim", "128"),
        ("tie_word_embeddings", "no"),
        ("attention_bias", 1),
    ],
)
def test_a_bad_value_in_a_config_file_names_the_file_and_the_key(tmp_path, key, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA2_7B_HF, key: value}))
    with pytest.raises(OpcastError) as err:
        load_arch(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and f"{key}=" in message and "\n" not in message
    assert "fix these keys" in message and len(message) < 400


def test_every_bad_key_is_named_at_once():
    cfg = {**LLAMA2_7B_HF, "hidden_act": ["silu"], "num_hidden_layers": "32", "vocab_size": None}
    del cfg["intermediate_size"]
    with pytest.raises(OpcastError) as err:
        arch_from_hf_config(cfg, "x")
    for needle in (
        "hidden_act=['silu']",
        "num_hidden_layers='32'",
        "missing key 'intermediate_size'",
        "missing key 'vocab_size'",
    ):
        assert needle in str(err.value)


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"", "is empty"),
        (b"   \n", "is empty"),
        (bytes(range(256)) * 4, "not UTF-8 text (byte 0x80 at offset 128)"),
        ('{"model_type": "llama", "name": "caf\xe9"}'.encode("latin-1"), "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
        (b"[1, 2, 3]", "expected a JSON object"),
        (b'"llama"', "expected a JSON object"),
        (b"{not json", "not valid JSON"),
        (b'{"model_type": ["llama"]}', "model_type=['llama'] is not supported"),
        (b'{"name": "x", "family": "llama", "n_layers": "two"}', "missing key 'hidden'"),
    ],
)
def test_a_malformed_config_file_is_one_line_naming_it(tmp_path, content, needle):
    path = tmp_path / "odd.json"
    path.write_bytes(content)
    with pytest.raises(OpcastError) as err:
        load_arch(path)
    assert str(err.value).startswith(str(path)) and needle in str(err.value) and "\n" not in str(err.value)


def test_a_folder_a_missing_file_and_an_absurd_name(tmp_path):
    with pytest.raises(OpcastError, match=r"folder has no config.json"):
        load_arch(tmp_path)
    with pytest.raises(OpcastError, match=r"nope.json: no such file"):
        load_arch(tmp_path / "nope.json")
    with pytest.raises(OpcastError, match="unknown arch 'xxxx") as err:
        load_arch("x" * 5000)  # too long to be a path: no OSError, and the message stays short
    assert len(str(err.value)) < 1000


def test_a_preset_style_file_with_wrong_types_names_every_field(tmp_path):
    good = dataclasses.asdict(load_arch("llama2-7b"))
    path = tmp_path / "preset.json"
    path.write_text(json.dumps({**good, "hidden": {"v": 1}, "gated_mlp": "yes", "n_layers": 2**40}))
    with pytest.raises(OpcastError) as err:
        load_arch(path)
    for needle in (
        str(path),
        "hidden={'v': 1} is not an integer",
        "gated_mlp='yes' is not true/false",
        f"n_layers={2**40} exceeds",
    ):
        assert needle in str(err.value)


# --------------------------------------------------------------------------- Qwen3 / Qwen MoE

QWEN3_30B_A3B_HF = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
QWEN15_MOE_A27B_HF = {  # Qwen/Qwen1.5-MoE-A2.7B config.json: 60 experts, top-4, a gated shared expert
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 24,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 8192,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(("name", "active"), [("qwen3-30b-a3b", 3.3e9), ("qwen3-235b-a22b", 22e9)])
def test_qwen3_moe_active_params_match_the_model_cards(name: str, active: float) -> None:
    assert load_arch(name).active_params_total() == pytest.approx(active, rel=0.02)


def test_qwen3_moe_config_matches_its_preset() -> None:
    arch, ref = arch_from_hf_config(QWEN3_30B_A3B_HF, "x"), load_arch("qwen3-30b-a3b")
    fields_ = (*_SHAPE_FIELDS, "qk_norm", "shared_expert_ffn", "shared_expert_gate")
    assert {f: getattr(arch, f) for f in fields_} == {f: getattr(ref, f) for f in fields_}
    assert arch.head_dim * arch.n_heads == 2 * arch.hidden  # Qwen3's heads are wider than the residual stream


def test_qwen3_dense_config_takes_head_dim_and_qk_norm() -> None:
    cfg = {k: v for k, v in QWEN3_30B_A3B_HF.items() if "expert" not in k and k not in ("decoder_sparse_step",)}
    arch = arch_from_hf_config({**cfg, "model_type": "qwen3"}, "dense")
    assert (arch.n_experts, arch.ffn_hidden, arch.head_dim, arch.qk_norm) == (1, 6144, 128, True)
    no_head_dim = arch_from_hf_config({k: v for k, v in cfg.items() if k != "head_dim"} | {"model_type": "qwen3"}, "d")
    assert no_head_dim.head_dim == 128  # transformers Qwen3Config's default, not hidden / heads = 64


def test_qwen2_moe_shared_expert_counts_as_published() -> None:
    arch = arch_from_hf_config(QWEN15_MOE_A27B_HF, "qwen1.5-moe-a2.7b")
    assert (arch.shared_expert_ffn, arch.shared_expert_gate, arch.qk_norm) == (5632, True, False)
    # model card: 14.3B parameters, 2.7B activated
    assert arch.params_total() == pytest.approx(14.3e9, rel=0.01)
    assert arch.active_params_total() == pytest.approx(2.7e9, rel=0.02)
    per_layer = arch.params_per_layer() - load_arch_without_shared(arch).params_per_layer()
    assert per_layer == 3 * 2048 * 5632 + 2048  # gate, up and down projections, and the 2048 -> 1 gate


def load_arch_without_shared(arch: ArchSpec) -> ArchSpec:
    return dataclasses.replace(arch, shared_expert_ffn=None, shared_expert_gate=False)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [({"mlp_only_layers": [0, 1]}, "mlp_only_layers=[0, 1]"), ({"decoder_sparse_step": 2}, "decoder_sparse_step=2")],
)
def test_qwen_moe_with_dense_blocks_is_refused_in_one_line(extra: dict, needle: str) -> None:
    with pytest.raises(OpcastError, match=r"blocks mixing dense and MoE MLPs are not modelled") as err:
        arch_from_hf_config({**QWEN3_30B_A3B_HF, **extra}, "x")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_shared_expert_and_gate_need_what_they_extend() -> None:
    with pytest.raises(OpcastError, match="shared_expert_ffn needs an MoE arch"):
        _arch(shared_expert_ffn=1024)
    with pytest.raises(OpcastError, match="shared_expert_gate needs a shared expert"):
        dataclasses.replace(load_arch("mixtral-8x7b"), shared_expert_gate=True)
    odd = dataclasses.replace(load_arch("mixtral-8x7b"), shared_expert_ffn=1000)
    with pytest.raises(OpcastError, match=r"tp=16 does not divide .*shared_expert_ffn=1000"):
        odd.validate_parallel(tp=16)


def test_qk_norm_ops_follow_the_qkv_gemm() -> None:
    arch = load_arch("qwen3-8b")
    ops = layer_ops(arch, tp=2, batch=2, seq=128)
    assert ops[1][0] == "gemm"
    assert ops[2:4] == [
        ("rmsnorm", {"rows": 2 * 128 * 16, "cols": 128}),  # 32 query heads over tp 2
        ("rmsnorm", {"rows": 2 * 128 * 4, "cols": 128}),  # 8 kv heads over tp 2
    ]


def test_shared_expert_ops_sit_after_the_routed_experts() -> None:
    arch = arch_from_hf_config(QWEN15_MOE_A27B_HF, "q")
    ops = layer_ops(arch, tp=2, batch=1, seq=64)
    gemms = [p for k, p in ops if k == "gemm"]
    # router, routed up and down, then the shared expert's up (gate+up, split over tp) and down, and its gate
    assert gemms[-3:] == [
        {"b": 1, "m": 64, "n": 5632, "k": 2048},
        {"b": 1, "m": 64, "n": 2048, "k": 2816},
        {"b": 1, "m": 64, "n": 1, "k": 2048},
    ]
    assert ops[-2] == ("elementwise", {"numel": 64 * 2048, "fn": "add"})  # shared + routed, then the residual


@pytest.mark.parametrize(
    ("name", "tokens", "ep", "expected"),
    [
        ("mixtral-8x7b", 1, 1, (2, 1)),  # one token, its 2 experts, a row each
        ("mixtral-8x7b", 4, 1, (6, 2)),  # 8 (1 - (6/8)^4) = 5.47 -> 6 experts; 8 rows over 6 -> 2
        ("mixtral-8x7b", 1024, 1, (8, 256)),  # training: every expert, the balanced rows
        ("mixtral-8x7b", 1024, 4, (2, 1024)),  # 2 local experts take the rank's 2048 assignments
        ("qwen3-235b-a22b", 16, 1, (83, 2)),  # 128 (1 - (120/128)^16) = 82.4 -> 83 of 128 experts
        ("qwen3-235b-a22b", 8192, 8, (16, 4096)),
    ],
)
def test_routed_experts_by_hand(name: str, tokens: int, ep: int, expected: tuple[int, int]) -> None:
    from opcast.archs import routed_experts

    arch = load_arch(name)
    busy, rows = routed_experts(arch, tokens=tokens, ep=ep)
    assert (busy, rows) == expected
    assert busy * rows >= tokens * arch.experts_top_k  # every assignment has a row


def test_qwen3_moe_runs_through_the_console_script(tmp_path: Path) -> None:
    import subprocess
    import sys

    opcast = str(Path(sys.executable).with_name("opcast"))
    ok = subprocess.run(
        [opcast, "predict", "infer", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--batch", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["arch"] == "qwen3-30b-a3b"
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**QWEN3_30B_A3B_HF, "mlp_only_layers": [0]}))
    out = subprocess.run(
        [opcast, "predict", "infer", "--arch", str(bad), "--gpu", "H100-SXM", "--batch", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "mlp_only_layers=[0]" in out.stderr


# --------------------------------------------------------------------------- DeepSeek (MLA, DeepSeekMoE)

DEEPSEEK_V3_HF = {  # deepseek-ai/DeepSeek-V3 config.json (the keys opcast reads)
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "num_nextn_predict_layers": 1,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
DEEPSEEK_V2_LITE_HF = {  # deepseek-ai/DeepSeek-V2-Lite config.json: no query compression, 2 shared experts
    **DEEPSEEK_V3_HF,
    "quantization_config": None,  # a bf16 checkpoint
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "first_k_dense_replace": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "q_lora_rank": None,
    "vocab_size": 102400,
}


def test_deepseek_v3_counts_as_published() -> None:
    arch = arch_from_hf_config(DEEPSEEK_V3_HF, "deepseek-v3")
    assert (arch.head_dim, arch.kv_lora_rank, arch.shared_expert_ffn, arch.dense_layers) == (192, 512, 2048, 3)
    assert arch.params_total() == pytest.approx(671e9, rel=0.001)  # DeepSeek-V3 report: 671B (MTP layer apart)
    assert arch.active_params_total() == pytest.approx(37e9, rel=0.02)  # 37B activated
    # by hand: q_a 7168 x 1536 + norm, q_b 1536 x 128 x 192, kv_a 7168 x 576 + norm, kv_b 512 x 128 x 256, o
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert arch.mla_params(tp=1) == mla
    # the three dense blocks: an 18,432-wide MLP each in place of 256 experts, the shared one and the router
    moe_mlp = 256 * 3 * 7168 * 2048 + 3 * 7168 * 2048 + 7168 * 256
    assert arch.dense_block_saving() == moe_mlp - 3 * 7168 * 18432
    preset = load_arch("deepseek-v3")  # the preset is this config.json
    assert dataclasses.replace(preset, source=arch.source) == arch
    assert arch.fp8_block_checkpoint  # quantization_config: fp8, 128 x 128 weight blocks
    assert not arch_from_hf_config(DEEPSEEK_V2_LITE_HF, "v2-lite").fp8_block_checkpoint


def test_mla_runs_its_projections_in_fp8_as_megatron_cores_te_modules():
    """Megatron-Core's MLA with Transformer Engine: q_down / kv_down are duplicated TE Linears (their own input
    cast, no gather), q_up / kv_up LayerNormLinears (the latent norm writes their fp8 input: no cast), and without
    q compression q_proj a column-parallel Linear (its input cast); the out-proj as before. The router and the
    head stay bf16."""
    import dataclasses

    from opcast.predict.graph import block_ops, fp8_casts, fp8_gathers, fp8_gemms, precision_of, train_block

    v3 = arch_from_hf_config(DEEPSEEK_V3_HF, "deepseek-v3")
    prec = precision_of("fp8")
    g = train_block(v3, tp=2, batch=1, seq=256, sp=True, cp=1, ep=8, attention="flash", recompute="none", prec=prec)
    fwd = {n.role: n.kernel.dtype for n in g.nodes["forward"]}
    assert {r: fwd[r] for r in ("q_down", "q_up", "kv_down", "kv_up", "proj", "router")} == {
        **dict.fromkeys(("q_down", "q_up", "kv_down", "kv_up", "proj"), "fp8"),
        "router": "bf16",
    }
    assert fp8_gathers("q_down", tp=2, sp=True, grouped=False) == (False, False)
    assert fp8_gathers("kv_up", tp=2, sp=True, grouped=False) == (True, False)
    ops = block_ops(v3, tp=2, batch=1, seq_q=256, seq_kv=256, sp=False, ep=8)
    casts = fp8_casts(ops, dataclasses.replace(prec, fp8_modules="megatron"), tp=2, sp=False)
    assert [r for r, *_ in casts["q_down"][0]] == ["q_down.fp8_cast_transpose_input"]
    assert casts["q_up"][0] == [] and casts["kv_up"][0] == []  # the fused latent norms write fp8
    no_q_lora = dataclasses.replace(v3, q_lora_rank=None)
    ops = block_ops(no_q_lora, tp=2, batch=1, seq_q=256, seq_kv=256, sp=False, ep=8)
    casts = fp8_casts(ops, dataclasses.replace(prec, fp8_modules="megatron"), tp=2, sp=False)
    assert [r for r, *_ in casts["q_proj"][0]] == ["q_proj.fp8_cast_transpose_input"]
    # per block: q_down, q_up, kv_down, kv_up, proj; 256 / 8 local experts x 2; the shared expert's two
    assert fp8_gemms(v3, ep=8) == 5 + 2 * 32 + 2 and fp8_gemms(no_q_lora, ep=8) == 4 + 2 * 32 + 2


def test_deepseek_v2_lite_and_kimi_k2_spellings() -> None:
    lite = arch_from_hf_config(DEEPSEEK_V2_LITE_HF, "lite")
    assert lite.q_lora_rank is None and lite.shared_expert_ffn == 2 * 1408
    assert lite.params_total() == pytest.approx(15.7e9, rel=0.005)  # DeepSeek-V2-Lite model card: 15.7B
    kimi = arch_from_hf_config({**DEEPSEEK_V3_HF, "model_type": "kimi_k2"}, "k")
    assert kimi.kv_lora_rank == 512 and kimi.family == "deepseek_v3"
    # moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3's with 64 heads, 384 experts, one dense block
    k2 = {**DEEPSEEK_V3_HF, "model_type": "kimi_k2", "num_attention_heads": 64, "num_key_value_heads": 64}
    k2 |= {"n_routed_experts": 384, "first_k_dense_replace": 1, "vocab_size": 163840, "max_position_embeddings": 131072}
    k2 |= {"n_group": 1, "topk_group": 1}  # no group limit
    expected = arch_from_hf_config(k2, "kimi-k2")
    assert dataclasses.replace(load_arch("kimi-k2"), source=expected.source) == expected


def test_mla_ops_by_hand() -> None:
    from opcast.archs import attention_ops

    arch = arch_from_hf_config(DEEPSEEK_V3_HF, "d")
    prefill = attention_ops(arch, tokens=64, heads=16, kv_heads=16)  # tp 8
    assert [(r, p.get("n")) for r, k, p in prefill.before if k == "gemm"] == [
        ("q_down", 1536),  # whole on every rank
        ("q_up", 16 * 192),
        ("kv_down", 512 + 64),  # the latent and the shared rope key
        ("kv_up", 16 * (128 + 128)),  # each head's key (no rope part) and value
    ]
    assert (prefill.kv_heads, prefill.head_dim, prefill.proj_k, prefill.kv_write) == (16, 160, 16 * 128, 576)
    decode = attention_ops(arch, tokens=32, heads=16, kv_heads=16, absorbed=True)
    assert decode.before[-1] == ("q_absorb", "gemm", {"b": 16, "m": 32, "n": 512, "k": 128})
    assert decode.after == [("v_absorb", "gemm", {"b": 16, "m": 32, "n": 128, "k": 512})]
    assert (decode.kv_heads, 2 * decode.head_dim, decode.kv_write) == (1, 576, 576)  # reads the cached latent once


def test_layer_ops_of_an_mla_arch_follow_the_graph() -> None:
    from opcast.predict.graph import block_ops

    arch = arch_from_hf_config(DEEPSEEK_V2_LITE_HF, "lite")
    mine = [
        (k, p)
        for r, k, p, c in block_ops(arch, tp=2, batch=1, seq_q=128, seq_kv=128, sp=False)
        if r not in ("permute", "unpermute")
    ]
    assert mine == [(k, p) for k, p in layer_ops(arch, tp=2, batch=1, seq=128)]
    assert mine[1] == ("gemm", {"b": 1, "m": 128, "n": 8 * 192, "k": 2048})  # q_proj: no query compression


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"moe_layer_freq": 2}, "moe_layer_freq=2"),
        ({"kv_lora_rank": "512"}, "kv_lora_rank"),
        ({"n_group": 7}, "n_group=7 does not divide n_routed_experts=256"),
        ({"topk_group": 9}, "topk_group=9 exceeds n_group=8"),  # was read as no group limit, silently
        ({"topk_group": 0}, "topk_group=0 must be >= 1"),
    ],
)
def test_deepseek_configs_opcast_cannot_price_are_refused_in_one_line(extra: dict, needle: str) -> None:
    with pytest.raises(OpcastError) as err:
        arch_from_hf_config({**DEEPSEEK_V3_HF, **extra}, "x")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).count(needle) == 1, "each problem once"


def test_group_limited_routing_is_read_and_checked() -> None:
    v3 = arch_from_hf_config(DEEPSEEK_V3_HF, "d")
    assert (v3.expert_groups, v3.expert_groups_top_k) == (8, 4)
    assert arch_from_hf_config(DEEPSEEK_V2_LITE_HF, "lite").expert_groups is None  # n_group 1: no limit
    every = arch_from_hf_config({**DEEPSEEK_V3_HF, "topk_group": 8}, "all")  # all groups: no limit either
    assert every.expert_groups is None and every.expert_groups_top_k is None
    for bad, needle in (
        ({"expert_groups_top_k": None}, "expert_groups and expert_groups_top_k go together"),
        ({"expert_groups": 7}, "expert_groups=7 must divide n_experts=256"),
        ({"expert_groups_top_k": 9}, "expert_groups_top_k=9 must be 1..expert_groups=8"),
        ({"expert_groups_top_k": 0}, "expert_groups_top_k=0 must be >= 1"),
        ({"expert_groups": 64, "expert_groups_top_k": 1}, "experts_top_k=8 exceeds the 4 experts"),
    ):
        with pytest.raises(OpcastError, match=re.escape(needle)):
            dataclasses.replace(v3, **bad)


def test_mla_fields_go_together() -> None:
    v3 = arch_from_hf_config(DEEPSEEK_V3_HF, "d")
    with pytest.raises(OpcastError, match="multi-head latent attention needs all of"):
        dataclasses.replace(v3, v_head_dim=None)
    with pytest.raises(OpcastError, match="q_lora_rank needs multi-head latent attention"):
        _arch(q_lora_rank=64)
    with pytest.raises(OpcastError, match="dense_layers and dense_ffn_hidden go together"):
        dataclasses.replace(v3, dense_ffn_hidden=None)


def test_deepseek_v3_serves_through_the_console_script(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(DEEPSEEK_V3_HF))
    opcast = str(Path(sys.executable).with_name("opcast"))
    out = subprocess.run(
        [opcast, "predict", "infer", "--arch", str(cfg), "--gpu", "H200", "--tp", "8", "--precision", "fp8", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["feasible"] and result["tpot_s"] > 0


def test_inference_prices_deepseeks_dense_first_blocks_as_dense_blocks() -> None:
    from opcast.hardware import get_device
    from opcast.predict.inference import block_kinds, predict_infer
    from opcast.predict.parallel import InferConfig

    v3 = arch_from_hf_config(DEEPSEEK_V3_HF, "d")
    (dense, n_dense), (moe, n_moe) = block_kinds(v3)
    assert (n_dense, n_moe, dense.n_experts, dense.ffn_hidden, moe) == (3, 58, 1, 18432, v3)
    result = predict_infer(
        v3, get_device("H200"), InferConfig(tp=8, batch=4, prompt_len=64, gen_len=2, precision="fp8")
    )
    decode = [ln for ln in result.ops if ln["phase"] == "decode"]
    # 3 dense blocks' whole MLP (one GEMM of 2 x 18432 / 8 columns) and 58 MoE blocks' fused experts of 4 tokens
    assert {(ln["count"], ln["params"]["b"]) for ln in decode if ln["role"] == "mlp_up"} == {(3, 1)}
    ((experts, count),) = [(ln["params"], ln["count"]) for ln in decode if ln["role"] == "experts"]
    assert (count, experts["tokens"], experts["inter"]) == (58, 4, v3.ffn_hidden // 8)
    assert [n for a, n in block_kinds(load_arch("mixtral-8x7b"))] == [32]


# --------------------------------------------------------------------------- GLM-4.5 (glm4_moe)

GLM45_HF = {  # zai-org/GLM-4.5 config.json (the keys opcast reads)
    "model_type": "glm4_moe",
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 92,
    "first_k_dense_replace": 3,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "use_qk_norm": True,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
    "vocab_size": 151552,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}


def test_glm45_is_deepseekmoe_with_gqa() -> None:
    """Per MoE block: attention 5120 x (12,288 + 2 x 1,024) + 12,288 x 5,120 = 136,314,880, q/k norms 256, 160
    routed experts and one shared of 3 x 5,120 x 1,536 = 23,592,960 each, router 819,200, norms 10,240; a dense
    block has 3 x 5,120 x 12,288 instead; 89 + 3 blocks and two 151,552 x 5,120 tables. Active: 8 + 1 experts."""
    arch = arch_from_hf_config(GLM45_HF, "glm")
    moe_block = 136_314_880 + 256 + 161 * 23_592_960 + 819_200 + 10_240
    dense_block = 136_314_880 + 256 + 3 * 5120 * 12288 + 10_240
    outside = 2 * 151552 * 5120 + 5120
    assert arch.params_total() == 89 * moe_block + 3 * dense_block + outside
    assert arch.active_params_total() == arch.params_total() - 89 * 152 * 23_592_960
    assert (arch.dense_layers, arch.shared_expert_ffn, arch.qk_norm, arch.linear_bias) == (3, 1536, True, False)
    assert "MTP layers not modelled" in arch.source
    assert load_arch("glm-4.5").params_total() == arch.params_total()


# --------------------------------------------------------------------------- Gemma 2 / 3

GEMMA3_27B_TEXT = {  # google/gemma-3-27b-it config.json, text_config (the keys opcast reads)
    "model_type": "gemma3_text",
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 62,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh",
}


def test_a_gemma3_text_config_that_is_no_object_is_named_and_a_missing_key_once() -> None:
    with pytest.raises(OpcastError, match=r"text_config='x' must be a JSON object") as err:
        arch_from_hf_config({"model_type": "gemma3", "text_config": "x"}, name="g")
    assert "missing key" not in str(err.value)
    with pytest.raises(OpcastError) as err:  # num_hidden_layers is read by two rules of gemma3: named once
        arch_from_hf_config({"model_type": "gemma3", "text_config": {"hidden_size": 256}}, name="g")
    assert str(err.value).count("missing key 'num_hidden_layers'") == 1


def test_gemma3_counts_four_norms_a_block_and_windows_five_of_six() -> None:
    """Per block: attention 5376 x (32 + 2 x 16) x 128 + 4096 x 5376 = 66,060,288, q/k norms 256, GeGLU
    3 x 5376 x 21504 = 346,816,512, four norms 21,504; 62 blocks, one tied 262,208 x 5,376 table, the final norm:
    27,009,346,304. Blocks 6, 12, ..., 60 (1-based) attend globally: 52 of 62 slide."""
    arch = arch_from_hf_config({"model_type": "gemma3", "text_config": GEMMA3_27B_TEXT, "vision_config": {}}, "g")
    block = 66_060_288 + 256 + 346_816_512 + 4 * 5376
    assert arch.params_total() == 62 * block + 262208 * 5376 + 5376 == 27_009_346_304
    assert (arch.family, arch.post_norms, arch.qk_norm, arch.tied_embeddings, arch.hf_activation) == (
        "gemma3",
        True,
        True,
        True,
        "gelu_pytorch_tanh",
    )
    assert (arch.sliding_window, arch.windowed_layers) == (1024, 52)
    assert load_arch("gemma-3-27b").params_total() == arch.params_total()
    gemma2 = arch_from_hf_config({**GEMMA3_27B_TEXT, "model_type": "gemma2", "num_hidden_layers": 46}, "g2")
    assert (gemma2.windowed_layers, gemma2.qk_norm) == (23, False)  # every other block from the first
    typed = {**GEMMA3_27B_TEXT, "layer_types": ["sliding_attention"] * 60 + ["full_attention"] * 2}
    assert arch_from_hf_config(typed, "g").windowed_layers == 60


def test_post_norms_are_priced_and_their_inputs_saved() -> None:
    from opcast.predict.graph import block_ops
    from opcast.predict.memory import layer_activation_bytes

    arch = load_arch("gemma-3-27b")
    roles = [op[0] for op in block_ops(arch, tp=2, batch=1, seq_q=4096, seq_kv=4096, sp=True)]
    assert roles.count("post_norm1") == roles.count("post_norm2") == 1
    assert roles.index("post_norm1") > roles.index("proj") and roles[-2] == "post_norm2"
    without = dataclasses.replace(arch, post_norms=False)
    saved = layer_activation_bytes(arch, tp=2, sp=True, batch=1, seq=4096) - layer_activation_bytes(
        without, tp=2, sp=True, batch=1, seq=4096
    )
    assert saved == 2 * 2 * 4096 * 5376 / 2  # two bf16 norm inputs of the rank's sequence-parallel rows
