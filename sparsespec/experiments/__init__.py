"""The studies behind the tables and plots of README.md and docs/: each measures something, saves a
report (JSON), and renders it as markdown (and a plot).

A study is one module of this package, found by its name, exposing

    OPTIONS: dict            the shared options it takes (driver.SHARED) with its defaults, e.g.
                             {"ctx": "4k,16k", "new_tokens": 96, "books": 2, "model": None, "data": None}
    arguments(parser)        optional: its own options
    check(args)              optional: refuse bad options before anything loads (ExperimentError),
                             turning them into the values `measure` takes
    RESUME: tuple            optional: the options a resumed run must share with the run it resumes;
                             a study without it keeps no checkpoint (no --resume)
    measure(args, checkpoint) -> dict   the report (the driver adds args, command and provenance)
    markdown(report) -> str  the report's tables; a doc section names it `NAME`, and `NAME.PART`
                             another table of it, `PART_table(report)`
    plot(report, path)       optional: its plot; a doc section names it `plot.NAME`

    python -m sparsespec.experiments NAME [options]    # measure, save (--out), print, plot (--plot)
    python -m sparsespec.experiments docs [--check]    # rebuild every table and plot in the docs

A module with `markdown` but no `measure` renders what another program measured (`evaluate`:
evaluate.py's runs; `train`: a train.py run's metrics). Renderers are pure functions of a saved
report (no torch needed), so the docs rebuild from the committed files in results/.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType

Say = Callable[[str], None]  # where a long measurement reports its progress, one line at a time


def silent(line: str) -> None:
    """A progress line nobody asked for."""


class ExperimentError(ValueError):
    """A measurement or report that cannot go on, said in one line (the driver exits with it)."""


def int_list(name: str, value: str, full: bool = False) -> list:
    """An option's comma-separated integers (`full` too where it allows one: None)."""
    try:
        return [None if full and v == "full" else int(v) for v in str(value).split(",")]
    except ValueError:
        raise ExperimentError(f"--{name.replace('_', '-')}: comma-separated integers{' or full' if full else ''}, "
                              f"got {value!r}") from None


def float_list(name: str, value: str) -> list[float]:
    """An option's comma-separated numbers."""
    try:
        return [float(v) for v in str(value).split(",")]
    except ValueError:
        raise ExperimentError(f"--{name.replace('_', '-')}: comma-separated numbers, got {value!r}") from None


def names() -> list[str]:
    """Every module of the package that renders a report (a study, or a renderer of another program's)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg and not m.name.startswith("_")
                  and m.name != "driver")


def study(name: str) -> ModuleType:
    """The module of study `name`; an ExperimentError naming the known ones where there is none."""
    if name not in names():
        raise ExperimentError(f"no study {name!r}; known: {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}")
