"""The BudgetDraft LightningModule.

Each training step, for a batch of sequences with full-cache teacher targets:
  full branch    drafter with plain causal attention -> ce + acceptance-aware loss
  sparse branch  for every budget B sampled this step, the same drafter with the streaming view's
                 mask at B (exactly the inference view) -> ce to the same teacher targets + KL to
                 the (detached) full branch, on the positions where the view is actually sparse.
Validation: teacher-forced draft acceptance (argmax agreement with the teacher's greedy tokens) for
the full view and each eval budget, over the second half of each sequence (where every eval budget
<= seq_len / 2 is sparse), plus tau@k, the expected accepted drafts per greedy round of k.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import lightning as L
import torch
from transformers import PreTrainedModel

from sparsespec.training.budgets import BudgetSampler, sparse_rows, view_mask
from sparsespec.training.losses import BudgetDraftLoss

log = logging.getLogger(__name__)


def accepted_run(agree: torch.Tensor, k: int) -> torch.Tensor:
    """For agreement flags [n] (bool), mean over round starts t of the number of consecutive
    agreements from t, capped at k: the accepted drafts of a greedy round starting at t."""
    a = agree.float()
    n = a.shape[0]
    total = torch.zeros(n, device=a.device)
    run = torch.ones(n, device=a.device)
    for d in range(k):
        shifted = torch.zeros(n, device=a.device)
        shifted[: n - d] = a[d:]
        run = run * shifted
        total = total + run
    return total[: max(n - k + 1, 1)].mean()


def schedule_steps(trainer: L.Trainer) -> int:
    """The optimizer steps the LR schedule spans: Lightning's `estimated_stepping_batches`, i.e.
    trainer.max_steps, or trainer.max_epochs x optimizer steps per epoch when that ends training
    first (max_steps=-1: max_epochs alone, Lightning's default 1000 when it is unset too).

    When the length depends on the epochs, the steps per epoch are counted on a loader of the
    datamodule's own, as Lightning counts them (limit_train_batches, accumulate_grad_batches):
    Lightning's estimate would set the fit loop's train loader up here, before a resumed run
    restores its position, which is then never restored (Lightning-AI/pytorch-lightning#20550),
    so a resumed run would redraw the epoch from its start."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_steps == -1 and max_epochs == -1:
        raise ValueError("trainer.max_steps=-1 and trainer.max_epochs=-1 set no end to training, and the "
                         "learning-rate schedule needs one: set trainer.max_steps=N or trainer.max_epochs=N")
    dm = trainer.datamodule
    if max_epochs == -1 or trainer.train_dataloader is not None or dm is None:
        total = trainer.estimated_stepping_batches
    else:
        batches = len(dm.train_dataloader())
        limit = trainer.limit_train_batches
        batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
        total = math.ceil(batches / trainer.accumulate_grad_batches) * max(max_epochs, 1)
        if max_steps != -1:
            total = min(total, max_steps)
        log.info("learning-rate schedule: %d optimizer steps (trainer.max_epochs=%s x %d per epoch%s)", total,
                 max_epochs, math.ceil(batches / trainer.accumulate_grad_batches),
                 f", capped by trainer.max_steps={max_steps}" if max_steps != -1 else "")
    if not math.isfinite(total) or total < 0:  # e.g. an iterable loader without a length and max_steps=-1
        raise ValueError(f"trainer.max_steps={max_steps} with trainer.max_epochs={max_epochs} gives the learning-rate "
                         "schedule no length (the training loader has none): set trainer.max_steps=N")
    return max(int(total), 1)


class BudgetDraftModule(L.LightningModule):
    def __init__(self, drafter: PreTrainedModel, budget: BudgetSampler, loss: BudgetDraftLoss,
                 optim: dict[str, Any], seed: int = 0, tau_k: int = 4, loss_positions: int | None = None):
        super().__init__()
        # train on the last `loss_positions` positions of each window only: every layer still reads
        # the whole window, but the 49k-vocab head (most of a step's cost) runs on those positions
        self.loss_positions = loss_positions
        self.drafter = drafter
        self.budget, self.loss_fn = budget, loss
        self.optim = dict(optim)  # conf/train.yaml's optim section: lr, weight_decay, warmup_ratio, min_lr_ratio, betas
        self.rng = random.Random(seed)
        self.tau_k = tau_k
        self.train_steps_run = 0  # steps executed by this process (resume tests check it)
        self.last_budgets: list[int] = []
        self.save_hyperparameters(ignore=["drafter", "budget", "loss"])

    # -- forwards -----------------------------------------------------------------------------
    def _hidden(self, ids: torch.Tensor, budget: int | None) -> torch.Tensor:
        mask = None if budget is None else view_mask(budget, self.budget.k_sink, ids.shape[1], ids.device)
        return self.drafter.model(input_ids=ids, attention_mask=mask).last_hidden_state

    def logits(self, ids: torch.Tensor, budget: int | None = None, start: int = 0) -> torch.Tensor:
        """Float32 logits [b, n - start, V] for positions start.. under view `budget` (None = full).
        Only those positions go through the head: the 49k-vocab head dominates the step's cost."""
        return self.drafter.lm_head(self._hidden(ids, budget)[:, start:]).float()

    # -- training -----------------------------------------------------------------------------
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, tgt = batch["input_ids"], batch["targets"]
        n = ids.shape[1]
        topk_idx, topk_logp = batch.get("topk_idx"), batch.get("topk_logp")
        flat = lambda x, s=0: None if x is None else x[:, s:].reshape(-1, *x.shape[2:])  # noqa: E731

        first = max(n - self.loss_positions, 0) if self.loss_positions else 0
        full = self.logits(ids, start=first)
        parts = self.loss_fn.full(full.reshape(-1, full.shape[-1]), flat(tgt, first), flat(topk_idx, first),
                                  flat(topk_logp, first))
        budgets = self.budget.sample(n, self.rng)
        self.last_budgets = list(budgets)  # what this step drew (resume tests compare it)
        for b in budgets:
            s = max(sparse_rows(b, n), first)
            sp = self.logits(ids, b, start=s)
            for k, v in self.loss_fn.sparse(sp.reshape(-1, sp.shape[-1]),
                                            full[:, s - first :].reshape(-1, sp.shape[-1]),
                                            flat(tgt, s), flat(topk_idx, s), flat(topk_logp, s)).items():
                parts[k] = parts.get(k, 0.0) + v / len(budgets)
        loss = sum(parts.values())
        bs = ids.shape[0]
        for k, v in parts.items():
            self.log(f"train/{k}", v, batch_size=bs)
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/budget", float(budgets[0]) if budgets else float(n), batch_size=bs)
        self.train_steps_run += 1
        return loss

    # -- validation ---------------------------------------------------------------------------
    # Every row of every batch is scored and the epoch's numbers are means over distinct rows: a
    # mean of per-batch (or per-rank) means would weigh rows unequally, and where the rows do not
    # divide evenly among the ranks Lightning's distributed sampler repeats a few so that every rank
    # has a batch. Each row is kept under its dataset index, and the ranks' rows are gathered and
    # deduplicated by that index, so a repeated row counts once.
    def on_validation_epoch_start(self) -> None:
        self._val_rows: dict[int, dict[str, float]] = {}

    def _row_ids(self, batch: dict[str, torch.Tensor], rows: int) -> list[int]:
        if "row" in batch:
            return [int(r) for r in batch["row"]]
        # a batch without dataset indices (a direct call): ids no other row can have, on any rank
        world, rank = (self._trainer.world_size, self._trainer.global_rank) if self._trainer else (1, 0)
        start = len(self._val_rows)
        return [-2 - (start + i) * world - rank for i in range(rows)]

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        ids, tgt = batch["input_ids"], batch["targets"]
        n = ids.shape[1]
        s = n // 2
        if not hasattr(self, "_val_rows"):
            self.on_validation_epoch_start()
        scores: dict[str, torch.Tensor] = {}
        per_row = []
        for b in [None, *self.budget.eval_budgets(n)]:
            agree = self.logits(ids, b, start=s).argmax(-1) == tgt[:, s:]  # [rows, n - s]
            name = "full" if b is None else f"B{b}"
            acc = agree.float().mean(1)
            per_row.append(acc)
            scores[f"val/acc_{name}"] = acc
            scores[f"val/tau{self.tau_k}_{name}"] = torch.stack([accepted_run(a, self.tau_k) for a in agree])
        # the checkpoint monitor: mean acceptance over the full view and every eval budget
        scores["val/acceptance"] = torch.stack(per_row).mean(0)
        for i, row in enumerate(self._row_ids(batch, ids.shape[0])):
            self._val_rows[row] = {k: float(v[i]) for k, v in scores.items()}

    def _gather_rows(self, table: torch.Tensor) -> torch.Tensor:
        """Every rank's [rows, 1 + keys] table, stacked (padded to the longest with row id -1)."""
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return table
        strategy = trainer.strategy
        longest = int(strategy.reduce(torch.tensor(float(table.shape[0]), device=self.device), reduce_op="max"))
        padded = torch.full((longest, table.shape[1]), float("nan"), dtype=table.dtype)
        padded[:, 0] = -1
        padded[: table.shape[0]] = table
        return strategy.all_gather(padded.to(self.device)).cpu().reshape(-1, table.shape[1])

    def val_metrics(self) -> dict[str, float]:
        """This epoch's validation numbers so far: every key's mean over the distinct rows scored on
        all ranks."""
        rows = getattr(self, "_val_rows", {})
        keys = sorted({k for scores in rows.values() for k in scores})
        table = torch.tensor([[row, *(scores.get(k, float("nan")) for k in keys)] for row, scores in rows.items()],
                             dtype=torch.float64).reshape(-1, 1 + len(keys))
        table = self._gather_rows(table)
        table = table[table[:, 0] != -1]
        order = torch.argsort(table[:, 0], stable=True)
        ids = table[order, 0]
        first = torch.ones_like(ids, dtype=torch.bool)
        first[1:] = ids[1:] != ids[:-1]
        table = table[order[first]]
        out = {}
        for j, key in enumerate(keys, start=1):
            values = table[:, j][~table[:, j].isnan()]
            if values.numel():
                out[key] = float(values.mean())
        return out

    def on_validation_epoch_end(self) -> None:
        for key, value in self.val_metrics().items():
            self.log(key, value, prog_bar=key == "val/acceptance", sync_dist=False)

    # the budget sampler's RNG travels with the checkpoint, so a resumed run samples what an
    # uninterrupted one would have
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["budget_rng"] = self.rng.getstate()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "budget_rng" in checkpoint:
            state = checkpoint["budget_rng"]
            self.rng.setstate((state[0], tuple(state[1]), state[2]))

    # -- optimisation -------------------------------------------------------------------------
    def configure_optimizers(self):
        o = self.optim
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weight_decay"], betas=tuple(o["betas"]))
        total = schedule_steps(self.trainer)
        warm = max(int(o["warmup_ratio"] * total), 1)
        floor = float(o["min_lr_ratio"])

        def schedule(step: int) -> float:  # linear warmup, cosine decay to min_lr_ratio
            if step < warm:
                return (step + 1) / warm
            t = min((step - warm) / max(total - warm, 1), 1.0)
            return floor + (1 - floor) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * t)).item())

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
