"""Shared fixtures: a per-session cache for the measured local CPU spec, and the published data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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


@pytest.fixture
def published() -> Path:
    """../shared/published, or a skip saying why."""
    if not PUBLISHED.is_dir():
        pytest.skip(f"published measurements not found at {PUBLISHED} (clone the shared data beside the repo)")
    return PUBLISHED
