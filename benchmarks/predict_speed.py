"""How fast is `opcast predict`? Targets (issue 5): one `predict train` under 10 ms once the models
are loaded; loading the default models under 1 s.

Usage:  python benchmarks/predict_speed.py [--models DIR] [--repeats N]
        python benchmarks/predict_speed.py --cli [--runs 9] [--baseline DIR] [--no-bytecode-cache]
                                           [--calculon DIR [--calculon-python PY]]

``--cli`` (issue 16's target: at most Calculon's 0.46 s for the same 175B configuration, aim
0.4 s) times whole ``opcast predict train --json`` processes, interleaved with a process that only
imports numpy (the floor every numpy program pays, which says how loaded the machine is) and,
with ``--baseline DIR``, the same command on another opcast package tree, so all of them see
the same machine load. ``--calculon DIR`` (a checkout of github.com/calculon-ai/calculon, whose
only dependencies are numpy and psutil: ``--calculon-python`` names an interpreter that has them)
also times ``calculon llm`` on the same job in the same interleaved runs: the 175B job on its own
``gpt3-175B.json`` and ``a100_80g.json``, the README job as a Llama-2-7B-shaped application. The
children compile opcast's modules once into a private bytecode cache
(``PYTHONPYCACHEPREFIX``, a temporary folder: nothing is written into the tree), as an installed
opcast has them; ``--no-bytecode-cache`` times them recompiled every run instead.

Prints, per configuration: the first prediction with a cold kernel cache (every unique kernel
priced, learned ones in one batched call per model), then the median of N warm predictions with
the full per-op report (what the CLI does), and without it (what a configuration search does).
Also the model-set load time and the import time of ``opcast.predict`` (no torch or xgboost at
start-up).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = [
    # (label, arch, gpu, nodes, gpus per node, TrainConfig kwargs)
    (
        "llama2-7b 8xH100 tp2 pp2 dp2 sp",
        "llama2-7b",
        "H100-SXM",
        1,
        8,
        dict(tp=2, pp=2, dp=2, sp=True, micro_batch=1, global_batch=64, seq=4096, recompute="selective", zero=1),
    ),
    (
        "megatron-175b 1024xA100 tp8 pp8",
        "megatron-175b",
        "A100-SXM4-80GB",
        128,
        8,
        dict(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, seq=2048, recompute="full"),
    ),
    (
        "llama3-70b 512xH100 tp8 pp4 cp2 v2",
        "llama3-70b",
        "H100-SXM",
        64,
        8,
        dict(
            tp=8,
            pp=4,
            dp=8,
            cp=2,
            sp=True,
            micro_batch=1,
            global_batch=512,
            seq=8192,
            recompute="full",
            zero=1,
            schedule="interleaved",
            virtual_stages=2,
            overlap_grad_reduce=True,
        ),
    ),
    (
        "gpt3-2.7b 1xV100 fp32 eager",
        "gpt3-2.7b",
        "V100-PCIe-32GB",
        1,
        1,
        dict(micro_batch=2, global_batch=8, seq=2048, precision="fp32", attention="eager"),
    ),
    (
        "mixtral-8x7b 64xH100 tp2 ep8",
        "mixtral-8x7b",
        "H100-SXM",
        8,
        8,
        dict(tp=2, pp=1, dp=32, ep=8, sp=True, micro_batch=1, global_batch=256, seq=4096, recompute="full", zero=1),
    ),
]


_FRESH = """
import sys, time
t0 = time.perf_counter()
from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train
t1 = time.perf_counter()
kernels = load_kernel_cost(sys.argv[1] or None)
kernels.warm()
t2 = time.perf_counter()
r = predict_train(load_arch("llama2-7b"), get_device("A100-SXM4-80GB"),
                  TrainConfig(tp=2, micro_batch=1, global_batch=64, seq=4096),
                  nodes=1, gpus_per_node=8, kernels=kernels)
