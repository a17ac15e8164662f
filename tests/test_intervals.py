"""The paired bootstraps over prompts (Wilson's interval: tests/test_evaluate.py) and the training verdict."""
import numpy as np
import pytest

from lab.intervals import paired_bootstrap, ratio_bootstrap
from lab.train.loop import converged


def correlated_groups(rng: np.random.Generator, groups: int = 30):
    """Per group (a prompt): its positions, and the means of two methods whose true difference is
    0.2. Each group has its own offset shared by both methods and by all its positions (one text,
    one topic), so positions of a group are correlated."""
    sizes = rng.integers(8, 24, groups)
    a, b = [], []
    for n in sizes:
        shared = rng.normal(0, 0.6)                      # the prompt's own difficulty
        gain = 0.2 + rng.normal(0, 0.3)                   # the prompt's own gain
        noise = rng.normal(0, 0.5, (2, n))
        a.append(2.0 + shared + noise[0].mean())
        b.append(2.0 + shared + gain + noise[1].mean())
    return sizes, a, b


def position_bootstrap(weights, a, b, draws=4000, seed=0):
    """A broken variant: resamples positions as if independent (each group's mean repeated once
    per position), which ignores that a prompt's positions move together."""
    rng = np.random.default_rng(seed)
    diff = np.repeat(np.asarray(b) - np.asarray(a), weights)
    means = diff[rng.integers(0, len(diff), (draws, len(diff)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), float(low), float(high)


@pytest.mark.slow
def test_the_paired_bootstrap_covers_the_truth_and_a_position_bootstrap_does_not():
    rng = np.random.default_rng(0)
    covered = {"prompts": 0, "positions": 0}
    trials = 200
    for trial in range(trials):
        weights, a, b = correlated_groups(rng)
        for name, method in (("prompts", paired_bootstrap), ("positions", position_bootstrap)):
            _, low, high = method(weights, a, b, draws=1000, seed=trial)
            covered[name] += low <= 0.2 <= high
    assert covered["prompts"] / trials >= 0.9, covered
    assert covered["positions"] / trials < 0.75, covered  # far too narrow: the check can fail


def test_the_paired_bootstrap_is_seeded_and_refuses_unpaired_input():
    weights, a, b = correlated_groups(np.random.default_rng(1))
    assert paired_bootstrap(weights, a, b) == paired_bootstrap(weights, a, b)
    diff, low, high = paired_bootstrap(weights, a, b)
    assert low < diff < high
    assert paired_bootstrap([1, 3], [0.0, 0.0], [1.0, 2.0])[0] == 1.75  # b minus a, weighted by positions
    with pytest.raises(ValueError, match="same two or more groups"):
        paired_bootstrap([1, 2], [1.0], [2.0, 3.0])


def test_the_convergence_verdict():
    flat = [[25 * i, 2.0 - 0.5 * (i < 10) * (10 - i) / 10] for i in range(1, 17)]
    assert converged(flat)["verdict"] == "trained enough"
    falling = [[25 * i, 3.0 - 0.1 * i] for i in range(1, 17)]
    verdict = converged(falling)
    assert verdict["verdict"] == "capped" and verdict["relative_change"] > 0.01
    assert converged([[25, 1.0]])["verdict"] is None


def prompt_seconds(rng: np.random.Generator, prompts: int = 10, ratio: float = 1.3):
    """Seconds two methods took per prompt: prompts differ by a factor of ten in length (shared by
    both), and the second is `ratio` times slower up to a per-prompt wobble."""
    length = rng.uniform(1.0, 10.0, prompts)
    first = length * rng.normal(1.0, 0.05, prompts)
    return first, ratio * length * rng.normal(1.0, 0.05, prompts)


def unpaired_ratio(numerator, denominator, draws=1000, seed=0):
    """A broken variant: resamples the two methods' prompts independently, as if unrelated."""
    rng = np.random.default_rng(seed)
    n, d = np.asarray(numerator), np.asarray(denominator)
    ratios = n[rng.integers(0, len(n), (draws, len(n)))].sum(1) / d[rng.integers(0, len(d), (draws, len(d)))].sum(1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(n.sum() / d.sum()), float(low), float(high)


@pytest.mark.slow
def test_the_ratio_bootstrap_covers_the_truth_tightly_and_an_unpaired_one_does_not():
    rng = np.random.default_rng(0)
    covered, widths = {"paired": 0, "unpaired": 0}, {"paired": [], "unpaired": []}
    trials = 200
    for trial in range(trials):
        first, second = prompt_seconds(rng)
        for name, method in (("paired", ratio_bootstrap), ("unpaired", unpaired_ratio)):
            _, low, high = method(second, first, draws=1000, seed=trial)
            covered[name] += low <= 1.3 <= high
            widths[name].append(high - low)
    assert 0.85 <= covered["paired"] / trials, covered
    # the unpaired interval mixes the prompts' lengths into the ratio: many times wider, useless
    assert np.mean(widths["unpaired"]) > 5 * np.mean(widths["paired"]), widths


def test_the_ratio_bootstrap_is_a_ratio_of_sums_and_refuses_bad_input():
    assert ratio_bootstrap([2.0, 6.0], [1.0, 3.0])[0] == 2.0
    ratio, low, high = ratio_bootstrap(*prompt_seconds(np.random.default_rng(1))[::-1])
    assert low <= ratio <= high
    with pytest.raises(ValueError, match="positive denominators"):
        ratio_bootstrap([1.0, 2.0], [1.0, 0.0])
