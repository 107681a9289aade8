"""A stand-in for CUDA events on the CPU: events complete late, as on a GPU.

`FakeEvent` records a position on one fake stream; it completes only when the host waits for it
(or for a later event), as a CUDA event completes only once the GPU reaches it. Like
torch.cuda.Event, `elapsed_time` refuses an event that has not completed. Each recorded event is
MS_PER_EVENT of device time after the previous one.
"""

from __future__ import annotations

import torch

MS_PER_EVENT = 2.0


class FakeStream:
    def __init__(self) -> None:
        self.recorded = 0  # events recorded so far
        self.reached = 0  # events the fake device has completed


class FakeEvent:
    stream = FakeStream()

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self.at: int | None = None

    def record(self, stream=None) -> None:
        self.stream.recorded += 1
        self.at = self.stream.recorded

    def query(self) -> bool:
        return self.at is not None and self.at <= self.stream.reached

    def synchronize(self) -> None:
        self.stream.reached = max(self.stream.reached, self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end.at - self.at) * MS_PER_EVENT


def install(monkeypatch, *modules) -> FakeStream:
    """CUDA events replaced by FakeEvent, and every DeviceClock made in `modules` timing as on CUDA
    (the model itself stays on the CPU)."""
    from sparsespec import clock

    stream = FakeStream()
    monkeypatch.setattr(FakeEvent, "stream", stream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    class CudaClock(clock.DeviceClock):
        def __init__(self, device) -> None:
            super().__init__("cuda")

    for module in modules:
        monkeypatch.setattr(module, "DeviceClock", CudaClock)
    return stream
