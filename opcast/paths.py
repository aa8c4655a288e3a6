"""Where opcast's packaged data lives (hardware catalog, arch presets, datasets, models).

The top-level ``data/`` folder is installed as the package ``opcast.data`` (see pyproject's
``package-dir``), so the same lookup works from a checkout, an editable and a regular install.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def data_dir() -> Path:
    """The folder holding ``hardware/``, ``archs/`` and ``datasets/``."""
    try:
        root = resources.files("opcast.data")
        path = Path(str(root))
        if path.is_dir():
            return path
    except ModuleNotFoundError:  # running from a checkout without an install
        pass
    return Path(__file__).resolve().parent.parent / "data"


def data_path(*parts: str) -> Path:
    """A path below :func:`data_dir`, e.g. ``data_path("hardware", "H100-SXM.json")``."""
    return data_dir().joinpath(*parts)
