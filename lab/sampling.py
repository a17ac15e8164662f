"""Turning logits into the distribution we sample from. The same function turns the target's logits
(p) and the draft's (q): temperature, top-k or top-p applied to one but not the other silently makes
speculative sampling lossy."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0   # 0 means greedy (argmax); verification then compares tokens
    top_k: int = 0             # 0 disables
    top_p: float = 1.0         # 1 disables

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Logits [..., V] -> probabilities after temperature, top-k and top-p (greedy: the argmax's
    one-hot row). Raises ValueError on a NaN."""
    logits = logits.float()
    if torch.isnan(logits).any():
        raise ValueError("NaN in logits: the model produced an invalid row; check its dtype and inputs")
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / s.temperature
    if s.top_k > 0:
        kth = torch.topk(logits, min(s.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it stays)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p = sorted_p.masked_fill(before >= s.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class RandomStream:
    """Every random number a decoding run uses, from one seeded generator. Verification takes its
    randomness as explicit tensors (uniforms, Exp(1) noise), so a kernel reproduces it bit for bit."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def uniforms(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, dtype=torch.float32)

    def exponential(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.float32).exponential_(1.0, generator=self.generator)


def prompt_seed(seed: int, index: int) -> int:
    """Independent, reproducible stream per prompt: rows do not depend on which others ran."""
    return (seed * 1_000_003 + index) % (2**63)
