"""PNG charts for the benchmarks' and the soak's reports (matplotlib, the ``[bench]`` extra).

matplotlib is imported inside the functions, with the Agg backend (no display), so the benchmarks
that draw nothing run without it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float | None]
    style: str = "-"


@dataclass
class Panel:
    """One chart of a figure: its series on a shared x axis, and vertical marks (x, label)."""

    ylabel: str
    series: list[Series]
    marks: list[tuple[float, str]] = field(default_factory=list)
    log_y: bool = False


def draw(path: Path, title: str, xlabel: str, panels: list[Panel]) -> Path:
    """Draw ``panels`` stacked, one above the other, into ``path`` (PNG). A None in a series is a gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for s in panel.series:
            ys = [float("nan") if v is None else v for v in s.y]
            ax.plot(list(s.x), ys, s.style, label=s.label, linewidth=1.2, markersize=3)
        for x, label in panel.marks:
            ax.axvline(x, color="grey", linestyle=":", linewidth=1)
            ax.annotate(label, (x, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                        fontsize=7, color="dimgrey")  # fmt: skip
        if panel.log_y:  # linear below 100, so 0 and small values stay on the chart
            ax.set_yscale("symlog", linthresh=100)
            ax.set_ylim(bottom=0)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if any(s.label for s in panel.series):
            ax.legend(fontsize=8, loc="best", framealpha=0.8)
    axes[-1, 0].set_xlabel(xlabel)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
