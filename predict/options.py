"""The command-line options of every prediction command, each declared once.

``opcast predict kernel|kernels|train|infer``, ``opcast search``, ``opcast explore train|infer``
and ``opcast compare train|infer`` take their options from here, so a flag means the same
thing, with the same help, type, default and check, wherever it appears. The options of a
training or inference configuration are built from the fields of
:class:`~opcast.predict.parallel.TrainConfig` and :class:`~opcast.predict.parallel.InferConfig`
(name, type and default; Vidur builds its CLI from field metadata the same way), so a new
field needs one line of help here, and :func:`train_config` / :func:`infer_config` turn the
parsed options back into the dataclass.

A command declares the options it takes and receives them as one :class:`Args`::

    @app.command("train")
    @command(ARCH, GPU, *TRAIN, *KERNEL_SOURCE, JSON)
    def train_cmd(o: Args) -> None:
        cfg = train_config(o)

:func:`command` writes the function signature typer reads (so help, type errors and missing
options stay typer's), then, before the command runs, applies every option's check and every
:data:`RULES` rule whose options the command takes, and raises all problems found as one
:class:`~opcast.errors.OpcastError` line. Domain validation (a tp that does not divide the
heads, ...) stays with the library, which lists every reason of an infeasible configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Optional, Union

import typer
from rich.markup import escape

from opcast.errors import OpcastError
from opcast.ops import INT_PARAM_LIMIT, whole_number
from opcast.predict.parallel import AttentionImpl, InferConfig, TrainConfig
from opcast.predict.recompute import RECOMPUTE_HELP
from opcast.predict.serve.engine import ENGINES, block_size_problem, engine_version_problem, fusions_problem

REQUIRED: Any = inspect.Parameter.empty
"""The default of an option that must be given."""


@dataclasses.dataclass(frozen=True, slots=True)
class Opt:
    """One command-line option (or, with ``argument``, a positional argument)."""

    name: str
    """Python parameter name, the attribute of :class:`Args`."""
    flags: str
    """``--flag``, or ``--flag/--no-flag`` for a switch that can be turned off."""
    type: Any
    help: str
    default: Any = REQUIRED
    default_help: str | None = None
    """What an omitted option means, when its default is None (shown as ``(default: ...)``)."""
    check: Callable[[Any], str | None] | None = None
    """The problem with a given value, or None; not called when the value is None."""
    argument: bool = False

    def but(self, **changes: Any) -> Opt:
        """The same option with some of its declaration changed (a command's own default)."""
        return dataclasses.replace(self, **changes)

    def parameter(self) -> inspect.Parameter:
        text = f"{self.help.rstrip('.')} (default: {self.default_help})." if self.default_help else self.help
        text = escape(text)  # typer renders help as rich markup: NAME[field=xK] is text, not a tag
        info = typer.Argument(help=text) if self.argument else typer.Option(self.flags, help=text)
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=self.default, annotation=Annotated[self.type, info]
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A check over several options, applied to every command that takes all of them."""

    names: tuple[str, ...]
    check: Callable[[Args], str | None]


class Args(types.SimpleNamespace):
    """The parsed options of one command, as attributes named by :attr:`Opt.name`."""


def command(*specs: Opt, defer_problems: bool = False) -> Callable[[Callable[[Args], None]], Callable[..., None]]:
    """Make ``fn(o: Args)`` a typer command taking ``specs``. The problems of the given values
    (each option's check, then the :data:`RULES` that apply) raise as one line before ``fn``
    runs; with ``defer_problems`` they are handed to ``fn`` in ``o.problems`` instead, for a
    command that reports them together with its own (``opcast search``)."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"an option is declared twice: {names}")
    rules = [r for r in RULES if set(r.names) <= set(names)]

    def wrap(fn: Callable[[Args], None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def run(**values: Any) -> None:
            o = Args(**values)
            problems = [_too_large(s.flags, values[s.name]) for s in specs if _is_huge(values[s.name])]
            problems += [
                p
                for s in specs
                if s.check is not None
                and values[s.name] is not None
                and not _is_huge(values[s.name])
                and (p := s.check(values[s.name]))
            ]
            problems += [p for r in rules if (p := r.check(o))]
            if defer_problems:
                o.problems = problems
            elif problems:
                raise OpcastError("; ".join(problems))
            fn(o)

        params = [s.parameter() for s in specs]
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap


# --------------------------------------------------------------------------- checks


def _is_huge(value: Any) -> bool:
    """An integer option past int64, where the arrays it sizes (and the datasets) stop: a typo, never a size."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_PARAM_LIMIT


def _too_large(flags: str, value: int) -> str:
    return f"{flags.split('/')[0]} {value} is too large: give an integer below 2**63"


def _finite_at_least(flag: str, low: float) -> Callable[[float], str | None]:
    return lambda v: None if math.isfinite(v) and v >= low else f"{flag} {v} must be a finite number >= {low:g}"


def _coverage(c: float) -> str | None:
    return None if 0 < c < 1 else f"--coverage {c} must lie in (0, 1), e.g. 0.9"


def _interval_mode(mode: str) -> str | None:
    return None if mode in ("group", "correlated") else f"--interval-mode {mode!r} must be group or correlated"


def _plot_file(path: Path) -> str | None:
    """A ``--plot`` that cannot be written (a folder, below a file, matplotlib missing or not
    writing its suffix) is refused before anything runs."""
    from opcast.plotting import plot_file_problem

    return plot_file_problem(path)


def _output_file(flag: str, *suffixes: str) -> Callable[[Path], str | None]:
    """The check of an option naming a file to write: refused before the work when it cannot be."""

    def check(path: Path) -> str | None:
        from opcast.atomic import output_file_problem

        return output_file_problem(flag, path, suffixes)

    return check


def _distinct_outputs(*names: str) -> Callable[[Args], str | None]:
    """Two options of one command naming the same output file: the second write would replace the first."""

    def check(o: Args) -> str | None:
        given = [(n, getattr(o, n)) for n in names if getattr(o, n) is not None]
        for i, (a, pa) in enumerate(given):
            for b, pb in given[i + 1 :]:
                if Path(pa).resolve() == Path(pb).resolve():
                    return f"--{a} and --{b} both name {pa}; give each output its own file"
        return None

    return check


def _num_requests(n: int) -> str | None:
    from opcast.predict.serve.requests import MAX_REQUESTS

    if n < 1:
        return f"--num-requests {n} must be >= 1"
    if n > MAX_REQUESTS:
        return (
            f"--num-requests {n}: at most {MAX_REQUESTS:,} requests are simulated (a million take ~100 s); "
            "percentiles settle long before, so give fewer"
        )
    return None


def _models_rule(o: Args) -> str | None:
    from opcast.predict.cost import models_flag_problem

    return models_flag_problem(o.models, not o.roofline)


RULES: tuple[Rule, ...] = (
    Rule(("models", "roofline"), _models_rule),
    Rule(("csv", "plot"), _distinct_outputs("csv", "plot")),
    Rule(("trace", "plot"), _distinct_outputs("trace", "plot")),
)
"""Checks across options: each applies to every command that takes all of its options."""


# --------------------------------------------------------------------------- the options

ARCH = Opt("arch", "--arch", str, "Arch preset (opcast arch list), preset JSON or Hugging Face config.json.")
GPU = Opt(
    "gpu",
    "--gpu",
    str,
    "Catalog GPU name or alias (opcast hardware list), a device JSON file, or "
    "NAME[field=xK,...] (a hypothetical GPU, as --set makes).",
)
SET = Opt(
    "set_",
    "--set",
    Optional[list[str]],
    "Hypothetical GPU: FIELD=xK multiplies a spec of --gpu, FIELD=VALUE sets it (units as in the JSON keys, e.g. "
    "mem_bw_bytes_per_s=8e12); peak_flops=xK scales every peak. Repeat.",
    None,
)
NODES = Opt(
    "nodes",
    "--nodes",
    Optional[int],
    "Nodes (of a catalog --cluster: its NVLink domains).",
    None,
    "as few as the world size needs",
)
GPUS_PER_NODE = Opt(
    "gpus_per_node",
    "--gpus-per-node",
    Optional[int],
    "GPUs per node (of a catalog --cluster: used of each NVLink domain, at most the domain).",
    None,
    "the GPU's typical node, or a catalog --cluster's whole domain",
)
CLUSTER = Opt(
    "cluster",
    "--cluster",
    Optional[str],
    "NODESxGPUS (e.g. 16x8), a catalog cluster NAME or NAME:NODES (data/clusters: perlmutter, vista, dgx-a100, "
    "dgx-h100, dgx-h200, dgx-b200, dgx-b300, gb200-nvl72, gb300-nvl72, l40s-pcie-8, rtx-pro-6000-pcie-8, "
    "azure-nd-a100-v4, azure-nc-a100-v4; its GPU, links and NVLink domain; "
    "--nodes and --gpus-per-node take part of each domain, e.g. gb200-nvl72:2 --gpus-per-node 64 is 128 GPUs), "
    "a catalog-style cluster JSON file, or a JSON file of nodes, gpus_per_node[, gpu].",
    None,
)

MODELS = Opt(
    "models",
    "--models",
    Optional[Path],
    "Learned kernel models (opcast train fit --out); default: the embedded ones.",
    None,
)
ROOFLINE = Opt("roofline", "--roofline", bool, "Ignore learned models: every kernel from the roofline fallback.", False)
ANALYTIC = Opt(
    "analytic",
    "--analytic",
    bool,
    "Where a learned model would extrapolate beyond the hardware it was fitted on, use the analytical "
    "roofline instead (such kernels are flagged either way).",
    False,
)
KERNEL_SOURCE = (MODELS, ROOFLINE, ANALYTIC)
"""Where kernel times come from: :func:`kernel_cost`."""
JSON = Opt("as_json", "--json", bool, "Print the result as JSON.", False)

TENSOR_CORES = Opt(
    "tensor_cores",
    "--tensor-cores/--no-tensor-cores",
    Optional[bool],
    "Matrix math on tensor cores (fp32: TF32); default: all but fp32.",
    None,
)

_ATTENTION_KERNELS = {
    "flash": "FlashAttention-2/3",
    "eager": "the score matrix in memory",
    "flash1": "FlashAttention-1 generation: its CUDA kernels, Triton FlashAttention; priced at its published "
    "measured rate",
    "flash2": "FlashAttention-2 generation: flash-attn 2, torch SDPA's flash backend; on Hopper and Blackwell "
    "priced at its published measured rate, elsewhere as flash",
}
"""What each attention implementation (:data:`opcast.predict.parallel.AttentionImpl`) is, for ``--attention``."""


def _attention_help() -> str:
    names = typing.get_args(AttentionImpl)
    kernels = ", ".join(f"{n} ({_ATTENTION_KERNELS[n]})" if n in _ATTENTION_KERNELS else n for n in names)
    return (
        f"Attention kernel: {kernels}. In predict train a --framework with its own attention kernel runs it in "
        "place of flash (foundry: flash1; neox, hf and hf-liger: flash2)."
    )


# The help of each configuration option; its name, type and default come from the dataclass.
_CONFIG_HELP: dict[str, tuple[str, str | None]] = {
    "tp": ("Tensor-parallel degree.", None),
    "pp": ("Pipeline stages.", None),
    "dp": ("Data-parallel degree.", "world / (tp x pp x cp)"),
    "cp": ("Context-parallel degree.", None),
    "ep": ("Expert-parallel degree (MoE).", None),
    "etp": (
        "Expert tensor parallelism (Megatron --expert-tensor-parallel-size): 1 folds the experts whole over tp x dp "
        "x cp ranks (MoE parallel folding; needs --sp with tp > 1), or tp.",
        "tp",
    ),
    "sp": ("Sequence parallelism.", None),
    "micro_batch": ("Sequences per micro-batch.", None),
    "global_batch": ("Sequences per iteration.", "one micro-batch per data-parallel rank"),
    "seq": ("Sequence length, tokens.", None),
    "recompute": (RECOMPUTE_HELP, None),
    "zero": ("ZeRO stage 0, 1, 2 or 3.", None),
    "precision": (
        "bf16, fp16, fp32, fp8, mxfp8 (block-scaled fp8 linears) or nvfp4 (NVFP4 linears; GPUs with fp4 tensor cores).",
        None,
    ),
    "fp8_recipe": (
        "With --precision fp8: Transformer Engine's per-tensor scaling recipe, delayed (DelayedScaling) or current "
        "(Float8CurrentScaling: an amax pass and a scale kernel before each cast, the amax all-reduced over the "
        "tensor-parallel group where sequence parallelism gathers the fp8 rows).",
        None,
    ),
    "optimizer": ("Optimizer states kept: adam, sgd (with momentum) or none (forward + backward only).", None),
    "clocks": (
        "sustained (a training step holds a GPU at its power cap: compute-bound GEMM and attention kernels at the "
        "clock it allows, measured for H100, H800, H200 and B200; others keep their kernel times) or boost (the kernel "
        "benchmarks' burst rates, e.g. to compare with them).",
        None,
    ),
    "attention": (_attention_help(), None),
    "schedule": ("1f1b or interleaved.", None),
    "virtual_stages": ("Model chunks per stage (interleaved).", None),
    "pp_layers": (
        "Transformer layers of each pipeline stage, comma-separated, e.g. 5,6,6,6,6,6,5,4.",
        "by --pp-partition",
    ),
    "pp_partition": (
        "How layers split over pipeline stages: auto (even where pp divides the layers, else DeepSpeed's "
        "type:transformer|mlp as GPT-NeoX; interleaved: Megatron's), DeepSpeed's uniform, parameters or "
        "type:REGEX, or megatron[:first=N,last=N] / megatron:embedding,loss (Megatron-LM's first/last-stage "
        "layer counts and account_for_embedding/loss_in_pipeline_split).",
        None,
    ),
    "overlap_grad_reduce": ("Overlap the data-parallel gradient reduction with the last backward.", None),
    "overlap_param_gather": (
        "Overlap the distributed optimizer's weight all-gather (--zero 1/2) with the next iteration's first "
        "forward, leaving max(one bucket, gather - that forward) exposed (Megatron-LM --overlap-param-gather; "
        "needs --overlap-grad-reduce).",
        None,
    ),
    "tp_comm_overlap": (
        "Overlap each tensor-parallel all-gather / reduce-scatter with the GEMM of the same layer (Megatron-LM / "
        "Transformer Engine --tp-comm-overlap; needs --sp): only what exceeds the GEMM's time stays exposed.",
        None,
    ),
    "tp_comm_overlap_cfg": (
        "With --tp-comm-overlap: Transformer Engine userbuffers settings per GEMM in place of TE's defaults (a "
        "recipe's ub_cfgs): GEMM=METHOD[:smN][:splitN][:margin|:nomargin][:aggregate],..., e.g. "
        "qkv_wgrad=bulk:sm24:nomargin,proj_fprop=pipeline:sm24:split4:margin.",
        "TE's defaults",
    ),
    "overlap_moe_ep_comm": (
        "Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): each MoE block's dispatch and combine "
        "all-to-alls hidden behind another micro-batch's expert and attention compute (needs --ep > 1).",
        None,
    ),
    "moe_dispatcher": (
        "How expert parallelism moves tokens between nodes: alltoall (Megatron-Core's NCCL all-to-all: a token "
        "crosses the network once per expert on another node) or flex (DeepEP / HybridEP: Megatron "
        "moe_token_dispatcher_type flex; once per remote node holding any of its experts, then NVLink inside the "
        "node).",
        None,
    ),
    "overlap_p2p_comm": (
        "Overlap each pipeline send with the compute of one model chunk (Megatron-LM overlap_p2p_comm; "
        "interleaved schedule only; Megatron's default is on, ours off).",
        None,
    ),
    "tensor_cores": (TENSOR_CORES.help, None),
    "framework": (
        "megatron, neox, hf, hf-liger, foundry or torch: the kernels the framework runs (fused, native, unfused or "
        "Liger-Kernel norms, softmax, cross-entropy; hf-liger: Hugging Face with use_liger_kernel; foundry: "
        "llm-foundry's FlashAttention-1-class Triton attention; torch: plain PyTorch modules, as opcast validate "
        "runs them) and what it keeps in "
        "memory (megatron: fp32 main_grad, 18 bytes a parameter with Adam).",
        "Megatron's kernels, 16 bytes a parameter",
    ),
    "grad_reduce_in_fp32": (
        "Keep the gradients in fp32 and reduce them in fp32 across data-parallel ranks (Megatron-Core "
        "grad_reduce_in_fp32: 4 bytes a gradient in memory and in the reduce-scatter / all-reduce).",
        "the framework's: on with megatron, off otherwise",
    ),
    "rope_fusion": (
        "Rotary embeddings as one kernel (Megatron-Core apply_rope_fusion); --no-rope-fusion: Hugging Face's torch "
        "ops (Megatron-LM --no-rope-fusion).",
        "the framework's: one kernel with megatron (Liger's with hf-liger), torch ops otherwise",
    ),
    "swiglu_fusion": (
        "A SiLU-gated MLP's activation and gate product as one kernel (Megatron-Core bias_activation_fusion); "
        "--no-swiglu-fusion: two kernels (Megatron-LM --no-bias-swiglu-fusion, torch eager).",
        "the framework's: one kernel with megatron and hf-liger, two otherwise",
    ),
    "offload_activations": (
        "Layers whose activations go to host memory between forward and backward (Megatron-Core cpu_offloading, "
        "cpu_offloading_num_layers; pp=1, no --recompute): they leave GPU memory, and the copies over the GPU's "
        "host link (host_link_bw_bytes_per_s: NVLink-C2C on GB200/GH200, PCIe elsewhere) run behind the layers' "
        "compute, only what the compute cannot hide exposed.",
        None,
    ),
    "batch": ("Sequences decoded together.", None),
    "prompt_len": ("Prompt tokens per sequence.", None),
    "gen_len": ("Generated tokens per sequence.", None),
    "kv_dtype": (
        "The KV cache's dtype: fp8 holds a token in half the bytes and runs attention as an fp8 kernel over it "
        "(vLLM --kv-cache-dtype fp8, TensorRT-LLM kv_cache_config dtype fp8, its default for NVIDIA's fp8 and nvfp4 "
        "checkpoints); bf16 or fp16.",
        "the activations' dtype",
    ),
    "fusions": (
        "vLLM's compile-time kernel fusions that ran, comma-separated (--engine vllm; its compilation_config "
        "pass_config): allreduce_rms (fuse_allreduce_rms, enable_fi_allreduce_fusion: each TP all-reduce with the "
        "residual add, RMSNorm and fp8 quantisation after it as one FlashInfer kernel, up to vLLM's size limit, on "
        "Hopper and datacenter Blackwell), attn_quant (fuse_attn_quant, enable_attn_fusion: attention writes the "
        "output projection's fp8 input).",
        "none",
    ),
    "mxfp4_moe": (
        "How MXFP4 experts (gpt-oss's) run: marlin (Marlin's W4A16 MoE; vLLM VLLM_MXFP4_USE_MARLIN=1), bf16 (the "
        "engine's W4A16 kernel: bf16 activations, the weights dequantised in it) or mxfp8 (activations quantised to "
        "MXFP8 on Blackwell's block-scaled tensor cores; vLLM VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, TensorRT-LLM's "
        "W4A8_MXFP4_MXFP8).",
        "the engine's choice by GPU and release: TensorRT-LLM mxfp8 on Blackwell, SGLang on datacenter "
        "Blackwell, else bf16; vLLM marlin on Ampere, Ada, sm_120 and Hopper before 0.12, else bf16",
    ),
    "engine_version": (
        "The --engine's release, e.g. 0.11.0, where its kernels or overheads depend on it (vLLM before 0.12 runs "
        "MXFP4 MoE experts on Hopper with Marlin, later ones with OpenAI Triton's matmul_ogs; vLLM before 0.6 "
        "processes outputs on the step's critical path, 0.7 ms + 50 us a sequence a step).",
        "the newest",
    ),
}
_SWITCHES = {
    "tensor_cores",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "tp_comm_overlap",
    "overlap_p2p_comm",
    "grad_reduce_in_fp32",
    "rope_fusion",
    "swiglu_fusion",
}
"""Boolean fields that take ``--no-...`` as well (a default that may be on)."""
_NOT_OPTIONS = {"bucket_params"}
"""Fields with no command-line option (library use only)."""
_OPTION_DECLARED_ELSEWHERE = {"engine"}
"""Fields whose option another group declares and this group reuses (``--engine``: :data:`INFER_ENGINE`)."""


def parse_pp_layers(text: str) -> tuple[int, ...]:
    """``--pp-layers 5,6,6,...``: the layers of each stage (its count and sum are the library's to check)."""
    if (problem := _pp_layers_problem(text)) is not None:
        raise OpcastError(problem)
    return tuple(whole_number(t) or 0 for t in text.split(","))


def _pp_layers_problem(text: str) -> str | None:
    layers = [whole_number(t) for t in text.split(",")]
    if None in layers:
        return f"--pp-layers {text!r}: give the layers of each stage as positive integers, e.g. 5,6,6,6,6,6,5,4"
    if any(n is not None and n < 1 for n in layers):
        return f"--pp-layers {text!r}: every stage needs >= 1 layer"
    if any(n is not None and n >= INT_PARAM_LIMIT for n in layers):
        return f"--pp-layers {text!r} is too large: give each stage's layers, below 2**63"
    return None


def _tp_overlap_cfg_problem(text: str) -> str | None:
    from opcast.predict.tp_overlap import config_problem

    return config_problem(text)


_TEXT_FIELDS: dict[str, Callable[[Any], str | None] | None] = {
    "pp_layers": _pp_layers_problem,
    "engine_version": engine_version_problem,
    "fusions": fusions_problem,
    "tp_comm_overlap_cfg": _tp_overlap_cfg_problem,
}
"""Configuration fields given as text on the command line (parsed by :func:`train_config`), with their check."""


def _cli_type(hint: Any) -> Any:
    """The type typer parses: Literal choices as str (the library names every bad value among the
    reasons of an infeasible configuration), ``X | None`` as ``Optional[X]``."""
    if typing.get_origin(hint) is Literal:
        return str
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return Optional[_cli_type(inner)]
    return hint


def config_options(cls: type) -> tuple[Opt, ...]:
    """The options of a configuration dataclass, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in _NOT_OPTIONS or f.name in _OPTION_DECLARED_ELSEWHERE:
            continue
        help_, default_help = _CONFIG_HELP[f.name]  # a new field needs its help above
        flag = "--" + f.name.replace("_", "-")
        text = f.name in _TEXT_FIELDS  # given as text, parsed by train_config
        out.append(
            Opt(
                f.name,
                f"{flag}/--no-{flag[2:]}" if f.name in _SWITCHES else flag,
                Optional[str] if text else _cli_type(hints[f.name]),
                help_,
                f.default,
                default_help,
                check=_TEXT_FIELDS.get(f.name),
            )
        )
    return tuple(out)


TRAIN = config_options(TrainConfig)
"""``TrainConfig`` as options: tp, pp, dp, cp, ep, sp, micro-batch, global-batch, seq, ..."""
_INFER_OVERRIDES: dict[str, dict[str, str]] = {
    "ep": {
        "help": "Expert parallelism of an MoE arch: every expert whole on one of EP GPUs, EP a multiple of --tp: --tp "
        "(vLLM --enable-expert-parallel) or that many GPUs of EP / tp replicas serving as attention data-parallel "
        "ranks (SGLang --enable-dp-attention), priced as if each replica of the group ran the same batch; 1: the "
        "experts split over tp."
    },
    "moe_dispatcher": {
        "help": "How expert parallelism across replicas (--ep > --tp) moves tokens: alltoall (one copy a token per "
        "expert), flex (DeepEP as SGLang's --moe-a2a-backend deepep runs it: once per remote node in prefill, once "
        "per expert in decode, every peer written at once) or allgather (vLLM's allgather_reducescatter: every "
        "replica's tokens all-gathered to every replica, the outputs reduce-scattered back).",
        "default_help": "the --engine's: allgather under vllm (its default backend), else alltoall",
    },
}
"""What ``predict infer`` says of an option differently from ``predict train`` (the same field, another meaning)."""
INFER = tuple(o.but(**_INFER_OVERRIDES.get(o.name, {})) for o in config_options(InferConfig))
"""``InferConfig`` as options: tp, pp, ep, batch, prompt-len, gen-len, precision, attention, tensor-cores, and
``--engine`` (:data:`INFER_ENGINE`, added once the serving options declare it)."""
INFER_NODES = NODES.but(default_help="as few as tp x pp needs")


def _option(group: tuple[Opt, ...], name: str) -> Opt:
    return next(o for o in group if o.name == name)


PRECISION = _option(TRAIN, "precision")
FP8_RECIPE = _option(TRAIN, "fp8_recipe")
MOE_DISPATCHER = _option(TRAIN, "moe_dispatcher")
ATTENTION = _option(TRAIN, "attention")
FRAMEWORK = _option(TRAIN, "framework")
CLOCKS = _option(TRAIN, "clocks")


# predict train
TRAIN_GPU = GPU.but(default=None, default_help="the gpu of a --cluster file")
TRACE = Opt(
    "trace",
    "--trace",
    Optional[Path],
    "Write a Chrome/Perfetto trace of one iteration.",
    None,
    check=_output_file("--trace"),
)
TRAIN_PLOT = Opt(
    "plot", "--plot", Optional[Path], "Write a breakdown chart (needs matplotlib).", None, check=_plot_file
)
COVERAGE = Opt("coverage", "--coverage", float, "Coverage of the prediction interval (0-1).", 0.9, check=_coverage)
INTERVAL_MODE = Opt(
    "interval_mode",
    "--interval-mode",
    str,
    "How kernel errors combine: group (correlated within a learned predictor, independent between them) "
    "or correlated (all together).",
    "group",
    check=_interval_mode,
)

# predict kernel, kernels
OP = Opt("op", "--op", str, "Op kind (opcast.ops registry), e.g. gemm, attention, all_reduce.")
PARAM = Opt("param", "--param", Optional[list[str]], "Shape parameter k=v (repeat).", None)
DTYPE = Opt("dtype", "--dtype", str, "fp32, tf32, fp16, bf16, fp8, fp8_block (block-scaled fp8) or nvfp4.", "bf16")
DIRECTION = Opt("direction", "--direction", str, "fwd or bwd.", "fwd")
KERNELS_INPUT = Opt(
    "input",
    "INPUT",
    Path,
    "Rows to predict: a .parquet (e.g. an opcast dataset) or .csv with op, dtype (default bf16), "
    "direction (default fwd) and the op's parameter columns (a gemm's b defaults to 1).",
    argument=True,
)
KERNELS_OUT = Opt(
    "out",
    "--out",
    Path,
    "Output .parquet or .csv: the input rows plus time_s_pred and source_pred.",
    check=_output_file("--out", ".parquet", ".csv"),
)

# search
SEARCH_GPUS = Opt("gpus", "--gpus", int, "GPUs available (the world size).")
SEARCH_GLOBAL_BATCH = _option(TRAIN, "global_batch").but(type=int, default=REQUIRED, default_help=None)
SEARCH_SEQ = _option(TRAIN, "seq").but(default=REQUIRED)
SEARCH_OVERLAP = _option(TRAIN, "overlap_grad_reduce").but(default=True)
SEARCH_PARAM_GATHER = _option(TRAIN, "overlap_param_gather").but(
    help="Megatron-LM's --overlap-param-gather on every configuration with the distributed optimizer (ZeRO 1 or 2): "
    "the weight all-gather behind the next iteration's first forward."
)
SEARCH_TP_COMM_OVERLAP = _option(TRAIN, "tp_comm_overlap").but(
    help="Transformer Engine's userbuffers overlap of the tensor-parallel collectives with their GEMMs (TE's "
    "default settings) on every configuration with sequence parallelism (Megatron-LM asserts it)."
)
SEARCH_PP_PARTITION = _option(TRAIN, "pp_partition").but(
    help="How the layers are split over the pipeline stages: auto (evenly; pp must divide n_layers) or "
    "megatron:embedding,loss (Megatron-LM's account_for_embedding/loss_in_pipeline_split: the embedding and the "
    "loss count as a layer each, e.g. Llama 3.1 405B's 126 + 2 layers over pp 8; megatron:embedding or "
    "megatron:loss for one of them)."
)
SEARCH_P2P_OVERLAP = _option(TRAIN, "overlap_p2p_comm").but(
    help="Megatron-LM's overlap_p2p_comm on every interleaved configuration: each pipeline send behind one model "
    "chunk's compute (Megatron-LM turns it off for 1F1B)."
)
TOP = Opt(
    "top",
    "--top",
    int,
    "Configurations to show (each re-predicted with the full breakdown).",
    10,
    check=lambda v: None if v >= 0 else f"--top {v} must be >= 0 (the number of rows to list), e.g. 5",
)
OBJECTIVE = Opt(
    "objective",
    "--objective",
    str,
    "throughput: most tokens/s; cost: fewest GPU-hours per token (also tries fewer GPUs than --gpus: "
    "every divisor that is whole nodes or fits one node); memory: least memory per GPU.",
    "throughput",
)
MAX_TP = Opt("max_tp", "--max-tp", Optional[int], "Largest tensor-parallel degree.", None)
TP_WITHIN_NODE = Opt("tp_within_node", "--tp-within-node", bool, "Keep tensor-parallel groups inside a node.", False)
MAX_MEM = Opt("max_mem", "--max-mem", Optional[float], "Memory limit per GPU, GiB.", None, "the GPU's memory")
FIX = Opt(
    "fix",
    "--fix",
    Optional[list[str]],
    "Restrict a dimension: KEY=V[,V...] with KEY one of tp, pp, cp, ep, sp (on/off), micro_batch, recompute, zero, "
    "schedule, virtual_stages (repeat); recompute also takes Megatron-Core's modules, e.g. "
    "--fix recompute=none,selective:mlp,full.",
    None,
)
ALLOW_STRADDLING = Opt(
    "allow_straddling",
    "--allow-straddling",
    bool,
    "Also search layouts whose tp / cp / dp groups straddle node boundaries (priced as if aligned: optimistic).",
    False,
)
GPU_HOUR_PRICE = Opt(
    "gpu_hour_price",
    "--gpu-hour-price",
    Optional[float],
    "Price of one GPU-hour: adds a cost column in that currency.",
    None,
    check=_finite_at_least("--gpu-hour-price", 0),
)
WORKERS = Opt(
    "workers",
    "--workers",
    Optional[int],
    "Processes for large spaces.",
    None,
    "the cores available; small spaces stay in one",
)
SEARCH_CSV = Opt(
    "csv",
    "--csv",
    Optional[Path],
    "Write every feasible configuration, ranked, to this .csv file.",
    None,
    check=_output_file("--csv", ".csv"),
)

# explore, compare
EXPLORE_GPU = GPU.but(
    help="The base GPU: catalog name or alias, device JSON file, or NAME[field=xK,...].",
    default=None,
    default_help="the GPU of --cluster",
)
COMPARE_CLUSTER = CLUSTER.but(
    help="NODESxGPUS (e.g. 16x8), a JSON file of nodes, gpus_per_node, or a catalog cluster NAME[:NODES] (or "
    "catalog-style file) as the network: each of --gpus gets the cluster's links and NVLink domain (then --set); "
    "--nodes and --gpus-per-node take part of each domain."
)
GPU_LIST = Opt(
    "gpus",
    "--gpus",
    str,
    "Comma-separated GPUs, the first is the reference, e.g. A100-SXM4-80GB,H100-SXM,B200 (NAME[field=xK,...] allowed).",
)
VARY = Opt(
    "vary",
    "--vary",
    list[str],
    "FIELD=F1,F2,...: factors of the base GPU's FIELD (any numeric spec key, or "
    "peak_flops for every peak); repeat for a grid.",
)
TABLE_CSV = Opt(
    "csv", "--csv", Optional[Path], "Also write the table to this .csv file.", None, check=_output_file("--csv", ".csv")
)
CHART = Opt("plot", "--plot", Optional[Path], "Write a chart (.png; needs matplotlib).", None, check=_plot_file)


# predict serve
def _length_problem(flag: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        from opcast.predict.serve.requests import parse_lengths

        try:
            parse_lengths(text, flag)
        except OpcastError as err:
            return str(err)
        return None

    return check


def _one_of(flag: str, choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"{flag} {v!r} is not one of {', '.join(choices)}"


def _router(v: str) -> str | None:
    from opcast.predict.serve.simulate import ROUTERS

    return _one_of("--router", ROUTERS)(v)


def _positive(flag: str) -> Callable[[float], str | None]:
    return lambda v: None if math.isfinite(v) and v > 0 else f"{flag} {v} must be a finite number > 0"


def _fraction(v: float) -> str | None:
    return None if 0 < v <= 1 else f"--gpu-memory-utilization {v} must lie in (0, 1], e.g. 0.9"


def _hit_fraction(v: float) -> str | None:
    from opcast.predict.serve.kv_cache import hit_fraction_problem  # only when the option is given

    return hit_fraction_problem(v)


def _serve_stream_rule(o: Args) -> str | None:
    given = [
        f
        for f, v in (
            ("--rate", o.rate),
            ("--lengths", o.lengths),
            ("--input-len", o.input_len),
            ("--output-len", o.output_len),
        )
        if v is not None
    ]
    concurrency = getattr(o, "concurrency", None)  # predict serve's closed loop (search serve has none)
    if concurrency is not None:
        given.insert(1, "--concurrency")
    if o.trace_file is not None:
        return f"give either --trace-file or {', '.join(given)}, not both" if given else None
    if o.rate is not None and concurrency is not None:
        return "give either --rate (arrivals at a rate) or --concurrency (a closed loop of clients), not both"
    if o.rate is None and concurrency is None:
        opts = "--rate (requests/s)" + (" or --concurrency (requests in flight)" if hasattr(o, "concurrency") else "")
        return f"{opts} is required, or give --trace-file with the arrivals"
    if o.lengths is not None and (o.input_len is not None or o.output_len is not None):
        return "give either --lengths sharegpt or --input-len/--output-len, not both"
    return None


RULES += (Rule(("trace_file", "rate", "lengths", "input_len", "output_len"), _serve_stream_rule),)


def _disaggregate_problem(text: str) -> str | None:
    from opcast.predict.serve.disagg import parse_disaggregate

    try:
        parse_disaggregate(text)
    except OpcastError as err:
        return str(err)
    return None


def _disaggregate_rule(o: Args) -> str | None:
    if o.disaggregate is not None and o.replicas != 1:
        return f"give either --replicas or --disaggregate {o.disaggregate} (P+D replicas in all), not both"
    return None


RULES += (Rule(("disaggregate", "replicas"), _disaggregate_rule),)

_ENGINE_DEFAULT = "the --engine's default (vLLM: by GPU memory, as vLLM's EngineArgs)"
SERVE_PARALLEL = tuple(
    _option(INFER, n)
    for n in (
        "tp",
        "pp",
        "ep",
        "precision",
        "kv_dtype",
        "attention",
        "tensor_cores",
        "engine_version",
        "fusions",
        "mxfp4_moe",
        "moe_dispatcher",
    )
)
"""A replica's layout and numerics: the options of ``predict infer`` that apply to serving."""
SERVE = (
    Opt(
        "replicas",
        "--replicas",
        int,
        "Data-parallel replicas, each tp x pp GPUs.",
        1,
        check=lambda v: None if v >= 1 else f"--replicas {v} must be >= 1",
    ),
    Opt(
        "router",
        "--router",
        str,
        "How arrivals go to replicas: round_robin or least_loaded (fewest in flight).",
        "round_robin",
        check=_router,
    ),
    Opt(
        "engine",
        "--engine",
        str,
        "Serving engine whose defaults and per-step overhead to follow: vllm, sglang or trtllm.",
        "vllm",
        check=_one_of("--engine", ENGINES),
    ),
    Opt(
        "rate",
        "--rate",
        Optional[float],
        "Poisson arrival rate, requests/s.",
        None,
        "required without --trace-file",
        check=_positive("--rate"),
    ),
    Opt(
        "concurrency",
        "--concurrency",
        Optional[int],
        "Closed loop: N requests in flight, as a benchmark client with a concurrency limit and no rate limit "
        "sends them (vLLM's benchmark_serving --max-concurrency N --request-rate inf, aiperf --concurrency N): N "
        "arrive at once and each next one when one finishes (instead of --rate).",
        None,
        check=lambda v: None if v >= 1 else f"--concurrency {v} must be >= 1 requests in flight, e.g. 32",
    ),
    Opt(
        "num_requests",
        "--num-requests",
        int,
        "Requests to simulate (with --rate or --concurrency).",
        1000,
        check=_num_requests,
    ),
    Opt(
        "input_len",
        "--input-len",
        Optional[str],
        "Prompt tokens: N, or LO:HI for uniform integers.",
        None,
        "512",
        check=_length_problem("--input-len"),
    ),
    Opt(
        "output_len",
        "--output-len",
        Optional[str],
        "Output tokens: N, or LO:HI for uniform integers.",
        None,
        "128",
        check=_length_problem("--output-len"),
    ),
    Opt(
        "lengths",
        "--lengths",
        Optional[str],
        "sharegpt: lognormal prompt and output lengths with ShareGPT's means (vLLM paper, Fig. 11).",
        None,
        check=_one_of("--lengths", ("sharegpt",)),
    ),
    Opt(
        "trace_file",
        "--trace-file",
        Optional[Path],
        "Requests from a CSV or JSONL file of arrival_s, input_tokens, output_tokens (instead of --rate).",
        None,
    ),
    Opt(
        "seed",
        "--seed",
        int,
        "Seed of the arrivals and lengths.",
        0,
        check=lambda v: None if v >= 0 else f"--seed {v} must be >= 0 (numpy seeds its generator with one), e.g. 0",
    ),
    Opt(
        "prefix_cache_hit",
        "--prefix-cache-hit",
        Optional[float],
        "FRACTION of each prompt found in the prefix cache on arrival, in whole KV blocks and never the last "
        "token (vLLM's rule): 1 models a warm cache (prompts served before), 0.5 a shared first half. The hit's "
        "tokens are not recomputed but hold KV blocks; a trace file may give a cached_tokens column instead.",
        None,
        "no hits (or the trace's cached_tokens)",
        check=_hit_fraction,
    ),
    Opt(
        "slo_ttft_s",
        "--slo-ttft-s",
        Optional[float],
        "SLO on time to first token, seconds (goodput).",
        None,
        check=_positive("--slo-ttft-s"),
    ),
    Opt(
        "slo_tpot_s",
        "--slo-tpot-s",
        Optional[float],
        "SLO on time per output token, seconds (goodput).",
        None,
        check=_positive("--slo-tpot-s"),
    ),
    Opt(
        "max_num_seqs",
        "--max-num-seqs",
        Optional[int],
        "Most sequences in one step (vLLM refuses more than --max-num-batched-tokens).",
        None,
        _ENGINE_DEFAULT,
        check=lambda v: None if v >= 1 else f"--max-num-seqs {v} must be >= 1",
    ),
    Opt(
        "max_num_batched_tokens",
        "--max-num-batched-tokens",
        Optional[int],
        "Most tokens in one step.",
        None,
        _ENGINE_DEFAULT,
        check=lambda v: None if v >= 1 else f"--max-num-batched-tokens {v} must be >= 1",
    ),
    Opt(
        "chunked_prefill",
        "--chunked-prefill/--no-chunked-prefill",
        Optional[bool],
        "Split prompts over steps.",
        None,
        _ENGINE_DEFAULT,
    ),
    Opt(
        "block_size",
        "--block-size",
        Optional[int],
        "Tokens per KV-cache block.",
        None,
        _ENGINE_DEFAULT,
        check=lambda v: block_size_problem(v, "--block-size"),
    ),
    Opt(
        "gpu_memory_utilization",
        "--gpu-memory-utilization",
        Optional[float],
        "Fraction of GPU memory the engine uses.",
        None,
        _ENGINE_DEFAULT,
        check=_fraction,
    ),
    Opt(
        "batch_wait_iters",
        "--batch-wait-iters",
        Optional[int],
        "TensorRT-LLM's batch_wait_timeout_iters: steps new prompts may be held back while requests decode, to "
        "batch more of them (with --batch-wait-tokens-ratio; --engine trtllm only).",
        None,
        "0, never held (TensorRT-LLM's default)",
        check=lambda v: None if 0 <= v <= 10_000 else f"--batch-wait-iters {v} must lie in [0, 10000] steps, e.g. 20",
    ),
    Opt(
        "batch_wait_tokens_ratio",
        "--batch-wait-tokens-ratio",
        Optional[float],
        "TensorRT-LLM's batch_wait_max_tokens_ratio: held prompts go once the step's tokens reach this fraction "
        "of --max-num-batched-tokens (with --batch-wait-iters; --engine trtllm only).",
        None,
        "0 (TensorRT-LLM's default)",
        check=lambda v: None if 0 <= v <= 1 else f"--batch-wait-tokens-ratio {v} must lie in [0, 1], e.g. 0.9",
    ),
    Opt(
        "frontend_ms",
        "--frontend-ms",
        Optional[float],
        "Milliseconds the engine's API front end adds to each request's TTFT and end-to-end time, as a client "
        "sees them (HTTP, streaming); measure it on your deployment as the client's TTFT less the server's own.",
        None,
        "vllm: 10.2 ms, measured (predict/serve/engine.py FRONTENDS); others 0",
        check=lambda v: (
            None
            if math.isfinite(v) and 0 <= v < 10_000
            else f"--frontend-ms {v} must be a number of milliseconds in [0, 10000), e.g. 10"
        ),
    ),
    Opt(
        "disaggregate",
        "--disaggregate",
        Optional[str],
        "P:D: P replicas only prefill and D only decode (each tp x pp GPUs), the prompt's KV sent between them "
        "over the cluster's links (DistServe); --router places arrivals on the prefill replicas.",
        None,
        "colocated: every replica prefills and decodes",
        check=_disaggregate_problem,
    ),
)
"""``opcast predict serve``: the deployment, the engine's limits, the request stream and the SLOs."""

INFER_ENGINE = _option(SERVE, "engine").but(
    help="Serving framework whose per-step overhead (scheduling, input preparation, sampling; estimates) each "
    "prefill and decode step pays: vllm, sglang or trtllm; none: the forward passes alone.",
    default="none",
    check=_one_of("--engine", ("none", *ENGINES)),
)
INFER = (*INFER, INFER_ENGINE)
"""``predict infer`` / ``explore infer`` / ``compare infer``: :class:`InferConfig`'s options with ``--engine``."""
SERVE_TRACE = TRACE.but(help="Write a Chrome/Perfetto trace of every step of every replica.")
SERVE_PLOT = TRAIN_PLOT.but(
    help="Write a figure (.png, .svg or .pdf by the suffix; needs matplotlib, pip install 'opcast[plot]'): CDFs "
    "of TTFT, TPOT and end-to-end latency with their p50/p90/p99 and SLOs, and over simulated time the "
    "arrivals, first tokens and completions, sequences and tokens per step and KV-cache blocks in use."
)


# --------------------------------------------------------------------------- options -> library objects


def train_config(o: Args) -> TrainConfig:
    """The :class:`TrainConfig` of a command's options (fields without an option keep their default)."""
    values = {s.name: getattr(o, s.name) for s in TRAIN}
    if values.get("pp_layers") is not None:
        values["pp_layers"] = parse_pp_layers(values["pp_layers"])
    return TrainConfig(**values)


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where a command's job runs: ``--gpu``, ``--nodes``, ``--gpus-per-node`` and ``--cluster`` resolved."""

    gpu: str | None
    """The GPU to price on (a catalog cluster's: the GPU with the cluster's links and NVLink domain), or None."""
    nodes: int | None
    gpus_per_node: int | None
    cluster: str | None = None
    """The catalog cluster's name (``--cluster NAME`` or a catalog-style file), whose learned collectives
    a model set may hold (:func:`opcast.predict.comm_learned.collective_cost_for`); None for the other forms."""
    network: tuple[str, ...] = ()
    """A catalog cluster's ``FIELD=VALUE`` settings that put a GPU on its network (links and NVLink domain):
    ``opcast compare --cluster NAME`` applies them to each of its GPUs."""

    def comms(self, kernels):
        """The collective cost model of this placement with ``kernels``' model set."""
        from opcast.predict.comm_learned import collective_cost_for

        return collective_cost_for(kernels, cluster=self.cluster)


def placement(o: Args, *, gpu_given: bool = True) -> Placement:
    """The :class:`Placement` of ``--gpu``, ``--nodes``, ``--gpus-per-node`` and ``--cluster`` (options a
    command lacks count as not given). A catalog cluster sets the GPU with its links and NVLink domain, so
    ``--gpu`` beside it is refused rather than silently dropping the cluster's network; ``--nodes`` and
    ``--gpus-per-node`` beside it are the job's counts of its domains and of each domain's GPUs
    (:func:`~opcast.predict.parallel.job_on_cluster`), while the other forms set both counts themselves and
    refuse them. ``gpu_given=False`` (``opcast compare``, whose GPUs come from ``--gpus``) keeps only the
    cluster's network, nodes and name."""
    from opcast.hardware import get_device
    from opcast.predict.parallel import ClusterChoice, job_on_cluster, parse_cluster

    gpu, nodes, per_node = getattr(o, "gpu", None), getattr(o, "nodes", None), getattr(o, "gpus_per_node", None)
    if o.cluster is None:
        return Placement(gpu, nodes, per_node)
    cluster, cluster_gpu = parse_cluster(o.cluster)
    if not isinstance(cluster, ClusterChoice):
        if nodes is not None or per_node is not None:
            raise OpcastError(
                f"--cluster {o.cluster} sets the nodes and GPUs per node: give either --cluster or --nodes/"
                "--gpus-per-node, not both (beside a catalog cluster NAME[:NODES] they count its NVLink domains)"
            )
        if not gpu_given and cluster_gpu is not None:
            raise OpcastError(
                f"--cluster {o.cluster} names a gpu ({cluster_gpu}); compare takes its GPUs from --gpus, "
                "so leave gpu out of the file"
            )
        if gpu is not None and cluster_gpu is not None and get_device(gpu).name != get_device(cluster_gpu).name:
            raise OpcastError(
                f"--cluster {o.cluster} names gpu {cluster_gpu}, --gpu names {gpu}: give one GPU, leaving --gpu "
                "out or gpu out of the file"
            )
        return Placement(gpu or cluster_gpu, cluster.nodes, cluster.gpus_per_node)
    if gpu_given and gpu is not None:
        raise OpcastError(
            f"--cluster {o.cluster} sets the GPU and its links ({cluster_gpu}); leave --gpu out, "
            "or give --cluster NODESxGPUS with --gpu"
        )
    assert cluster_gpu is not None and cluster_gpu.endswith("]"), "a catalog cluster names GPU[links]"
    network = tuple(cluster_gpu[cluster_gpu.index("[") + 1 : -1].split(","))  # cluster_device_name's settings
    domain_gpus = get_device(cluster_gpu).gpus_per_node
    cluster = job_on_cluster(cluster, o.cluster, domain_gpus=domain_gpus, nodes=nodes, gpus_per_node=per_node)
    return Placement(cluster_gpu, cluster.nodes, cluster.gpus_per_node, cluster.name, network)


def infer_config(o: Args) -> InferConfig:
    return InferConfig(**{s.name: getattr(o, s.name) for s in INFER})


def device(gpu: str, sets: list[str] | None):
    """The ``--gpu`` device with every ``--set`` applied (a hypothetical GPU named ``GPU[field=...]``)."""
    from opcast.hardware import derive_device, get_device

    return derive_device(get_device(gpu), sets or [])


def kernel_cost(o: Args):
    """The kernel cost model of ``--models``, ``--roofline`` and ``--analytic``."""
    from opcast.predict.cost import load_kernel_cost

    return load_kernel_cost(o.models, use_learned=not o.roofline, in_range_only=o.analytic)


ENGINE_SETTINGS: Final = (
    "chunked_prefill",
    "block_size",
    "gpu_memory_utilization",
    "batch_wait_iters",
    "batch_wait_tokens_ratio",
)
"""The engine's settings besides its two step limits (``--max-num-seqs``, ``--max-num-batched-tokens``), each an
:class:`~opcast.predict.serve.engine.EngineConfig` field of the same name: ``predict serve`` passes them with the
limits, ``search serve`` holds them fixed while it searches the limits."""


def serve_engine(o: Args, dev):
    """The :class:`~opcast.predict.serve.engine.EngineConfig` of ``--engine`` on ``dev`` with the limits given."""
    from opcast.predict.serve.engine import engine_config, step_overhead

    names = ("max_num_seqs", "max_num_batched_tokens", *ENGINE_SETTINGS)
    frontend_s = None if o.frontend_ms is None else o.frontend_ms / 1e3
    overhead = step_overhead(o.engine, getattr(o, "engine_version", None)) if o.engine in ENGINES else None
    return engine_config(o.engine, dev, frontend_s=frontend_s, overhead=overhead, **{n: getattr(o, n) for n in names})


def serve_stream(o: Args, engine=None):
    """The requests of ``--trace-file``, or of ``--rate`` (or ``--concurrency``) with ``--lengths`` or ``--input-len`` /
    ``--output-len``;
    with ``engine`` (its KV block size), the prefix-cache hits of ``--prefix-cache-hit`` where the command takes it."""
    from opcast.predict.serve.requests import (
        SHAREGPT,
        closed_loop_stream,
        parse_lengths,
        poisson_stream,
        read_trace,
        with_prefix_cache,
    )

    if o.trace_file is not None:
        stream = read_trace(o.trace_file)
    else:
        if o.lengths == "sharegpt":
            input_len, output_len = SHAREGPT
        else:
            input_len = parse_lengths(o.input_len or "512", "--input-len")
            output_len = parse_lengths(o.output_len or "128", "--output-len")
        if getattr(o, "concurrency", None) is not None:
            stream = closed_loop_stream(
                concurrency=o.concurrency,
                num_requests=o.num_requests,
                input_len=input_len,
                output_len=output_len,
                seed=o.seed,
            )
        else:
            stream = poisson_stream(
                rate_per_s=o.rate, num_requests=o.num_requests, input_len=input_len, output_len=output_len, seed=o.seed
            )
    hit = getattr(o, "prefix_cache_hit", None)
    if hit is not None and engine is not None:
        stream = with_prefix_cache(stream, hit, engine.block_size)
    return stream
