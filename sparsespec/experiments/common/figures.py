"""Plots written so that the same numbers give the same bytes: `make docs` rewrites the PNGs in
docs/img from results/, and an unchanged result must leave them unchanged."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (no display needed; imported only when a plot is made)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> None:
    """Lay the figure out, write it (no timestamp, no version in the file) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110, metadata={"Software": None})
    tmp.replace(path)
    pyplot().close(fig)
