"""What vLLM takes from its memory budget before the KV cache: the weights as it lays them out, and the peak of its
profiling run. Read from vLLM 0.11.0 (0.10.2 the same), the versions the gpt-oss serving rows ran.

**The budget** (``vllm/v1/worker/gpu_worker.py``, ``Worker.determine_available_memory``; ``vllm/utils/__init__.py``,
``memory_profiling`` and ``MemoryProfilingResult``): the KV cache gets ``gpu_memory_utilization x total`` less
``non_kv_cache_memory = weights_memory + torch_peak_increase + non_torch_increase``, where ``weights_memory`` is what
loading the model allocated (``GPUModelRunner.load_model``, ``model_memory_usage``), ``torch_peak_increase`` the rise
of torch's peak allocation over one ``GPUModelRunner.profile_run``, and ``non_torch_increase`` the memory outside
torch's allocator that appeared since the worker's first snapshot (taken after NCCL's initialisation). CUDA graphs
are captured after the KV cache is allocated and are *not* subtracted (``Worker.compile_or_warm_up_model``:
"``memory_profiling`` does not consider CUDAGraph memory size"); nor is the CUDA context, which predates the
snapshot. ``non_torch_increase`` is measured at start-up, and vLLM states no figure for it (its docstring's 0.5 GiB
of NCCL is an illustration), so it is not counted here.

**The profiling run** (``vllm/v1/worker/gpu_model_runner.py``, ``profile_run``): one ``_dummy_run`` of
``max_num_batched_tokens`` tokens split over ``min(max_num_seqs, tokens)`` requests, without a KV cache (no
attention scores), then ``_dummy_sampler_run`` on the last token of each request. Its peak is the larger of the
forward's live activations (:func:`opcast.predict.inference.infer_memory`'s working set, with the MoE block's
intermediate caches) and the sampler's logits with the forward's output still held (:func:`sampler_peak_bytes`).

**Expert weights** (:class:`ExpertLayout`, :func:`vllm_expert_layout`): vLLM stores an MXFP4 checkpoint's experts
(gpt-oss) padded to the widths its MoE kernel needs, 4.25 bits an element on the padded shape, biases in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcast.archs import ArchSpec
from opcast.hardware import DeviceSpec

FUSED_MOE_CHUNK_TOKENS = 32_768
"""Tokens vLLM's Triton ``fused_experts`` runs at once (``vllm/envs.py``: ``VLLM_FUSED_MOE_CHUNK_SIZE`` default
32768; ``vllm/model_executor/layers/fused_moe/fused_moe.py``, ``fused_experts_impl``: ``M = min(num_tokens,
CHUNK_SIZE)``): its intermediate caches never hold more."""


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertLayout:
    """How an engine stores routed experts kept in a weight-only format: the hidden and per-rank intermediate
    widths rounded up to multiples its MoE kernel needs, values and scales at the format's bytes an element on
    the padded shape, biases in ``bias_bytes`` each; and how many tokens its MoE kernel's intermediate caches hold
    at once (None: all of a step's)."""

    hidden_multiple: int
    ffn_multiple: int
    bias_bytes: float = 2.0
    chunk_tokens: int | None = None
    source: str

    def widths(self, arch: ArchSpec, ffn: int) -> tuple[int, int]:
        """(hidden, intermediate) of an expert ``ffn`` wide on one rank, as stored."""
        return round_up(arch.hidden, self.hidden_multiple), round_up(ffn, self.ffn_multiple)

    def expert_bytes(self, arch: ArchSpec, ffn: int, element_bytes: float) -> float:
        """Bytes of one expert ``ffn`` wide on one rank: ``(up + f) h x element_bytes`` for the up (gate and up:
        ``2 f``) and down projections at the padded ``h, f``, plus their biases ``(up + h) x bias_bytes``."""
        h, f = self.widths(arch, ffn)
        up = (2 if arch.gated_mlp else 1) * f
        biases = (up + h) * self.bias_bytes if arch.linear_bias else 0.0
        return (up + f) * h * element_bytes + biases


MARLIN_MXFP4 = ExpertLayout(
    hidden_multiple=256,
    ffn_multiple=128,
    source="vllm/model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights (Marlin: intermediate "
    "per partition to a multiple of 128, hidden to 256; get_mxfp4_backend picks Marlin on NVIDIA GPUs other than SM100 "
    "when the triton_kernels package is absent, as in the vLLM 0.10.2/0.11.0 wheels and images) and "
    "utils/marlin_utils_fp4.py prepare_moe_fp4_layer_for_marlin (repacked in place, scales 1 byte, biases bf16)",
)
"""vLLM's MXFP4 MoE on NVIDIA GPUs other than SM100 (A100, H100, B300)."""

PADDED_256_MXFP4 = ExpertLayout(
    hidden_multiple=256,
    ffn_multiple=256,
    source="vllm/model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights (FlashInfer MXFP4 on "
    "SM100 and Triton on ROCm: intermediate per partition and hidden to multiples of 256)",
)
"""vLLM's MXFP4 MoE on SM100 (B200, GB200: FlashInfer, in vLLM's images) and AMD GPUs (Triton ``matmul_ogs``)."""

_SM100 = frozenset({"B200", "GB200"})
"""NVIDIA GPUs of compute capability 10.0, the only ones ``get_mxfp4_backend`` gives FlashInfer by default (B300's
10.3 and the RTX PRO 6000's 12.0 fall through to Marlin)."""


def vllm_expert_layout(arch: ArchSpec, device: DeviceSpec) -> ExpertLayout | None:
    """How vLLM stores ``arch``'s weight-only experts on ``device`` (``get_mxfp4_backend``'s choice), or None
    when its experts are in the serving precision (nothing padded)."""
    if arch.expert_weights != "mxfp4":
        return None
    if device.vendor == "nvidia" and device.name not in _SM100:
        return MARLIN_MXFP4
    return PADDED_256_MXFP4


SAMPLER_BYTES_PER_LOGIT = {"flashinfer": 2 + 4 + 4 + 4, "pytorch": 2 + 4 + 4 + 8 + 1 + 4 + 1 + 4}
"""Bytes live per (row, vocab) element at the peak of ``_dummy_sampler_run`` (top-k = vocab - 1, top-p 0.9):
the bf16 logits of ``compute_logits`` (2), their fp32 copy (``vllm/v1/sample/sampler.py``, ``Sampler.forward``:
``logits.to(torch.float32)``; temperature divides in place) (4), then
``flashinfer``: ``flashinfer.sampling.top_k_top_p_sampling_from_logits`` ("top_k_first": ``top_k_mask_logits``'s
masked copy and its ``softmax``, 4 + 4), vLLM's sampler on NVIDIA (``vllm/v1/sample/ops/topk_topp_sampler.py``,
``TopKTopPSampler.forward_cuda``, FlashInfer in vLLM's images);
``pytorch``: ``apply_top_k_top_p`` (sorted fp32 values 4 and int64 indices 8, the bool top-k mask 1, the softmax
cumulated in place 4, the bool top-p mask 1, the scattered result 4), the ``forward_native`` path elsewhere."""


def sampler_peak_bytes(arch: ArchSpec, device: DeviceSpec, *, rows: int, tokens: int, act_bytes: float) -> float:
    """The sampler's peak in vLLM's profiling run: ``rows x vocab x`` :data:`SAMPLER_BYTES_PER_LOGIT` (the whole
    vocabulary on every rank: ``LogitsProcessor`` all-gathers it) plus the forward's output that ``profile_run``
    still holds, ``tokens x hidden x act_bytes``."""
    path = "flashinfer" if device.vendor == "nvidia" else "pytorch"
    return rows * arch.vocab * SAMPLER_BYTES_PER_LOGIT[path] + tokens * arch.hidden * act_bytes
