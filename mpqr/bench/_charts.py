"""PNG charts of the benchmarks, drawn by matplotlib (optional: the ``plot`` extra).

Every ``python -m mpqr bench TOPIC --png PATH`` draws through :func:`grouped_bars`;
without matplotlib it prints why and writes no chart (the JSON is still written).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["grouped_bars", "pyplot"]


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None (with a message)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'mpqr[plot]'): no chart written")
        return None
    return plt


def grouped_bars(path: str, groups: Sequence[str], series: dict[str, Sequence[float | None]],
                 *, ylabel: str, title: str, log: bool = True,
                 reference: float | None = None) -> bool:
    """One bar per series in each group, saved as a PNG at ``path``.

    Parameters
    ----------
    path : str
        Where the PNG goes.
    groups : sequence of str
        The x-axis labels (shapes, methods).
    series : dict of str to sequence of float or None
        One value per group for each legend entry; None (not measured, or failed) leaves
        the bar out.
    ylabel, title : str
        Axis label and chart title.
    log : bool, optional
        Logarithmic y axis (default True).
    reference : float, optional
        Draw a horizontal line at this value (e.g. 1 for speed-ups).

    Returns
    -------
    bool
        True if the chart was written, False without matplotlib.
    """
    plt = pyplot()
    if plt is None:
        return False
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) + 3) + 2.5, 4.5))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + i * width for g, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        ax.bar(xs, ys, width, label=label)
    if reference is not None:
        ax.axhline(reference, color="k", lw=0.8)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))],
                  list(groups), rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, path)
    return True


def save(fig: Any, path: str, dpi: int = 120) -> None:
    """Lay out, write and close a chart, and say where it went."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    print(f"wrote {path}")
