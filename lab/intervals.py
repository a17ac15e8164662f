"""The intervals the chapters print beside small samples: Wilson's for a proportion, and paired
bootstraps over prompts for two methods measured on the same prompts."""
from __future__ import annotations

import math

import numpy as np


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial proportion (95% at z = 1.96); None for n = 0."""
    if n == 0:
        return None
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _percentile_interval(statistic, groups: int, draws: int, level: float, seed: int) -> tuple[float, float]:
    """The percentile interval of `statistic(picks)`, `picks` [draws, groups] the groups resampled."""
    picks = np.random.default_rng(seed).integers(0, groups, size=(draws, groups))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(statistic(picks), [tail, 100 - tail])
    return float(low), float(high)


def paired_bootstrap(weights: list[float], a: list[float], b: list[float], draws: int = 4000, level: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float]:
    """(difference, low, high): the `weights`-weighted mean of `b` minus that of `a` over prompts measured
    by both, and its percentile interval from resampling whole prompts (their positions are correlated).
    ValueError unless `weights`, `a` and `b` hold the same two or more groups."""
    w, a, b = (np.asarray(x, dtype=float) for x in (weights, a, b))
    if not len(w) == len(a) == len(b) or len(w) < 2:
        raise ValueError("paired_bootstrap needs the same two or more groups measured by both")
    low, high = _percentile_interval(lambda picks: (w[picks] * (b[picks] - a[picks])).sum(1) / w[picks].sum(1),
                                     len(w), draws, level, seed)
    return float((w * (b - a)).sum() / w.sum()), low, high


def ratio_bootstrap(numerator: list[float], denominator: list[float], draws: int = 4000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float, float]:
    """(ratio, low, high): sum(numerator) / sum(denominator) over paired items (e.g. two methods'
    seconds per prompt), and its percentile interval from resampling whole items, both measurements
    together (a long prompt is slow for both). ValueError unless two or more items, all denominators > 0."""
    n, d = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if len(n) != len(d) or len(n) < 2 or (d <= 0).any():
        raise ValueError("ratio_bootstrap needs the same two or more items, with positive denominators")
    low, high = _percentile_interval(lambda picks: n[picks].sum(1) / d[picks].sum(1), len(n), draws, level, seed)
    return float(n.sum() / d.sum()), low, high
