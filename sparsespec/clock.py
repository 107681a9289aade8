"""Timing spans of device work, for the engine's split of a round and the recall index's cost.

On CUDA a mark is a recorded event: a kernel launch returns long before the kernel ends, so the
host's clock would time the launches, not the work. An event is complete only once the GPU has
reached it, and `elapsed_time` refuses an incomplete one, so a span is read after waiting for its
end event (the host has usually waited for the device already; the wait is then free). Elsewhere a
mark is `time.perf_counter()`.
"""

from __future__ import annotations

import time

import torch


class DeviceClock:
    """Times spans of device work on `device` (see the module docstring).

    `late_reads` counts the spans whose end event was not yet complete when read (the read then
    waited for it): how often a read without the wait would have failed."""

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.late_reads = 0

    def mark(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: float | torch.cuda.Event, end: float | torch.cuda.Event) -> float:
        """The span between two marks, `start` recorded before `end` on the same stream. On CUDA it
        waits for `end` to complete if it has not (then `start` has too: a stream runs in order)."""
        if not self.cuda:
            return end - start
        if not end.query():
            self.late_reads += 1
            end.synchronize()
        return start.elapsed_time(end) / 1000.0
