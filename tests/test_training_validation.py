"""Validation over several ranks: a row Lightning's distributed sampler repeats (to give every rank a
batch) counts once, and the epoch's numbers are means over distinct rows of all ranks."""
import threading

import pytest
import torch
from conftest import tiny_hf

from sparsespec.training.budgets import BudgetSampler
from sparsespec.training.losses import BudgetDraftLoss
from sparsespec.training.module import BudgetDraftModule


class ThreadRanks:
    """A stand-in for a DDP strategy over threads: reduce and all_gather meet at a barrier."""

    def __init__(self, world: int):
        self.world, self.barrier, self.slots = world, threading.Barrier(world), [None] * world

    def _exchange(self, rank: int, value: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def strategy(self, rank: int):
        ranks = self

        class Strategy:
            def reduce(self, value, reduce_op):
                values = torch.stack(ranks._exchange(rank, value))
                return values.max(0).values if reduce_op == "max" else values.sum(0)

            def all_gather(self, value):
                return torch.stack(ranks._exchange(rank, value))

        class Trainer:
            world_size, global_rank, strategy = ranks.world, rank, Strategy()

        return Trainer()


def _module() -> BudgetDraftModule:
    return BudgetDraftModule(tiny_hf(), BudgetSampler(mode="multi", values=[8], k_sink=2), BudgetDraftLoss(), optim={})


def test_a_row_repeated_for_padding_counts_once_across_ranks():
    module = _module()
    ids = torch.randint(module.drafter.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pred = module.logits(ids, None, start=12).argmax(-1)
    tgt = torch.zeros_like(ids)
    tgt[:, 12:] = (pred + 1) % module.drafter.config.vocab_size  # rows 1 and 2 agree nowhere
    tgt[0, 12:] = pred[0]  # row 0 agrees everywhere
    # three rows on two ranks, as Lightning's sampler deals them: rank 0 gets rows 0, 2; rank 1 gets
    # row 1 and row 0 again (the padding)
    dealt = {0: [0, 2], 1: [1, 0]}
    ranks = ThreadRanks(2)
    modules = {0: module, 1: _module()}
    metrics, errors = {}, []

    def run(rank: int):
        try:
            m = modules[rank]
            m._trainer = ranks.strategy(rank)
            m.on_validation_epoch_start()
            with torch.no_grad():
                for step, row in enumerate(dealt[rank]):
                    batch = {"input_ids": ids[row:row + 1], "targets": tgt[row:row + 1], "row": torch.tensor([row])}
                    m.validation_step(batch, step)
            metrics[rank] = m.val_metrics()
        except Exception as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    # (1 + 0 + 0) / 3 distinct rows on both ranks; counting the repeat would give (1 + 0 + 0 + 1) / 4
    assert metrics[0]["val/acc_full"] == pytest.approx(1 / 3)
    assert metrics[1] == metrics[0]


def test_the_teacher_dataset_gives_each_row_its_index():
    from sparsespec.training.data import TeacherDataset

    data = TeacherDataset(torch.zeros(3, 4, dtype=torch.int32), {"targets": torch.zeros(3, 4, dtype=torch.int32)})
    assert [int(data[i]["row"]) for i in range(3)] == [0, 1, 2]
