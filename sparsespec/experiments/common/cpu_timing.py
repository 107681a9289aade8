"""Timing on a shared CPU: a timing during which another process used the CPU is taken again, and
several paths are timed in turns so that a change in the machine's speed reaches all of them alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

BUSY_TICKS = 1  # CPU ticks (1/100 s) other processes may take during one timing before it is redone
RETRIES = 10


def _others_ticks() -> int:
    """CPU ticks every other process has used since boot (Linux; 0 elsewhere, where nothing is discarded)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    busy = sum(map(int, fields)) - int(fields[3]) - int(fields[4])  # all but idle and iowait
    return busy - int(own[11]) - int(own[12])  # less this process's user and system time


def timed(fn: Callable[[], object]) -> float:
    """One timing in ms, taken again (up to RETRIES times) while other processes used the CPU."""
    for _ in range(RETRIES):
        before = _others_ticks()
        t0 = time.perf_counter()
        fn()
        ms = 1000 * (time.perf_counter() - t0)
        if _others_ticks() - before <= BUSY_TICKS:
            break
        time.sleep(0.2)
    return ms


def in_turns(paths: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Each path once per repeat, in turn (after one warm-up each): {name: [ms per repeat]}."""
    for fn in paths.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            times[name].append(timed(fn))
    return times
