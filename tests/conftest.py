"""Shared fixtures: a per-session cache for the measured local CPU spec, and the published data;
``tests/`` on ``sys.path`` so the tests import their helpers as ``helpers.<name>``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# --import-mode=importlib puts no test folder on sys.path; the helpers (tests/helpers/) need one.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
PUBLISHED = REPO.parent / "shared" / "published"


@pytest.fixture(scope="session", autouse=True)
def _opcast_cache(tmp_path_factory):
    """Measure the local CPU once per session, in a throw-away cache (never the user's)."""
    old = os.environ.get("OPCAST_CACHE_DIR")
    os.environ["OPCAST_CACHE_DIR"] = str(tmp_path_factory.mktemp("opcast-cache"))
    yield
    if old is None:
        os.environ.pop("OPCAST_CACHE_DIR", None)
    else:
        os.environ["OPCAST_CACHE_DIR"] = old


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_delivered():
    """Ctrl-C reaches the tests and the runs they start, however pytest was launched. A shell starts a
    background job (``pytest &`` in a script) with SIGINT ignored, and a process inherits that: the
    signal tests' Ctrl-C then never arrives (one of them warms up for an hour). With Python's own
    handler installed here, the runs they start get the default disposition back at exec."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="session", autouse=True)
def _bytecode_for_the_runs():
    """The console-script tests start several hundred interpreters. Where this one writes no bytecode
    (``PYTHONDONTWRITEBYTECODE``, as on the shared machines this project is developed on) and the checkout is installed
    editable, each of them compiled opcast's sources anew: about 0.25 s of CPU a start, a fifth of the
    hostile-input table's CPU time (113 -> 88 s measured with the cache in place). Compiling them once here,
    beside the sources as a default interpreter would (``__pycache__`` is ignored by git), lets every run
    read them; Python checks each file's size and mtime, so an edited module is still compiled afresh."""
    if sys.dont_write_bytecode:
        import compileall
        import importlib.util

        for name in ("opcast", "opcast.collect", "opcast.train", "opcast.predict", "opcast.check"):
            spec = importlib.util.find_spec(name)
            for folder in (spec.submodule_search_locations or ()) if spec else ():
                compileall.compile_dir(folder, quiet=2)  # an unwritable install is left as it is
    yield


@pytest.fixture(scope="session")
def published() -> Path:
    """../shared/published, or a skip saying why."""
    if not PUBLISHED.is_dir():
        pytest.skip(f"published measurements not found at {PUBLISHED} (clone the shared data beside the repo)")
    return PUBLISHED


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, with the reason, where torch sees no CUDA device."""
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
