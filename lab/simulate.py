"""Monte Carlo of one verification cycle on small synthetic distributions. The rows are
context-free (the target's distribution at draft position i is p[i] whatever came before), so the
first emitted token must follow p[0] exactly: the theory is easy to check."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .sampling import RandomStream
from .verify.lossless import race, verify_chain, verify_tree


@dataclass
class Simulation:
    first: np.ndarray            # counts of the first emitted token
    second: np.ndarray           # counts of the second emitted token, over cycles that accepted draft 1
    tokens_per_cycle: np.ndarray  # emitted tokens in each simulated cycle


def simulate_chain(p: torch.Tensor, q: torch.Tensor, n: int, seed: int,
                   verify: Callable = verify_chain) -> Simulation:
    """Run `n` independent cycles with K = q.shape[0] drafts sampled from q; p has K+1 rows."""
    rng, k, v = RandomStream(seed), q.shape[0], p.shape[-1]
    first, second, lengths = np.zeros(v), np.zeros(v), np.zeros(n, dtype=np.int64)
    for i in range(n):
        drafts = [race(q[j], rng.exponential(v)) for j in range(k)]
        r = verify(drafts, q, p, rng.uniforms(k), rng.exponential(v))
        first[r.tokens[0]] += 1
        if r.n_accepted >= 1:
            second[r.tokens[1]] += 1
        lengths[i] = len(r.tokens)
    return Simulation(first, second, lengths)


def simulate_tree(tokens: list[int], parents: list[int], p: torch.Tensor, n: int, seed: int,
                  verify: Callable | None = None) -> Simulation:
    """Run `n` independent verifications of a fixed draft tree (p [N, V] per node)."""
    verify = verify or verify_tree
    rng, v = RandomStream(seed), p.shape[-1]
    first, second, lengths = np.zeros(v), np.zeros(v), np.zeros(n, dtype=np.int64)
    for i in range(n):
        r = verify(tokens, parents, p, rng.uniforms(len(tokens)), rng.exponential(v))
        first[r.tokens[0]] += 1
        if len(r.path) > 1:
            second[r.tokens[1]] += 1
        lengths[i] = len(r.tokens)
    return Simulation(first, second, lengths)
