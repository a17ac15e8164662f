"""The one decoding loop: propose -> score -> accept -> commit.

Every method is this loop with a different drafter (AR proposes nothing). Prefill scores the
prompt without its last token; each cycle then feeds [last token, drafts...] to the target
in one forward, so every new token comes out of a verification forward and
tau = new tokens / verification forwards (prefill excluded) is 1 for AR exactly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .engine import Engine
from .sampling import RandomStream, Sampling, probabilities
from .verify import verify_chain, verify_chain_greedy


@dataclass
class DecodeResult:
    tokens: list[int] = field(default_factory=list)      # new tokens, up to and including EOS
    origins: list[str] = field(default_factory=list)     # per token: draft | corrected | bonus | target
    cycles: int = 0                                      # verification forwards of the target
    accepted_per_cycle: list[int] = field(default_factory=list)
    attempted_by_position: list[int] = field(default_factory=list)  # cycles whose drafts 1..i-1 all passed
    accepted_by_position: list[int] = field(default_factory=list)
    top2_gaps: list[float] = field(default_factory=list)  # greedy only: target's top-2 logit gap per token
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        return len(self.tokens) / self.cycles if self.cycles else 0.0


def _count_positions(result: DecodeResult, k: int, n: int) -> None:
    while len(result.attempted_by_position) < k:
        result.attempted_by_position.append(0)
        result.accepted_by_position.append(0)
    for i in range(min(n + 1, k)):
        result.attempted_by_position[i] += 1
        result.accepted_by_position[i] += int(i < n)


def decode(target: Engine, drafter, prompt: list[int], max_new_tokens: int, sampling: Sampling,
           draft_len: int, seed: int, eos_id: int | None,
           on_tokens: Callable[[list[int], list[str]], None] | None = None) -> DecodeResult:
    """Generate up to `max_new_tokens` after `prompt` (stopping after EOS) with `drafter`
    proposing up to `draft_len` tokens per cycle and the target verifying them."""
    if not prompt:
        raise ValueError("empty prompt: give at least one token")
    rng = RandomStream(seed)
    result = DecodeResult()
    start = time.perf_counter()
    target.reset()
    drafter.begin(prompt)
    if len(prompt) > 1:
        target.forward(prompt[:-1], last_only=True)
    context = list(prompt)
    while len(result.tokens) < max_new_tokens:
        # the verification forward also yields one token itself, so never draft past the limit
        k = min(draft_len, max_new_tokens - len(result.tokens) - 1)
        drafts, q = drafter.propose(context, k, sampling, rng)
        logits = target.forward([context[-1]] + drafts).logits.cpu()  # verification runs on the CPU
        if sampling.greedy:
            top2 = torch.topk(logits, 2, dim=-1)
            verdict = verify_chain_greedy(drafts, top2.indices[:, 0].tolist())
            gaps = (top2.values[:, 0] - top2.values[:, 1]).tolist()
        else:
            p = probabilities(logits, sampling)
            verdict = verify_chain(drafts, q, p, rng.uniforms(len(drafts)), rng.exponential(p.shape[-1]))
            gaps = []
        target.crop(len(context) + verdict.n_accepted)
        drafter.commit(context + verdict.tokens)

        n = verdict.n_accepted
        last = "target" if not drafts else ("bonus" if n == len(drafts) else "corrected")
        emitted, origins = verdict.tokens, ["draft"] * n + [last]
        if eos_id is not None and eos_id in emitted:
            emitted = emitted[: emitted.index(eos_id) + 1]
        emitted = emitted[: max_new_tokens - len(result.tokens)]
        origins = origins[: len(emitted)]
        result.tokens += emitted
        result.origins += origins
        result.top2_gaps += gaps[: len(emitted)]
        result.cycles += 1
        result.accepted_per_cycle.append(n)
        _count_positions(result, len(drafts), n)
        context += emitted
        if on_tokens:
            on_tokens(emitted, origins)
        if eos_id is not None and emitted and emitted[-1] == eos_id:
            break
    result.seconds = time.perf_counter() - start
    return result
