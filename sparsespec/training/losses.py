"""BudgetDraft losses, all computed in float32 / log space.

Shapes: logits [n, V] (positions flattened), teacher targets [n] (the full-cache target's greedy
tokens), optional teacher top-k `topk_idx` [n, k] / `topk_logp` [n, k] log-probabilities.

* `ce`: cross-entropy on the teacher's greedy tokens (what greedy verification checks).
* `acceptance`: a survival-weighted acceptance loss. alpha_t is the probability that the draft at
  position t is accepted: sum_v min(p_t(v), q_t(v)) over the teacher's cached top-k (exact
  speculative sampling; the mass outside the top-k is unknown and counted as 0, so this is a lower
  bound), or q_t(y_t) when no top-k is cached (the drafter's mass on the greedy target). A token
  drafted at depth d of a round is only verified if the d drafts before it survived, so position t
  is weighted by the (detached) expected survival to it, averaged over the depths 0..k-1 it may
  sit at: w_t = 1/k * sum_{d<k} prod_{j=1..d} alpha_{t-j}. The loss is mean_t w_t * -log alpha_t,
  with w normalised to mean 1 so its scale matches `ce`.
* `kl`: KL(p_full || q_sparse) between the (detached) full-cache branch and a sparse view, so every
  view is pulled to the one full-cache prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

EPS = 1e-9


def ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets)


def acceptance_prob(
    logp: torch.Tensor,
    targets: torch.Tensor,
    topk_idx: torch.Tensor | None = None,
    topk_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha_t [n] from drafter log-probs `logp` [n, V]: sum over the teacher top-k of
    min(p, q), or q(target) without top-k. Computed as exp(min(log p, log q)) (log space)."""
    if topk_idx is None or topk_logp is None:
        return logp.gather(-1, targets[:, None]).squeeze(-1).exp()
    q = logp.gather(-1, topk_idx.long())
    return torch.minimum(q, topk_logp.float()).exp().sum(-1)


def survival_weights(alpha: torch.Tensor, depth: int) -> torch.Tensor:
    """w_t = 1/depth * sum_{d<depth} prod_{j=1..d} alpha_{t-j} (alpha_{<0} = 1: a round may start
    anywhere), normalised to mean 1; no gradient flows through the weights."""
    a = alpha.detach().double()
    n = a.shape[0]
    w = torch.ones(n, dtype=a.dtype, device=a.device)
    run = torch.ones(n, dtype=a.dtype, device=a.device)
    for d in range(1, depth):
        shifted = torch.ones_like(a)
        shifted[d:] = a[: n - d]  # alpha_{t-d}
        run = run * shifted
        w = w + run
    w = w / depth
    return (w / w.mean().clamp_min(EPS)).float()


def acceptance_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    topk_idx: torch.Tensor | None = None,
    topk_logp: torch.Tensor | None = None,
    depth: int = 4,
    logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """`logp`: log_softmax(logits) if the caller has it already (saves a pass over [n, V])."""
    logp = F.log_softmax(logits.float(), dim=-1) if logp is None else logp
    alpha = acceptance_prob(logp, targets, topk_idx, topk_logp)
    w = survival_weights(alpha, depth)
    return (w * -(alpha.clamp_min(EPS)).log()).mean()


def kl(full_logits: torch.Tensor, sparse_logits: torch.Tensor, q_log: torch.Tensor | None = None) -> torch.Tensor:
    """KL(p_full || q_sparse), mean over positions; p_full is detached (the target of alignment)."""
    p_log = F.log_softmax(full_logits.detach().float(), dim=-1)
    q_log = F.log_softmax(sparse_logits.float(), dim=-1) if q_log is None else q_log
    return F.kl_div(q_log, p_log, log_target=True, reduction="batchmean")


@dataclass
class BudgetDraftLoss:
    """Weights of the loss group (conf/loss/*.yaml). Full branch: ce + acc; every sparse view:
    sparse_ce (to the same teacher target) + sparse_acc + kl (to the full branch)."""

    ce: float = 1.0
    acc: float = 1.0
    sparse_ce: float = 1.0
    sparse_acc: float = 0.0
    kl: float = 1.0
    depth: int = 4  # draft length k the survival weights assume

    def __post_init__(self) -> None:
        weights = {"ce": self.ce, "acc": self.acc, "sparse_ce": self.sparse_ce, "sparse_acc": self.sparse_acc,
                   "kl": self.kl}
        for key, w in weights.items():
            if not w >= 0:  # also rejects nan
                raise ValueError(f"loss.{key}={w}: loss weights must be >= 0")
        if sum(weights.values()) <= 0:
            raise ValueError(f"loss weights {weights} are all 0: nothing to train (set at least one > 0)")
        if self.depth < 1:
            raise ValueError(f"loss.depth={self.depth}: allowed values >= 1 (the draft length k)")

    # one log_softmax per branch, shared by its losses: each pass over [n, 49k] costs ~0.3 s on CPU
    def full(self, logits, targets, topk_idx=None, topk_logp=None) -> dict[str, torch.Tensor]:
        logp = F.log_softmax(logits.float(), dim=-1)
        parts = {}
        if self.ce:
            parts["ce"] = self.ce * F.nll_loss(logp, targets)
        if self.acc:
            parts["acc"] = self.acc * acceptance_loss(logits, targets, topk_idx, topk_logp, self.depth, logp=logp)
        return parts

    def sparse(self, logits, full_logits, targets, topk_idx=None, topk_logp=None) -> dict[str, torch.Tensor]:
        logp = F.log_softmax(logits.float(), dim=-1)
        parts = {}
        if self.sparse_ce:
            parts["sparse_ce"] = self.sparse_ce * F.nll_loss(logp, targets)
        if self.sparse_acc:
            parts["sparse_acc"] = self.sparse_acc * acceptance_loss(logits, targets, topk_idx, topk_logp, self.depth,
                                                                    logp=logp)
        if self.kl:
            parts["kl"] = self.kl * kl(full_logits, logits, q_log=logp)
        return parts
