"""Closed-form results of speculative sampling (Leviathan et al. 2023), used to check the
measurements: acceptance rate, expected tokens per cycle, walltime improvement."""
from __future__ import annotations

import torch


# Leviathan et al. (2023), Table 1: the paper's speed-ups at c = 0 for (alpha, gamma)
PAPER_TABLE_1 = {(0.8, 5): 3.69, (0.9, 10): 6.86}


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q), per row."""
    return torch.minimum(p, q).sum(-1)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per cycle with gamma drafts and i.i.d. acceptance alpha:
    (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float, verify: float = 1.0) -> float:
    """Speed-up over AR when a draft call costs c target calls: (1 - alpha^(gamma+1)) / ((1 - alpha)
    (gamma c + verify)), with `verify` = T(gamma+1) / T(1) the cost of scoring gamma + 1 positions in
    one-position forwards (Leviathan et al. assume 1: positions scored in parallel are free)."""
    return expected_tokens(alpha, gamma) / (gamma * c + verify)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 32, verify=None) -> int:
    """The gamma in 0..max_gamma with the largest walltime improvement; `verify(gamma)` gives
    T(gamma+1) / T(1) (default: 1 for every gamma, Leviathan's assumption)."""
    return max(range(max_gamma + 1),
               key=lambda g: walltime_improvement(alpha, g, c, 1.0 if verify is None else verify(g)))


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Leviathan et al., Theorem 3.11: the expected factor on total arithmetic when a draft step does
    c_hat of a target step's operations, (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).
    Above 1, speculation pays arithmetic (rejected drafts are scored too) for fewer serial steps."""
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)
