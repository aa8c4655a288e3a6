"""Training frameworks: which kernel implementation each op runs as, and what the framework keeps in
memory beyond the ZeRO paper's count (``--framework``, :attr:`opcast.predict.parallel.TrainConfig.framework`).

One table, read by the graph (:class:`opcast.predict.graph.Dtypes` gives every kernel its
``impl``) and by the memory model (:func:`opcast.predict.memory.model_state_bytes`):

- ``megatron`` (Megatron-LM / Megatron-Core with Transformer Engine or Apex): fused LayerNorm and
  RMSNorm (TE ``LayerNorm``/``RMSNorm``, Apex ``FusedLayerNorm``/``FusedRMSNorm``), Megatron's fused
  softmax kernels, the Python ``vocab_parallel_cross_entropy`` (unfused; ``--cross-entropy-loss-fusion``
  is off by default), rotary embeddings in one kernel each for the queries and the keys (Transformer
  Engine's ``fused_apply_rotary_pos_emb``: Megatron-LM's ``--no-rope-fusion`` is ``store_false``, so
  ``apply_rope_fusion`` is on unless turned off; NeMo's ``Llama3Config`` and its launcher's Llama 3 configs set
  ``apply_rope_fusion: true``), SwiGLU as one kernel (``bias_swiglu_impl``, ``--no-bias-swiglu-fusion`` likewise
  and NeMo's ``bias_activation_fusion: true``; :attr:`Framework.fused_swiglu`), and fp32 gradient
  accumulation: each parameter's ``main_grad`` is an fp32 buffer (``--accumulate-allreduce-grads-in-fp32``,
  which Megatron-LM turns on for bf16), so mixed-precision Adam keeps 2 + 4 + 12 = 18 bytes a parameter, not
  16: the Megatron Core distributed-optimizer guide
  (docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html)
  counts "float16 param, fp32 grads: 18" bytes (6 + 12/d with the distributed optimizer, i.e.
  ZeRO-1 here);
- ``neox`` (GPT-NeoX on DeepSpeed, its defaults in ``megatron/neox_arguments/neox_args.py``:
  ``rmsnorm_fusion``, ``layernorm_fusion``, ``scaled_upper_triang_masked_softmax_fusion`` and
  ``scaled_masked_softmax_fusion`` all False): its Python RMSNorm (``megatron/model/norms.py``,
  unfused), ``torch.nn.LayerNorm`` (``get_norm`` picks ``MixedFusedLayerNorm`` only with
  ``layernorm_fusion``: native), ``FusedScaleMaskSoftmax`` falling back to ``torch.nn.Softmax``
  (native), the Python vocab-parallel cross-entropy (unfused); 16-bit gradients (DeepSpeed's
  fp16/bf16 optimizer keeps fp32 master weights and moments only: 16 bytes);
- ``hf`` (Hugging Face Transformers with torch eager): ``LlamaRMSNorm`` as torch ops (unfused),
  ``nn.LayerNorm``, ``nn.functional.softmax`` (eager attention) and ``nn.CrossEntropyLoss``
  (``log_softmax`` + ``nll_loss``): torch's native kernels; 16 bytes; and the modeling code's own
  eager kernels (``hf_modules``): ``gelu_new`` as its eight torch ops, GPT-2's and OPT's head
  split/merge copies and attention-probability dropout (:func:`opcast.predict.graph.block_ops`);
- ``hf-liger`` (Hugging Face Transformers with Liger-Kernel: ``TrainingArguments(use_liger_kernel=True)``,
  which calls Liger's ``_apply_liger_kernel_to_instance``, or
  ``liger_kernel.transformers.apply_liger_kernel_to_llama()`` by hand): ``hf`` with the modules Liger's
  defaults swap (``apply_liger_kernel_to_llama(rope=True, cross_entropy=False,
  fused_linear_cross_entropy=True, rms_norm=True, swiglu=True)``, linkedin/Liger-Kernel
  ``src/liger_kernel/transformers/monkey_patch.py``; Mistral, Qwen2, Gemma and the other decoder patches
  likewise) run as Liger's Triton kernels (``liger``): RMSNorm, rope and the loss. The fused linear
  cross-entropy chunks the LM-head GEMM with the loss; opcast prices that GEMM as before and the loss as
  Liger's cross-entropy kernel, and SwiGLU (``LigerSwiGLUMLP``: ``LigerSiLUMulFunction``, one kernel where ``hf``
  runs the SiLU and the product apart). LayerNorm stays torch's (Liger patches it in vision towers only), softmax
  too (eager attention is not patched). Liger patches the model types it knows: for GPT-2 or OPT, which it
  leaves alone, ask for ``hf``;
- ``foundry`` (MosaicML llm-foundry's MPT on Composer + PyTorch FSDP, as its benchmark tables ran:
  ``scripts/train/benchmarking/submit_benchmarks.py`` at commit b2a43a147 runs llm-foundry v0.3.0):
  ``LPLayerNorm`` (``llmfoundry/models/layers/norm.py``: ``F.layer_norm`` on the autocast dtype, native)
  and the ``fused_crossentropy`` loss that ``MPTForCausalLM`` picks by default
  (``llmfoundry/models/mpt/modeling_mpt.py`` v0.3.0 lines 721-727: flash-attn's ``CrossEntropyLoss``, the
  ``xentropy_cuda_lib`` kernel the ``gpu`` extra installs, softmax, loss and gradient in one pass: fused);
  FSDP keeps fp32 sharded parameters and gradients (16 bytes). Its ZeRO-3 is torch FSDP (FULL_SHARD)
  under Composer's ``mixed_precision: DEFAULT`` (the CSV's "MP Mode"; composer v0.16.4, which v0.3.0 pins
  ``>=0.16.3,<0.17``: ``composer/trainer/mosaic_fsdp_utils.py`` ``get_mixed_precision``: ``param_dtype`` the
  autocast dtype, ``reduce_dtype=torch.float32``): weights gathered in bf16, gradients reduce-scattered in
  fp32 (4 bytes an element), after FSDP's flat-gradient kernels (``zero3_fsdp_kernels``). Its attention
  is Triton FlashAttention (``attn_impl: triton``, ``llmfoundry/models/layers/flash_attn_triton.py``), a
  FlashAttention-1-generation kernel: the registry's ``flash1``, priced at FlashAttention-1's measured rate
  (:mod:`opcast.predict.cost.published`).

- ``torch`` (plain PyTorch modules: ``nn.LayerNorm``, ``nn.RMSNorm``, ``F.cross_entropy``,
  ``F.scaled_dot_product_attention``, as ``opcast validate``'s model, :mod:`opcast.check.torch_model`, runs
  them): torch's native single-launch kernels (``nn.RMSNorm`` is ``torch._fused_rms_norm`` on CUDA since torch
  2.8) and SDPA's flash backend (``flash2``); 16 bytes a parameter.

Not given (None): Megatron's norm, softmax and loss kernels with the ZeRO paper's 16 bytes a parameter,
opcast's pricing before frameworks were named (kept: the README's main job and the Megatron papers' runs it is
held against use those kernels; so do inference and serving, whose engines name their own kernels:
:data:`opcast.predict.inference.ENGINE_KERNELS`), with rope and a gated activation as torch runs them (the
registry's unfused rope, the SiLU and the gate product apart), as in ``neox``, ``hf``, ``foundry`` and ``torch``.
Implementations are :data:`opcast.ops.KERNEL_IMPLS`: ``fused`` one-pass CUDA kernels (Apex, Transformer Engine,
Megatron, flash-attn's cross-entropy), ``liger`` Liger-Kernel's Triton kernels, ``native`` torch's
single-launch kernels, ``unfused`` Python compositions of torch ops; each priced from measurements of
that implementation, where none exist as the streaming kernel of its own traffic
(:func:`opcast.predict.cost.model.decompose`);
and for attention, where a framework names one (foundry), a registry ``impl`` of attention that
replaces the default ``flash`` but not another ``--attention`` choice (:class:`opcast.predict.graph.Dtypes`):
``neox``, ``hf`` and ``hf-liger`` run FlashAttention-2's kernels (GPT-NeoX's ``flash`` attention is flash-attn
2's ``flash_attn_func``; Hugging Face's ``sdpa`` and ``flash_attention_2`` are torch SDPA's flash backend and
flash-attn 2), ``flash2``, which on Hopper and Blackwell runs at about half the speed of the FlashAttention-3-class
kernels the learned ``flash`` models measured there (Megatron's Transformer Engine runs cuDNN's), and elsewhere is
what they measured (:func:`opcast.predict.graph.precision_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from opcast.errors import OpcastError

FrameworkName = Literal["megatron", "neox", "hf", "hf-liger", "foundry", "torch"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Framework:
    """What one framework runs and keeps."""

    name: str
    impls: tuple[tuple[str, str], ...]
    """(op kind, registry ``impl``) of the kinds whose implementation the framework fixes."""
    fp32_grads: bool
    """Gradients accumulated in an fp32 ``main_grad`` buffer (4 bytes a parameter instead of 2) when
    training in 16-bit or fp8."""
    zero3_reduce_bytes: int | None = None
    """Bytes per element of ZeRO-3's gradient reduce-scatter when the gradients are 16-bit (None: the
    gradient's own, 2): foundry's 4 is FSDP ``MixedPrecision(reduce_dtype=torch.float32)``."""
    zero3_fsdp_kernels: bool = False
    """ZeRO-3 is PyTorch FSDP's ``FlatParameter`` runtime: each unit's backward also runs the flat-gradient
    kernels of :func:`opcast.predict.training.fsdp_gradient_kernels` (flatten, upcast, pre-divide)."""
    hf_modules: bool = False
    """The block is Hugging Face transformers' modeling code run op by op in torch eager: its
    activation module runs as the kernels of its Python expression and eager attention adds the
    modeling code's own kernels around the core (:func:`opcast.predict.graph.hf_activation_ops`,
    :func:`opcast.predict.graph.hf_attention_ops`)."""
    fused_swiglu: bool = False
    """A SiLU-gated MLP's activation and gate product run as one SwiGLU kernel, not two
    (:func:`opcast.archs.gated_activation_ops`)."""


_MEGATRON_KERNELS = (("layernorm", "fused"), ("rmsnorm", "fused"), ("softmax", "fused"), ("cross_entropy", "unfused"))

FRAMEWORKS: dict[str | None, Framework] = {
    None: Framework(name="default", impls=_MEGATRON_KERNELS, fp32_grads=False),
    "megatron": Framework(
        name="megatron", impls=(*_MEGATRON_KERNELS, ("rope", "fused")), fp32_grads=True, fused_swiglu=True
    ),
    "neox": Framework(
        name="neox",
        impls=(
            ("layernorm", "native"),
            ("rmsnorm", "unfused"),
            ("softmax", "native"),
            ("cross_entropy", "unfused"),
            ("attention", "flash2"),
        ),
        fp32_grads=False,
    ),
    "hf": Framework(
        name="hf",
        impls=(
            ("layernorm", "native"),
            ("rmsnorm", "unfused"),
            ("softmax", "native"),
            ("cross_entropy", "native"),
            ("attention", "flash2"),
        ),
        fp32_grads=False,
        hf_modules=True,
    ),
    "hf-liger": Framework(
        name="hf-liger",
        impls=(
            ("layernorm", "native"),
            ("rmsnorm", "liger"),
            ("softmax", "native"),
            ("cross_entropy", "liger"),
            ("rope", "liger"),
            ("attention", "flash2"),
        ),
        fp32_grads=False,
        hf_modules=True,
        fused_swiglu=True,
    ),
    "foundry": Framework(
        name="foundry",
        impls=(
            ("layernorm", "native"),
            ("rmsnorm", "unfused"),
            ("softmax", "native"),
            ("cross_entropy", "fused"),
            ("attention", "flash1"),
        ),
        fp32_grads=False,
        zero3_reduce_bytes=4,
        zero3_fsdp_kernels=True,
    ),
    "torch": Framework(
        name="torch",
        impls=(
            ("layernorm", "native"),
            ("rmsnorm", "native"),
            ("softmax", "native"),
            ("cross_entropy", "native"),
            ("attention", "flash2"),
        ),
        fp32_grads=False,
    ),
}
"""Every framework by its ``--framework`` name (None: not given)."""


def fp32_gradients(framework: str | None, grad_reduce_in_fp32: bool | None = None) -> bool:
    """Whether a 16-bit run keeps its gradients in fp32 and reduces them in fp32 over the data-parallel ranks:
    ``grad_reduce_in_fp32`` where given, else the framework's :attr:`Framework.fp32_grads`. One switch for both:
    Megatron-Core's ``DistributedDataParallelConfig.grad_reduce_in_fp32`` makes the gradient buffer
    (``main_grad``) fp32, and the reduce-scatter / all-reduce runs on that buffer
    (``megatron/core/distributed/param_and_grad_buffer.py``: ``grad_dtype = torch.float if grad_reduce_in_fp32
    else param_dtype``); Megatron-LM turns it on for bf16 (``arguments.py``: ``accumulate_allreduce_grads_in_fp32``),
    NeMo's ``bf16_mixed()`` precision plugin too, and performance recipes turn it off where they choose."""
    return framework_of(framework).fp32_grads if grad_reduce_in_fp32 is None else grad_reduce_in_fp32


def framework_of(name: str | None) -> Framework:
    """The :class:`Framework` called ``name`` (None: the default); an unknown name is refused."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise OpcastError(f"framework={name!r} is not one of {', '.join(get_args(FrameworkName))}") from None
