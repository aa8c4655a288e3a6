"""opcast.check: measure this machine and check predictions against it.

    opcast validate --arch ARCH --batch N --seq N [--device cpu|cuda] [--models DIR] [--json] ...
    opcast calibrate --out DIR [--budget-s SECONDS] [--arch ARCH ...] [--json] ...

These import torch (and ``opcast.collect.bench``, ``opcast.train.fit``) when they run, which is
why they live here and not in ``predict``: ``check`` may import ``predict``, ``collect`` and
``train``; ``predict`` never imports ``check``.

- :mod:`.validate`        time real training steps here and compare them with ``opcast predict train``;
- :mod:`.calibrate`       fit kernel models for this machine (bench, fit, validate before and after);
- :mod:`.calibrate_noise` whether this machine is quiet enough to calibrate on (rules over timings);
- :mod:`.torch_model`     a compact PyTorch GPT / Llama, kernel for kernel the priced op graph;
- :mod:`.isolated`        run a measurement in a fresh process;
- :mod:`.validate_cli`    the ``opcast validate`` and ``opcast calibrate`` commands.
"""
