"""Training at the scale of several GPUs, checked on the CPU: the teacher's memory is bounded by
chunks of positions, parameters on a device are fingerprinted, the ranks of a node share the
teacher shards their node is missing, and validation scores every row of a batch."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_hf

from sparsespec.training import teacher as teacher_module
from sparsespec.training.teacher import Teacher, model_fingerprint


class OffHost(torch.Tensor):
    """A parameter as a GPU's would behave: its values reach numpy only through a copy to the host."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


def test_a_model_on_a_gpu_is_fingerprinted_as_on_the_host(monkeypatch):
    model = tiny_hf().cpu()
    want = model_fingerprint(model)
    on_gpu = {k: v.as_subclass(OffHost) for k, v in model.state_dict().items()}
    monkeypatch.setattr(model, "state_dict", lambda: on_gpu)
    assert model_fingerprint(model) == want


@pytest.mark.parametrize("on_policy", [0, 3])
def test_the_teacher_holds_logits_for_a_chunk_of_positions_at_a_time(monkeypatch, on_policy):
    model = tiny_hf().cpu()
    vocab = model.config.vocab_size
    ids = torch.randint(vocab, (3, 20), generator=torch.Generator().manual_seed(0))
    want = Teacher(model, "float32", topk=4, on_policy_tokens=on_policy)(ids)
    monkeypatch.setattr(teacher_module, "CHUNK_ELEMENTS", 7 * vocab)
    largest = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: largest.append(out.numel()))
    try:
        got = Teacher(model, "float32", topk=4, on_policy_tokens=on_policy)(ids)
    finally:
        hook.remove()
    assert max(largest) <= 7 * vocab  # never [b, L, V]: at most 7 positions' logits at once
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].shape == want[key].shape, key
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5)


# -- several nodes: the shards a node cannot see are shared by its ranks ---------------------------


class ThreadWorld:
    """The collectives of `World` between threads: `size` ranks, `local` per node."""

    def __init__(self, size: int, local: int) -> None:
        import threading

        self.size, self.local = size, local
        self.gate = threading.Barrier(size)
        self.box: list = [None]

    def rank(self, r: int):
        from sparsespec.training.distributed import World

        shared = self

        class Rank(World):
            def barrier(self, name: str) -> None:
                shared.gate.wait(timeout=60)

            def broadcast(self, obj):
                if self.rank == 0:
                    shared.box[0] = obj
                shared.gate.wait(timeout=60)
                out = shared.box[0]
                shared.gate.wait(timeout=60)
                return out

        return Rank(rank=r, local_rank=r % self.local, size=self.size, local_size=self.local)


class CopyTeacher:
    batch_size = 1

    def __call__(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"targets": (rows + 1).to(torch.int32)}


def test_on_nodes_that_do_not_share_the_cache_every_rank_fills_its_share_of_the_holes(tmp_path):
    """2 nodes x 2 ranks, each node its own cache_dir: after the first pass each node lacks the
    other node's shards, and both of its ranks compute them (no rank works while the others wait)."""
    import threading

    from sparsespec.training.data import DraftDataModule
    from sparsespec.training.teacher import TeacherCache

    ids = torch.arange(8 * 4, dtype=torch.int32).reshape(8, 4)  # 8 rows, shard_size 1: 8 shards

    def module(node: int) -> DraftDataModule:
        dm = DraftDataModule(teacher=CopyTeacher, cache_dir=str(tmp_path / f"node{node}"), shard_size=1,
                             seq_len=4, n_train=8, n_val=1)
        dm.splits = {"train": ids}
        dm.caches = {"train": TeacherCache(dm.cache_dir, "key", 8, 1)}
        return dm

    world = ThreadWorld(4, 2)
    modules = [module(r // 2) for r in range(4)]
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            modules[r]._sharded_teacher_pass(world.rank(r))
        except BaseException as e:  # reported below
            errors.append(e)
            world.gate.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # first pass: shards r, r + 4 on rank r (2 each); then each node's 4 holes, 2 per rank of the node
    assert [m.computed_shards for m in modules] == [4, 4, 4, 4]
    for node in (0, 1):
        cache = modules[2 * node].caches["train"]
        assert cache.complete()
        torch.testing.assert_close(cache.load()["targets"], ids + 1)


# -- validation: every row, each once --------------------------------------------------------------


def test_validation_scores_every_row_of_a_batch():
    from sparsespec.training.budgets import BudgetSampler
    from sparsespec.training.losses import BudgetDraftLoss
    from sparsespec.training.module import BudgetDraftModule

    drafter = tiny_hf().cpu()
    module = BudgetDraftModule(drafter, BudgetSampler(mode="multi", values=[8], k_sink=2), BudgetDraftLoss(), optim={})
    ids = torch.randint(drafter.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pred = module.logits(ids, None, start=12).argmax(-1)
    tgt = torch.zeros_like(ids)
    tgt[0, 12:] = pred[0]  # row 0 agrees everywhere, row 1 nowhere (unless by chance)
    tgt[1, 12:] = (pred[1] + 1) % drafter.config.vocab_size
    module.on_validation_epoch_start()
    with torch.no_grad():
        module.validation_step({"input_ids": ids, "targets": tgt}, 0)
    metrics = module.val_metrics()
    assert metrics["val/acc_full"] == pytest.approx(0.5)  # (1 + 0) / 2 rows, not row 0's 1.0
    assert metrics["val/tau4_full"] == pytest.approx(2.0)  # row 0's run is capped at 4, row 1's is 0
