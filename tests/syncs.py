"""Counting the points where the host waits for the device.

On CUDA, `torch.cuda.set_sync_debug_mode("warn")` makes PyTorch warn at every synchronising call (a
device-to-host read, a blocking copy from pageable memory, nonzero, ...): the count is the number of
those warnings. On the CPU nothing waits, so the counter records the operations that would: reading a
tensor's value on the host (`item`, `int()`, `bool()`, `float()`, `tolist`) and the ops whose output
size depends on the data. The CPU count is therefore an upper bound of the CUDA one for the same code
(host-side tensors made on purpose count too), which is what a test of "at most one per round" needs.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that make the host wait for the device (their result, or its size, lives on the device)
SYNCING_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique_consecutive", "_unique2", "equal",
               "is_nonzero"}


class _HostReads(TorchDispatchMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        # repeat_interleave waits only for a tensor of repeats without output_size (to size its output)
        if name in SYNCING_OPS or (name == "repeat_interleave" and func._overloadname != "self_int"
                                   and (kwargs or {}).get("output_size") is None):
            self.counter.record(name)
        return func(*args, **(kwargs or {}))


class SyncCounter:
    """`with SyncCounter(device) as syncs: ...`, then `syncs.count` (and `syncs.names`, what they were)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.names: list[str] = []

    @property
    def count(self) -> int:
        return len(self.names)

    def record(self, name: str) -> None:
        self.names.append(name)

    @contextmanager
    def _cuda(self):
        torch.cuda.synchronize(self.device)
        before = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield self
            finally:
                torch.cuda.set_sync_debug_mode(before)
        self.names += [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]

    @contextmanager
    def _cpu(self):
        original = torch.Tensor.tolist

        def tolist(t: torch.Tensor):
            self.record("tolist")
            return original(t)

        torch.Tensor.tolist = tolist
        try:
            with _HostReads(self):
                yield self
        finally:
            torch.Tensor.tolist = original

    def __enter__(self) -> SyncCounter:
        self._ctx = self._cuda() if self.device.type == "cuda" else self._cpu()
        return self._ctx.__enter__()

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)