t3 = time.perf_counter()
print(f"imports {t1 - t0:.2f} s + load {t2 - t1:.2f} s + first predict train {t3 - t2:.2f} s = {t3 - t0:.2f} s; "
      f"torch imported: {'torch' in sys.modules}, xgboost imported: {'xgboost' in sys.modules}")
"""


CLI_JOBS = [
    # (label, arguments after `opcast`): the README's main job and the 175B job Calculon is compared on
    (
        "README main job",
        "predict train --arch llama2-7b --gpu A100-SXM4-80GB --nodes 1 --gpus-per-node 8 --tp 2 --pp 1 "
        "--micro-batch 1 --global-batch 64 --seq 4096 --json",
    ),
    (
        "megatron-175b 1024xA100",
        "predict train --arch megatron-175b --gpu A100-SXM4-80GB --nodes 128 --gpus-per-node 8 "
        "--tp 8 --pp 8 --micro-batch 1 --global-batch 1536 --seq 2048 --recompute full --json",
    ),
]
CALCULON_JOBS = {
    # label -> (application, execution) for `calculon llm APP EXE systems/a100_80g.json -`;
    # the application is a file of the checkout's models/ or a dict written to a temporary file
    "README main job": (
        {"hidden": 4096, "feedforward": 11008, "seq_size": 4096, "attn_heads": 32, "attn_size": 128, "num_blocks": 32},
        {"num_procs": 8, "tensor_par": 2, "pipeline_par": 1, "data_par": 4, "tensor_par_net": 0,
         "pipeline_par_net": 0, "data_par_net": 0, "batch_size": 64, "microbatch_size": 1,
         "activation_recompute": "attn_only"},  # Calculon needs 87.7 GiB without it (opcast: selective fits too)
    ),
    "megatron-175b 1024xA100": (
        "gpt3-175B.json",
        {"num_procs": 1024, "tensor_par": 8, "pipeline_par": 8, "data_par": 16, "tensor_par_net": 0,
         "pipeline_par_net": 1, "data_par_net": 1, "batch_size": 1536, "microbatch_size": 1,
         "activation_recompute": "full"},
    ),
}  # fmt: skip
CALCULON_COMMON = {
    "datatype": "float16", "fused_activation": True, "attention_type": "multihead", "pipeline_interleaving": 1,
    "optimizer_sharding": False, "tensor_par_comm_type": "ar", "tensor_par_overlap": "none",
    "seq_par_ag_redo": False, "data_par_overlap": False, "weight_offload": False,
    "activations_offload": False, "optimizer_offload": False, "training": True,
}  # fmt: skip
"""Calculon's execution fields that both jobs share (Megatron defaults: no sharding, no overlap)."""


def _calculon_cmd(root: str, python: str, label: str, tmp: str) -> list[str] | None:
    """The ``calculon llm`` command for job ``label`` (None: no Calculon equivalent)."""
    import json

    if label not in CALCULON_JOBS:
        return None
    app, exe = CALCULON_JOBS[label]
    stem = label.split()[0]
    if isinstance(app, dict):
        app_path = f"{tmp}/{stem}-app.json"
        Path(app_path).write_text(json.dumps(app))
    else:
        app_path = f"{root}/models/{app}"
    exe_path = f"{tmp}/{stem}-exe.json"
    Path(exe_path).write_text(json.dumps({**exe, **CALCULON_COMMON}))
    return [python, f"{root}/bin/calculon", "llm", app_path, exe_path, f"{root}/systems/a100_80g.json", "-"]


HEAVY = ("torch", "xgboost", "pandas", "sklearn", "scipy", "matplotlib", "pyarrow")
"""Libraries the predict path should not import (xgboost and torch load only with a model that needs them)."""


