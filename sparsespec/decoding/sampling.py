"""Turning logits into the distribution a token is drawn from.

The drafter and the verifier must use the same transform (temperature, then top-p), and the
verifier must see exactly the q the draft was sampled from; both go through `probs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsespec.checks import number, require


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0

    def __post_init__(self) -> None:
        # the checks evaluate.py's gen.temperature and gen.top_p get, for callers of this API
        require(number("temperature", self.temperature) >= 0, "temperature", self.temperature,
                ">= 0 (0 = greedy, > 0 = sampling)")
        require(0 < number("top_p", self.top_p) <= 1, "top_p", self.top_p, "(0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] float32 logits -> [..., V] probabilities (one-hot at the argmax when greedy)."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        p = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1:
            sorted_p, order = p.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            p = torch.zeros_like(p).scatter(-1, order, sorted_p)
            p = p / p.sum(-1, keepdim=True)
        return p

    def draw(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draw one token from 1-D logits: (token, the probabilities it was drawn from, or None when
        greedy: nobody needs a one-hot q). The token stays on the logits' device ([1]), so a drafter
        feeding it to its next step does not wait for the device."""
        if self.greedy:
            return logits.argmax(-1, keepdim=True), None
        p = self.probs(logits)
        return torch.multinomial(p, 1, generator=generator), p


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of softmax(logits), a 0-d tensor on the logits' device: the entropy
    controller's confidence signal (it reads the value, and so waits for the GPU, each draft step)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum()
