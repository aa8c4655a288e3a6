"""opcast.predict: decompose archs into ops, cost them and compose distributed training and
inference time, throughput and memory, on a CPU.

The modules, by concern (keep this list true: one line per module).

The model core, following the data flow in Calculon-style explicit stages:

- :mod:`~opcast.predict.parallel`    configurations (frozen dataclasses), the cluster, validation
  that lists every reason a configuration is infeasible, rank placement;
- :mod:`~opcast.predict.graph`       arch -> per-rank kernels and collectives of a block and of the
  model-level ops, forward, backward, recomputation (Megatron TP/SP/CP/EP shapes);
- :mod:`~opcast.predict.cost`        kernel times (a package: query, roofline, learned, model):
  learned models where they cover, a flagged roofline elsewhere, held to physical bounds, cached;
- :mod:`~opcast.predict.comm`        collective times: hierarchical ring/tree alpha-beta;
- :mod:`~opcast.predict.schedule`    1F1B / interleaved pipeline time and the replayed timeline;
- :mod:`~opcast.predict.memory`      weights, gradients, optimizer states, activations, KV cache;
- :mod:`~opcast.predict.training`    ``compile_train -> run_train -> TrainResult``;
- :mod:`~opcast.predict.inference`   prefill and decode;
- :mod:`~opcast.predict.intervals`   prediction intervals from the learned predictors' held-out residuals;
- :mod:`~opcast.predict.batch`       ``predict kernels`` over a table.

Search and what-if:

- :mod:`~opcast.predict.search`      every parallel configuration of a job, pruned early, predicted and ranked;
- :mod:`~opcast.predict.whatif`      hypothetical GPUs, scaling grids, side-by-side GPUs, where the time goes.

The command line and presentation:

- :mod:`~opcast.predict.options`     the options of every prediction command, each declared once;
- :mod:`~opcast.predict.report`      JSON, rich summaries, Chrome traces, charts;
- :mod:`~opcast.predict.cli`         the ``opcast predict`` commands;
- :mod:`~opcast.predict.search_cli`  ``opcast search``;
- :mod:`~opcast.predict.whatif_cli`  ``opcast explore`` and ``opcast compare``.

Measuring this machine and checking predictions against it (``opcast validate``, ``opcast
calibrate``, which run torch, ``opcast.collect.bench`` and ``opcast.train.fit``) is its own stage,
:mod:`opcast.check`: it imports ``predict``; ``predict`` never imports it.

Nothing on the prediction path imports torch or xgboost at start-up; learned models are loaded
(lazily) through ``opcast.train.artifacts`` only when a prediction asks for them.

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
    "TrainConfig": "opcast.predict.parallel",
    "InferConfig": "opcast.predict.parallel",
    "Cluster": "opcast.predict.parallel",
    "predict_train": "opcast.predict.training",
    "compile_train": "opcast.predict.training",
    "run_train": "opcast.predict.training",
    "TrainResult": "opcast.predict.training",
    "predict_infer": "opcast.predict.inference",
    "InferResult": "opcast.predict.inference",
    "load_kernel_cost": "opcast.predict.cost",
    "KernelCostModel": "opcast.predict.cost",
    "CollectiveCostModel": "opcast.predict.comm",
}

# A literal list, so static tools can read it; keep it equal to sorted(_EXPORTS).
__all__ = [
    "Cluster",
    "CollectiveCostModel",
    "InferConfig",
    "InferResult",
    "KernelCostModel",
    "TrainConfig",
    "TrainResult",
    "compile_train",
    "load_kernel_cost",
    "predict_infer",
    "predict_train",
    "run_train",
]


def __getattr__(name: str) -> Any:  # lazy: `import opcast.predict` stays cheap
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'opcast.predict' has no attribute {name!r}")
