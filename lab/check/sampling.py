"""Checks for notebook 02's closed-form exercises: the expected tokens per cycle of a chain with γ
drafts under i.i.d. acceptance α, and the best γ by Leviathan et al.'s walltime formula. Each
compares the student's values with a reference computed here (a plain sum, a brute-force search),
on seeded random cases and on the edge cases where the classic bugs live (α = 1, γ = 0, α ≤ c,
ties), and raises `ExerciseError` saying what went wrong; on success it prints one line."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import ExerciseError


def _tokens(alpha: float, gamma: int) -> float:
    """1 + alpha + ... + alpha^gamma: the first emitted token always, draft i with probability alpha^i."""
    return float(sum(alpha ** i for i in range(gamma + 1)))


def check_tokens_per_cycle(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(alpha, gamma)` must return the expected tokens one cycle with gamma drafts emits when each
    draft is accepted independently with probability alpha: (1 - alpha^(gamma+1)) / (1 - alpha), and
    its limit gamma + 1 at alpha = 1 (notebook 02)."""
    rng = np.random.default_rng(seed)
    edge = [(0.8, 5), (0.5, 1), (1.0, 4), (0.0, 3), (0.7, 0), (1.0, 0), (1 - 1e-9, 6), (0.999, 20)]
    edge += [(float(rng.uniform(0, 1)), int(rng.integers(0, 25))) for _ in range(cases)]
    for alpha, gamma in edge:
        want = _tokens(alpha, gamma)
        try:
            got = float(fn(alpha, gamma))
        except ZeroDivisionError as error:
            raise ExerciseError(f"alpha = {alpha}, gamma = {gamma}: division by zero. At alpha = 1 the closed form "
                                "is 0/0; every draft is accepted, so the cycle emits all gamma drafts plus the bonus "
                                "token: return the limit gamma + 1") from error
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"alpha = {alpha}, gamma = {gamma}: raised {type(error).__name__}: {error}") \
                from error
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        guesses = [
            (_tokens(alpha, gamma) - alpha ** gamma if gamma else 0.0,
             "one token short: besides the accepted drafts the cycle always emits one more token (the residual "
             "sample after a rejection, or the bonus token after gamma acceptances): "
             "(1 - alpha^(gamma+1))/(1 - alpha)"),
            (1 + gamma * alpha, "draft i counts only if drafts 1..i-1 were accepted too: its probability is alpha^i, "
                                "not alpha"),
            (gamma * alpha, "the expected accepted drafts are not all: add the one corrected or bonus token, and "
                            "draft i needs all earlier drafts accepted (probability alpha^i)"),
            (_tokens(alpha, gamma) - 1, "the corrected or bonus token is missing: a cycle emits at least 1 token"),
        ]
        why = next((w for v, w in guesses if math.isclose(got, v, rel_tol=1e-6)),
                   "1 + alpha + alpha^2 + ... + alpha^gamma" + (" (at alpha = 1 that is gamma + 1: a value of nan "
                                                               "or inf means 0/0 was computed)"
                                                               if alpha == 1 else ""))
        raise ExerciseError(f"alpha = {alpha}, gamma = {gamma}: got {got:.6g}, want {want:.6g}; {why}")
    print(f"tokens_per_cycle: right at alpha = 1 (gamma + 1), alpha = 0, gamma = 0 and on {cases} random cases")


def _speedup(alpha: float, gamma: int, c: float) -> float:
    return _tokens(alpha, gamma) / (gamma * c + 1)


def _best(alpha: float, c: float, max_gamma: int) -> int:
    """The smallest gamma in 0..max_gamma with the largest speed-up (a plain scan, first maximum wins)."""
    best, value = 0, _speedup(alpha, 0, c)
    for gamma in range(1, max_gamma + 1):
        v = _speedup(alpha, gamma, c)
        if v > value:
            best, value = gamma, v
    return best


def check_best_gamma(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(alpha, c, max_gamma)` must return the gamma in 0..max_gamma with the largest speed-up
    E(alpha, gamma) / (gamma c + 1), the smaller gamma on a tie; 0 (plain decoding) when no gamma >= 1
    beats it (notebook 02)."""
    edge = [((0.8, 0.05, 20), "the figure's alpha = 0.8, c = 0.05"),
            ((0.2, 0.25, 20), "alpha < c: no gamma >= 1 beats plain decoding, so gamma = 0"),
            ((0.0, 0.0, 10), "alpha = 0: every gamma gives exactly 1; a tie goes to the smallest, 0"),
            ((1.0, 0.0, 12), "alpha = 1 and a free draft: the longest chain allowed"),
            ((0.9, 0.05, 5), "the best gamma is capped at max_gamma"),
            ((0.6, 0.05, 20), "alpha = 0.6, c = 0.05")]
    rng = np.random.default_rng(seed)
    edge += [((float(rng.uniform(0, 1)), float(rng.uniform(0, 0.5)), int(rng.integers(1, 30))), "")
             for _ in range(cases)]
    for (alpha, c, max_gamma), why in edge:
        want = _best(alpha, c, max_gamma)
        try:
            got = fn(alpha, c, max_gamma)
        except ZeroDivisionError as error:
            raise ExerciseError(f"alpha = {alpha}, c = {c}: division by zero (alpha = 1 makes the closed form of "
                                "the expected tokens 0/0; its limit is gamma + 1)") from error
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"alpha = {alpha}, c = {c}, max_gamma = {max_gamma}: raised "
                                f"{type(error).__name__}: {error}") from error
        if got == want:
            continue
        if not why and isinstance(got, (int, np.integer)) and 0 <= got <= max_gamma and math.isclose(
                _speedup(alpha, int(got), c), _speedup(alpha, want, c), rel_tol=1e-12):
            continue  # a tie up to rounding: either gamma is right
        hint = why or "scan gamma = 0..max_gamma and keep the first maximum of E(alpha, gamma) / (gamma c + 1)"
        if want == 0 and isinstance(got, (int, np.integer)) and got >= 1 and not why:
            hint = "no gamma >= 1 beats plain decoding here: start the search at gamma = 0"
        detail = ""
        if isinstance(got, (int, np.integer)) and 0 <= got <= max_gamma:
            detail = (f" (speed-up {_speedup(alpha, int(got), c):.4f} at yours, "
                      f"{_speedup(alpha, want, c):.4f} at {want})")
        raise ExerciseError(f"alpha = {alpha:.4g}, c = {c:.4g}, max_gamma = {max_gamma}: got {got}, want "
                            f"{want}{detail}; {hint}")
    print(f"best_gamma: right on the edge cases (alpha <= c gives 0, ties go to the smaller gamma) and {cases} "
          "random cases")
