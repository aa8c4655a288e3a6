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


def plot_file_problem(path: str | Path) -> str | None:
    """Why ``--plot PATH`` cannot be written, found before any work, or None: a folder (matplotlib
    would write FOLDER.png beside it), a path below a file, matplotlib missing, or a suffix it does
    not write (no suffix: its default, png)."""
    from opcast.atomic import output_file_problem

    path = Path(path)
    problem = output_file_problem("--plot", path, example="plot.png")
    if problem:
        return problem
    try:
        pyplot()
    except OpcastError as err:
        return str(err)
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if path.suffix and path.suffix[1:].lower() not in kinds:
        return f"--plot {path}: matplotlib writes {', '.join('.' + k for k in sorted(kinds))}, not {path.suffix}"
    return None


def check_plot_path(path: str | Path) -> Path:
    """``path`` when :func:`plot_file_problem` finds nothing, else its one-line OpcastError."""
    problem = plot_file_problem(path)
    if problem:
        raise OpcastError(problem)
    return Path(path)


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (folders created) and close it; a one-line error if it cannot be
    written (the commands check the path first, :func:`plot_file_problem`)."""
    from opcast.atomic import write_failure

    plt = pyplot()
    path = Path(path)
    try:
        check_plot_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    except OSError as err:
        raise OpcastError(write_failure("--plot", path, err, "the plot")) from None
    finally:
        plt.close(fig)
    return path
