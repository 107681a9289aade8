"""What the scripts in scripts/ measure, and their saved reports as markdown tables and plots.

The package sits on top of the library: it uses `eval` (the harness' shared prefill, summaries)
and `training` (truncated drafters, accepted runs), and nothing in the library imports it; the
scripts only parse their arguments and call it. Renderers (bench, soak, budgetdraft, inversion,
runs, train) are pure functions of a saved report, so `scripts/docs.py` can rebuild the tables
and plots in README.md and docs/ from the committed files in results/, and a test can check that
the rebuild reproduces them exactly; `rebuild` does that, through the names in `renderers`. The
measuring modules (bench_run, timing, hf, probes, checkpoint, soak_run, agreement, draft_length,
kernels) need torch; the renderers do not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)
Say = Callable[[str], None]  # where a long measurement reports its progress, one line at a time


def silent(line: str) -> None:
    """A progress line nobody asked for."""


class ReportError(ValueError):
    """A measurement or report that cannot go on, said in one line (a script exits with it)."""


def exit_on_error(main: F) -> F:
    """A script's main, a ReportError turned into the one-line exit a command line expects."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ReportError as e:
            raise SystemExit(str(e)) from None

    return wrapped  # type: ignore[return-value]


def int_list(name: str, value: str, full: bool = False) -> list:
    """A script's comma-separated integers (`full` too where it allows one: None)."""
    try:
        return [None if full and v == "full" else int(v) for v in value.split(",")]
    except ValueError:
        raise ReportError(f"--{name}: comma-separated integers{' or full' if full else ''}, got {value!r}") from None