def _env(pythonpath: str | None, cache: str | None) -> dict[str, str]:
    """The children's environment: ``pythonpath`` first on the path (a baseline tree), and
    bytecode written to ``cache`` (None: never written, so every run recompiles)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if cache:
        env["PYTHONPYCACHEPREFIX"] = cache
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _one_run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole process; CPU is user + system of the child, less
    sensitive to a loaded machine than the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, cwd=Path.home())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed ({done.returncode}): {done.stderr.decode()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _heavy_imports(args: list[str], env: dict[str, str]) -> tuple[list[str], list[tuple[float, str]]]:
    """The heavy libraries one run imports, and the slowest top-level imports (ms, module)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "opcast", *args],
        capture_output=True,
        text=True,
        cwd=Path.home(),
        env=env,
    )
    heavy, top = [], []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        if name.strip() in HEAVY:
            heavy.append(name.strip())
        if not name.startswith("  ") and name.strip():  # a top-level import: its cumulative time
            top.append((int(parts[1]) / 1e3, name.strip()))
    return heavy, sorted(top, reverse=True)[:6]


NUMPY_ONLY = [sys.executable, "-c", "import numpy"]
"""The reference process: an interpreter that imports numpy and exits."""


def cli_main(
    runs: int,
    baseline: str | None,
    bytecode_cache: bool = True,
    calculon: str | None = None,
    calculon_python: str = sys.executable,
) -> int:
    """Whole-process timings, the medians of ``runs`` runs of each job, interleaved with a
    numpy-only process and (``baseline``: a folder holding another ``opcast`` package tree, put
    first on PYTHONPATH) the same job on the baseline, so all of them see the same machine load."""
    with tempfile.TemporaryDirectory(prefix="opcast-pycache-") as tmp:
        caches = {"this tree": f"{tmp}/this", "baseline": f"{tmp}/baseline"} if bytecode_cache else {}
        envs = {name: _env(path, caches.get(name)) for name, path in (("this tree", None), ("baseline", baseline))}
        print(
            f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}; "
            + ("bytecode cached (as installed)" if bytecode_cache else "bytecode recompiled every run")
        )
        for label, line in CLI_JOBS:
            args = line.split()
            cmd = [sys.executable, "-m", "opcast", *args]
            variants = {"this tree": envs["this tree"]} | ({"baseline": envs["baseline"]} if baseline else {})
            for env in variants.values():  # warm-up: fills the bytecode cache, and the OS's file cache
                _one_run(cmd, env)
            calc_cmd = _calculon_cmd(calculon, calculon_python, label, tmp) if calculon else None
            calc_env = {**_env(calculon, f"{tmp}/calculon" if bytecode_cache else None)}
            if calc_cmd:
                _one_run(calc_cmd, calc_env)
            heavy, top = _heavy_imports(args, envs["this tree"])
            print(f"{label}: opcast {line}")
            print(
                f"  heavy libraries imported: {', '.join(heavy) or 'none'}; slowest imports: "
                + ", ".join(f"{name} {ms:.0f} ms" for ms, name in top)
            )
            samples: dict[str, list[tuple[float, float]]] = {"import numpy": [], **{k: [] for k in variants}}
            if calc_cmd:
                samples["calculon"] = []
            for _ in range(runs):
                samples["import numpy"].append(_one_run(NUMPY_ONLY, envs["this tree"]))
                for name, env in variants.items():
                    samples[name].append(_one_run(cmd, env))
                if calc_cmd:
                    samples["calculon"].append(_one_run(calc_cmd, calc_env))
            for name, got in samples.items():
                walls, cpus = [w for w, _ in got], [c for _, c in got]
                print(
                    f"  {name:12s} wall median {statistics.median(walls):.3f} s (min {min(walls):.3f}), "
                    f"CPU median {statistics.median(cpus):.3f} s over {runs} runs"
                )
            if baseline:
                ratio = [
                    statistics.median([s[i] for s in samples["this tree"]])
                    / statistics.median([s[i] for s in samples["baseline"]])
                    for i in (0, 1)
                ]
                print(f"  this tree / baseline: wall {ratio[0]:.2f}, CPU {ratio[1]:.2f}")
            if calc_cmd:
                ratio = [
                    statistics.median([s[i] for s in samples["this tree"]])
                    / statistics.median([s[i] for s in samples["calculon"]])
                    for i in (0, 1)
                ]
                print(f"  this tree / calculon: wall {ratio[0]:.2f}, CPU {ratio[1]:.2f}")
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None, help="model set (default: the embedded one, if any)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--cli", action="store_true", help="time whole `opcast predict train --json` processes instead")
    ap.add_argument("--runs", type=int, default=9, help="--cli: processes per job (the median is reported)")
    ap.add_argument(
        "--baseline",
        default=None,
        help="--cli: a folder with another opcast package tree (PYTHONPATH) to time, paired, against this one",
    )
    ap.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="--cli: recompile opcast's modules in every run instead of caching their bytecode",
    )
    ap.add_argument("--calculon", default=None, help="--cli: a Calculon checkout to time on the same jobs, paired")
    ap.add_argument(
        "--calculon-python", default=sys.executable, help="--cli: the interpreter for Calculon (needs numpy, psutil)"
    )
    args = ap.parse_args()
    if args.cli:
        return cli_main(
            args.runs,
            args.baseline,
            bytecode_cache=not args.no_bytecode_cache,
            calculon=args.calculon,
            calculon_python=args.calculon_python,
        )

    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import opcast.predict.cli"], capture_output=True, text=True
    )
    heavy = [
        ln.split("|")[-1].strip() for ln in out.stderr.splitlines() if ln.split("|")[-1].strip() in ("torch", "xgboost")
    ]
    print(
        f"import opcast.predict.cli (fresh interpreter): {time.perf_counter() - t0:.2f} s; torch/xgboost imported: "
        f"{heavy or 'no'}"
    )

    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.cost import load_kernel_cost
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import compile_train, run_train

    t0 = time.perf_counter()
    kernels = load_kernel_cost(args.models)
    warmed = kernels.warm()  # ModelSet loads predictors lazily; count that as loading
    load_s = time.perf_counter() - t0
    print(
        f"load kernel models: {load_s:.3f} s, {warmed} predictors "
        f"({kernels.models_label or 'none: ' + '; '.join(kernels.notes)}) -- target < 1 s"
    )
    fresh = subprocess.run([sys.executable, "-c", _FRESH, str(args.models or "")], capture_output=True, text=True)
    print(f"fresh interpreter: {fresh.stdout.strip() or fresh.stderr.strip().splitlines()[-1:]}")
    print()
    print(f"{'configuration':40s} {'cold':>11s} {'warm+report':>11s} {'warm bare':>11s}  sources")
    worst_cold = worst_warm = 0.0
    for label, arch_name, gpu, nodes, gpn, kw in CONFIGS:
        arch, device = load_arch(arch_name), get_device(gpu)
        cfg = TrainConfig(**kw)
        kernels = load_kernel_cost(args.models)  # a fresh, empty cache per configuration
        kernels.warm()
        t0 = time.perf_counter()
        plan = compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpn)
        result = run_train(plan, kernels)
        cold = time.perf_counter() - t0
        assert result.iteration_time_s is not None, result.reasons
        warm, bare = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run_train(compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpn), kernels)
            warm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_train(compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpn), kernels, details=False)
            bare.append(time.perf_counter() - t0)
        w, b = statistics.median(warm), statistics.median(bare)
        worst_cold, worst_warm = max(worst_cold, cold), max(worst_warm, w)
        print(f"{label:40s} {_ms(cold)} {_ms(w)} {_ms(b)}  {result.cost_sources['unique_kernels_by_source']}")
    print()
    for label, t in (
        ("cold (kernels not seen before, learned ones in one batch per model)", worst_cold),
        ("warm (kernels cached: repeated configurations, searches)", worst_warm),
    ):
        print(f"slowest prediction, {label}: {t * 1e3:.2f} ms -- target < 10 ms: {'met' if t < 0.010 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
