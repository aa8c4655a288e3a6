"""opcast.predict: decompose archs into ops, cost them and compose distributed training and
inference time, throughput and memory, on a CPU.

The modules follow the data flow, Calculon-style explicit stages:

- :mod:`~opcast.predict.parallel`  configurations (frozen dataclasses), the cluster, validation
  that lists every reason a configuration is infeasible, rank placement;
- :mod:`~opcast.predict.graph`     arch -> per-rank kernels and collectives of a block and of the
  model-level ops, forward, backward, recomputation (Megatron TP/SP/CP/EP shapes);
- :mod:`~opcast.predict.cost`      kernel times: learned models where they cover, a flagged
  roofline elsewhere, cached;
- :mod:`~opcast.predict.comm`      collective times: hierarchical ring/tree alpha-beta;
- :mod:`~opcast.predict.schedule`  1F1B / interleaved pipeline time and the replayed timeline;
- :mod:`~opcast.predict.memory`    weights, gradients, optimizer states, activations, KV cache;
- :mod:`~opcast.predict.training`  ``compile_train -> run_train -> TrainResult``;
- :mod:`~opcast.predict.inference` prefill and decode;
- :mod:`~opcast.predict.report`    JSON, rich summaries, Chrome traces, charts;
- :mod:`~opcast.predict.batch`     ``predict kernels`` over a table;
- :mod:`~opcast.predict.cli`       the ``opcast predict`` commands.

Nothing here imports torch or xgboost at start-up; learned models are loaded (lazily) through
``opcast.train.artifacts`` only when a prediction asks for them.

Library use::

    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict import TrainConfig, load_kernel_cost, predict_train

    result = predict_train(load_arch("llama2-7b"), get_device("H100-SXM"),
                           TrainConfig(tp=2, pp=2, dp=2, sp=True, global_batch=64, seq=4096),
                           kernels=load_kernel_cost(None))
    result.iteration_time_s, result.mfu, result.breakdown_s, result.worst_memory.breakdown()
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "TrainConfig": "opcast.predict.parallel", "InferConfig": "opcast.predict.parallel",
    "Cluster": "opcast.predict.parallel", "predict_train": "opcast.predict.training",
    "compile_train": "opcast.predict.training", "run_train": "opcast.predict.training",
    "TrainResult": "opcast.predict.training", "predict_infer": "opcast.predict.inference",
    "InferResult": "opcast.predict.inference", "load_kernel_cost": "opcast.predict.cost",
    "KernelCostModel": "opcast.predict.cost", "CollectiveCostModel": "opcast.predict.comm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # lazy: `import opcast.predict` stays cheap
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'opcast.predict' has no attribute {name!r}")
