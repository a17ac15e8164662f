"""Closed-form results of speculative sampling (Leviathan et al. 2023), used to check the
measurements: acceptance rate, expected tokens per cycle, walltime improvement."""
from __future__ import annotations

import torch


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q), per row."""
    return torch.minimum(p, q).sum(-1)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per cycle with gamma drafts and i.i.d. acceptance alpha:
    (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Speed-up over AR when one draft call costs c target calls:
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 32) -> int:
    """The gamma in 0..max_gamma with the largest walltime improvement."""
    return max(range(max_gamma + 1), key=lambda g: walltime_improvement(alpha, g, c))
