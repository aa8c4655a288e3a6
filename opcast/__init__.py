"""opcast: forecast GPU kernel latency and distributed LLM training/inference time on a CPU.

Core vocabulary shared by the three stages (``opcast.collect``, ``opcast.train``,
``opcast.predict``): the op registry (:mod:`opcast.ops`), the dataset schema
(:mod:`opcast.schema`), the hardware catalog (:mod:`opcast.hardware`) and arch presets
(:mod:`opcast.archs`).
"""

__version__ = "0.1.0"
