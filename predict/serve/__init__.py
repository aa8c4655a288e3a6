"""``opcast predict serve``: a discrete-event simulation of an LLM serving engine.

Modules, in the order the data flows:

- :mod:`~opcast.predict.serve.requests`   the request stream (Poisson, fixed / uniform / ShareGPT-like
  lengths, or a trace file);
- :mod:`~opcast.predict.serve.engine`     the engine's limits and per-step overhead (vLLM, SGLang,
  TensorRT-LLM defaults);
- :mod:`~opcast.predict.serve.kv_cache`   KV-cache capacity from the memory model, and the block pool;
- :mod:`~opcast.predict.serve.step_cost`  one step's time from the inference cost path, tabulated;
- :mod:`~opcast.predict.serve.simulate`   continuous batching on data-parallel replicas;
- :mod:`~opcast.predict.serve.metrics`    TTFT, TPOT, end-to-end percentiles, throughput, goodput, trace;
- :mod:`~opcast.predict.serve.deployment` all of it for one deployment (:func:`predict_serve`);
- :mod:`~opcast.predict.serve.disagg`     prefill and decode pools with the KV sent between them
  (``--disaggregate P:D``, :func:`predict_serve_disagg`);
- :mod:`~opcast.predict.serve.search`     the best deployment under SLOs (``opcast search serve``);
- :mod:`~opcast.predict.serve.report`     the CLI's table and JSON.
"""
