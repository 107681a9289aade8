"""The renderers a marked section of README.md or docs/ names (`<!-- results: NAME PATH ... -->`):
each turns the loaded sources (rebuild.load_source) into the section's markdown, or, for a `plot.*`
name, into a PNG. One table, one name, so a doc can cite any table of any saved report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparsespec.eval.summary import calibration_table
from sparsespec.reports import (
    ReportError,
    attention_kernel,
    batching,
    bench,
    budgetdraft,
    control,
    controller,
    drafter_kv,
    figure1,
    runs,
    sensitivity,
    skinny,
    soak,
    train,
    weight_formats,
)


def one_report(sources: list[dict]) -> dict:
    """The one .json report a renderer of a single report takes."""
    if len(sources) != 1 or "report" not in sources[0]:
        raise ReportError("this renderer takes one .json report")
    return sources[0]["report"]


def _of_report(fn: Callable[..., str]) -> Callable[..., str]:
    """A renderer of one .json report."""
    return lambda sources, **kw: fn(one_report(sources), **kw)


def _of_rows(fn: Callable[..., str]) -> Callable[..., str]:
    """A renderer of the rows of every named file or run."""
    return lambda sources, **kw: fn([r for s in sources for r in s["rows"]], **kw)


RENDERERS: dict[str, Callable[..., str]] = {
    "bench": _of_report(bench.markdown),
    "bench.speed": _of_report(bench.speed_table),
    "bench.machine": _of_report(bench.machine_table),
    "bench.split": _of_report(bench.split_table),
    "bench.kernel": _of_report(bench.kernel_table),
    "bench.spread": _of_report(bench.spread_table),
    "bench.quarters": _of_report(bench.quarters_table),
    "bench.pivot": _of_report(bench.pivot_table),
    "eval.report": _of_rows(runs.run_report),
    "eval.tasks": _of_rows(runs.task_table),
    "eval.calibration": _of_rows(lambda rows: calibration_table(rows).rstrip("\n")),
    "eval.sampling": _of_rows(runs.sampling_table),
    "budgetdraft": _of_report(budgetdraft.markdown),
    "batching": _of_report(batching.markdown),
    "skinny": _of_report(skinny.skinny_table),
    "weight_formats": _of_report(weight_formats.weight_formats_table),
    "attention_kernel": _of_report(attention_kernel.attention_table),
    "drafter_kv": _of_report(drafter_kv.table),
    "control": _of_report(control.markdown),
    "figure1": _of_report(figure1.markdown),
    "figure1.training": _of_report(figure1.training_table),
    "controller": _of_report(controller.markdown),
    "sensitivity": _of_report(sensitivity.markdown),
    "soak": _of_report(soak.markdown),
    "train.metrics": _of_report(train.metrics_table),
}
PLOTS: dict[str, Callable[[list[dict], Path], None]] = {
    "plot.bench": lambda sources, path: bench.plot(one_report(sources), path),
    "plot.fig1": lambda sources, path: budgetdraft.plot(one_report(sources), path),
    "plot.control": lambda sources, path: control.plot(one_report(sources), path),
    "plot.figure1": lambda sources, path: figure1.plot(one_report(sources), path),
    "plot.controller": lambda sources, path: controller.plot(one_report(sources), path),
    "plot.sensitivity": lambda sources, path: sensitivity.plot(one_report(sources), path),
    "plot.soak": lambda sources, path: soak.plot(one_report(sources)["runs"], path),
}
