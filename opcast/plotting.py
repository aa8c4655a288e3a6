"""matplotlib for the ``--plot`` options: an optional extra (``pip install 'opcast[plot]'``),
imported only when a plot is asked for, with one-line errors when it is missing or the file
cannot be written. Shared by train, predict and the what-if commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opcast.errors import OpcastError


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or the one-line error of ``--plot`` without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OpcastError(
            "--plot needs matplotlib, an optional extra: pip install 'opcast[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (folders created) and close it; a one-line error if it cannot be written."""
    plt = pyplot()
    path = Path(path)
    if path.is_dir():  # matplotlib would write DIR.png beside it, not what was asked
        plt.close(fig)
        raise OpcastError(f"cannot write the plot {path}: it is a folder; give a file name such as {path / 'plot.png'}")
    kinds = fig.canvas.get_supported_filetypes()
    if path.suffix and path.suffix[1:].lower() not in kinds:  # no suffix: matplotlib's default, png
        plt.close(fig)
        raise OpcastError(
            f"cannot write the plot {path}: matplotlib writes {', '.join(sorted(kinds))}, not {path.suffix}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    except OSError as err:
        raise OpcastError(f"cannot write the plot {path}: {err.strerror}; choose another --plot path") from None
    finally:
        plt.close(fig)
    return path
