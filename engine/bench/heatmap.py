"""A heat map of one value per (row, column) cell, written as a PNG (matplotlib on Agg, imported only here).

The colour scale diverges around `center` (for ratios, 1.0: better than the reference one colour, worse the
other), so a glance tells on which side of parity each cell lies. Cells with no value (None) are grey and
say "n/a"; each cell prints its value in `fmt`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path


def _span(values: list[float], center: float) -> float:
    """Half-width of the colour scale: the farthest value from the centre (a small floor so that a matrix
    of equal values still draws)."""
    far = max((abs(v - center) for v in values), default=0.0)
    return max(far, 1e-9 if center == 0 else abs(center) * 1e-3)


def write_heatmap(
    path: str | Path,
    rows: Sequence[str],
    cols: Sequence[str],
    values: Sequence[Sequence[float | None]],
    title: str,
    fmt: str = "{:.2f}",
    center: float = 1.0,
    cmap: str = "RdYlGn",
    xlabel: str = "",
    ylabel: str = "",
) -> bool:
    """Write the heat map to `path`; False (and no file) where matplotlib is not installed.

    `values[i][j]` belongs to rows[i], cols[j]; None or NaN marks a missing cell. With the default
    colour map, values above `center` are green and below red."""
    if len(values) != len(rows) or any(len(r) != len(cols) for r in values):
        raise ValueError(f"values must be {len(rows)} rows of {len(cols)} columns")
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no heat map", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    grid = np.array(
        [[math.nan if v is None else float(v) for v in row] for row in values], dtype=float
    ).reshape(len(rows), len(cols))
    present = [float(v) for v in grid.flat if not math.isnan(v)]
    half = _span(present, center)
    norm = TwoSlopeNorm(vcenter=center, vmin=center - half, vmax=center + half)
    colours = matplotlib.colormaps[cmap].with_extremes(bad="#d0d0d0")

    fig, ax = plt.subplots(figsize=(1.4 + 1.2 * len(cols), 1.2 + 0.55 * len(rows)))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=colours, norm=norm, aspect="auto")
    ax.set_xticks(range(len(cols)), labels=list(cols))
    ax.set_yticks(range(len(rows)), labels=list(rows))
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = grid[i, j]
            ax.text(j, i, "n/a" if math.isnan(v) else fmt.format(v), ha="center", va="center", fontsize=9)
    ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
