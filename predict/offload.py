"""Activation offloading to host memory (``--offload-activations N``): Megatron-Core's ``cpu_offloading``
with ``cpu_offloading_num_layers = N`` (activations only), which Transformer Engine implements.

What it does (Transformer Engine v2.5 ``transformer_engine/pytorch/cpu_offload.py``,
``AsyncDoubleBufferGroupOffloadHandler``, the handler ``get_cpu_offload_context`` returns; Megatron-Core
core_v0.13.0 ``megatron/core/transformer/transformer_block.py`` wraps every layer's forward in its context
and commits a group after each layer):

- The tensors the first N layers save for their backward go to pinned host memory: those Transformer
  Engine's modules mark (``mark_activation_offload``: the linears' and norms' inputs, the attention's
  Q, K, V, output and softmax statistics) and the SwiGLU input Megatron marks
  (``megatron/core/fusions/fused_bias_swiglu.py``, ``activation_offloading = True``), i.e. the whole
  saved activation of a layer (:func:`opcast.predict.memory.layer_activation_bytes`).
- The copies run on their own CUDA streams, spread over the whole forward: layer group k is copied
  device-to-host while the layers of its window compute, and the compute stream waits for the copy at
  the window's end (``layer_window_map``: the L layers cut into N windows, the first ``L mod N`` of
  ``floor(L/N) + 1`` layers, the rest of ``floor(L/N)``; group 0 starts after layer 0, so it hides behind
  its window less that layer). The backward mirrors it: group k is reloaded host-to-device behind the
  backward of the layers of its window, and the compute waits at the window's end
  (``on_group_commit_backward``).
- GPU memory: a group's tensors are freed at its window's end, so at the end of the forward, and again
  at the start of the backward when the last group is reloaded, ``L - N + 1`` layers' activations are
  on the GPU (:func:`resident_layers`; reloads go into fresh allocations,
  ``cpu_offloading_double_buffering`` being off by default).

The cost model: each copy moves one layer's activations of one micro-batch over the GPU's host link
(:attr:`opcast.hardware.DeviceSpec.host_link_bw_bytes_per_s`, one direction: NVLink-C2C on Grace
superchips, PCIe elsewhere) at that bandwidth, and what exceeds the compute of its window is exposed
(:func:`exposed_s`). Not modelled: the copies' contention with the kernels for HBM bandwidth, and the
host memory they fill (``N`` layers per micro-batch in flight, reported in
:attr:`opcast.predict.memory.Memory.host_activations_bytes`).
"""

from __future__ import annotations


def windows(layers: int, offloaded: int) -> tuple[int, ...]:
    """The layers of compute each offloaded group's copy hides behind, in order: Transformer Engine's
    ``layer_window_map`` cuts ``layers`` into ``offloaded`` windows (the first ``layers mod offloaded`` one
    layer longer); group 0 is copied from the end of layer 0, so its window counts one layer less."""
    if offloaded <= 0:
        return ()
    q, r = divmod(layers, offloaded)
    sizes = [q + 1 if i < r else q for i in range(offloaded)]
    sizes[0] -= 1
    return tuple(sizes)


def resident_layers(layers: int, offloaded: int) -> int:
    """Layers' activations on the GPU at the peak (end of forward / start of backward) with ``offloaded`` of
    ``layers`` offloaded: the others, plus the one group in flight."""
    return layers if offloaded <= 0 else layers - offloaded + 1


def exposed_s(
    *,
    layer_bytes: float,
    host_bw_bytes_per_s: float,
    forward_layer_s: float,
    backward_layer_s: float,
    layers: int,
    offloaded: int,
) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch that the compute waits for the copies: per offloaded
    group, ``max(0, copy - its window's compute)``, the copy being ``layer_bytes / host_bw_bytes_per_s`` each way."""
    if offloaded <= 0:
        return 0.0, 0.0
    copy = layer_bytes / host_bw_bytes_per_s
    hide = windows(layers, offloaded)
    forward = sum(max(0.0, copy - w * forward_layer_s) for w in hide)
    backward = sum(max(0.0, copy - w * backward_layer_s) for w in hide)
    return forward, backward
