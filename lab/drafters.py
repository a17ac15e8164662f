"""Drafters: what proposes tokens for the target to verify.

A drafter has two methods:
  * propose(context, k, sampling, rng) -> (draft tokens, q) where q [k, V] holds the
    probabilities the drafts were sampled from (None when drafts are one-hot, e.g. greedy);
  * commit(context) after verification, with the full accepted context, so the drafter can
    keep its own cache consistent.
AR decoding is simply the drafter that proposes nothing.
"""
from __future__ import annotations

import torch

from .engine import Engine
from .sampling import RandomStream, Sampling, probabilities
from .verify import race


class NoDraft:
    """Autoregressive decoding: no drafts, the target's token is the 'bonus' every cycle."""
    name = "ar"

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        return [], None

    def commit(self, context: list[int]) -> None:
        pass


class ModelDraft:
    """Two-model speculative decoding: a small LM drafts k tokens autoregressively, with its
    own KV cache that is cropped back to the accepted context after every cycle."""
    name = "sd"

    def __init__(self, model):
        self.engine = Engine(model)
        self.cached: list[int] = []

    def begin(self, prompt: list[int]) -> None:
        self.engine.reset()
        self.cached = []

    def _feed(self, context: list[int]) -> torch.Tensor:
        """Bring the cache up to `context` (reusing the common prefix); logits for the next token."""
        common = 0
        limit = min(len(self.cached), len(context) - 1)  # always feed at least one token
        while common < limit and self.cached[common] == context[common]:
            common += 1
        self.engine.crop(common)
        logits = self.engine.forward(context[common:], last_only=True).logits[-1].cpu()
        self.cached = list(context)
        return logits

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        drafts, qs, seq = [], [], list(context)
        for _ in range(k):
            q = probabilities(self._feed(seq), s)
            x = int(q.argmax()) if s.greedy else race(q, rng.exponential(q.shape[-1]))
            drafts.append(x)
            qs.append(q)
            seq.append(x)
        return drafts, (None if s.greedy else torch.stack(qs))

    def commit(self, context: list[int]) -> None:
        pass  # the next propose() crops the cache to the common prefix with the new context
