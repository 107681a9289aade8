"""The verifier: which drafted tokens are kept. Both rules return the target's own output.

Greedy: the longest prefix of the draft equal to the target's argmax, then the target's argmax.
Sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft x_i with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw from norm(max(p_i - q_i, 0)); if all k
are accepted draw a bonus token from p_{k+1}. Each emitted token is then distributed exactly as p.
"""

from __future__ import annotations

import torch


def accept_greedy(draft: torch.Tensor | list[int], target_logits: torch.Tensor) -> tuple[int, int, list[int]]:
    """draft: k tokens (a list, or a tensor on the logits' device); target_logits: [k + 1, V].
    Returns (n_accepted, next_token, the draft as a list)."""
    return accept_greedy_many([draft], [target_logits])[0]


def accept_greedy_many(drafts: list[torch.Tensor | list[int]],
                       target_logits: list[torch.Tensor]) -> list[tuple[int, int, list[int]]]:
    """`accept_greedy` for each sequence of a batch. The drafts (on the device) and the target's
    tokens of every sequence come back to the host in one read: one wait for the device per round,
    whatever the batch size."""
    targets = [logits.argmax(-1) for logits in target_logits]
    # a draft already on the host (prompt lookup's copy) stays there: copying it to the device only
    # to read it back would add a blocking host-to-device copy per round
    parts = []
    for d, t in zip(drafts, targets, strict=True):
        parts += [d.to(t.device), t] if isinstance(d, torch.Tensor) else [t]
    flat = torch.cat(parts).tolist()
    out, at = [], 0
    for d in drafts:
        k = len(d)
        if isinstance(d, torch.Tensor):
            draft, target = flat[at : at + k], flat[at + k : at + 2 * k + 1]
            at += 2 * k + 1
        else:
            draft, target = list(d), flat[at : at + k + 1]
            at += k + 1
        n = 0
        while n < k and draft[n] == target[n]:
            n += 1
        out.append((n, target[n], draft))
    return out


def accept_speculative(
    draft: torch.Tensor | list[int],
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """draft: k tokens (a list, or a tensor on p's device); q: [k, V] the distributions they were
    sampled from; p: [k + 1, V] the target's (same temperature / top-p transform). Returns
    (n_accepted, next_token)."""
    k = len(draft)
    if k:
        idx = torch.as_tensor(draft, device=p.device)
        rows = torch.arange(k, device=p.device)
        ratio = p[rows, idx] / q[rows, idx]
        u = torch.rand(k, generator=generator, device=p.device)
        rejected = (u >= ratio).tolist()  # u < min(1, ratio) accepts; one host read for all k
        if True in rejected:
            i = rejected.index(True)
            residual = (p[i] - q[i]).clamp(min=0)
            total = residual.sum()
            # total == 0 only if p == q, where rejection has probability 0; guard anyway (on the device)
            dist = torch.where(total > 0, residual / total, p[i])
            return i, int(torch.multinomial(dist, 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))
