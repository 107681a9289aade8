"""Where this process stands among the training processes, and the three collectives the teacher
pass and the export need (barrier, broadcast, sum).

Through the Lightning strategy when a Trainer is attached (it knows the backend's quirks: NCCL
barriers name the device), else straight through torch.distributed (a process group made by
torchrun or by a test), else a single process for which every collective is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0  # rank on this node: one process per node writes what each node needs
    size: int = 1
    trainer: Any = None
    local_size: int = 0  # processes on this node (0: all of them, one node)

    @property
    def node_size(self) -> int:
        return self.local_size or self.size

    def barrier(self, name: str) -> None:
        if self.size == 1:
            return
        if self.trainer is not None:
            self.trainer.strategy.barrier(name)
        elif dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.size == 1:
            return obj
        if self.trainer is not None:
            return self.trainer.strategy.broadcast(obj, src=0)
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum(self, value: int) -> int:
        """The sum of `value` over all ranks (every rank must call it)."""
        if self.size == 1:
            return int(value)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([int(value)], dtype=torch.int64, device=device)
        dist.all_reduce(t)
        return int(t.item())


def world(trainer: Any = None) -> World:
    """This process's place: from the Trainer if one is attached and running several processes, else
    from an initialised torch.distributed process group, else one process."""
    if trainer is not None and getattr(trainer, "world_size", 1) > 1:
        return World(int(trainer.global_rank), int(trainer.local_rank), int(trainer.world_size), trainer,
                     int(getattr(trainer, "num_devices", 0) or 0))
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank = dist.get_rank()
        # torchrun/Lightning set LOCAL_RANK; a process group made by hand is taken to be one node
        return World(rank, int(os.environ.get("LOCAL_RANK", rank)), dist.get_world_size(),
                     local_size=int(os.environ.get("LOCAL_WORLD_SIZE", 0)))
    return World()
