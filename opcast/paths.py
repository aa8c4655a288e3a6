"""Where opcast's packaged data lives (hardware catalog, arch presets, datasets, models).

The top-level ``data/`` folder is installed as the package ``opcast.data`` (see pyproject's
``package-dir``), so the same lookup works from a checkout, an editable and a regular install.
"""

from __future__ import annotations

import errno
import os
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


def link_problem(path: str | Path) -> str | None:
    """Why ``path``, which does not exist, is still listed by ``ls``: a loop of symbolic links, or a symbolic
    link to a target that is gone; None for a path that is simply absent. Messages said 'does not exist' or
    'no such file' of a name the user could see."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        try:
            if os.path.islink(path):
                return f"is a symbolic link to {os.readlink(path)!r}, which does not exist"
        except OSError:
            pass
    return None
