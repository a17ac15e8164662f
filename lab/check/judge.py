"""Checks for notebook 07's exercises: target forwards per answer, a paired bootstrap interval on an
accuracy difference, and the ROC AUC of a score. Each compares the student's values with a reference
computed here independently (exactly where it can be), on seeded cases and on the edge cases the
classic bugs live in, and raises `ExerciseError` saying what went wrong and where to look."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy.stats import binom

from . import ExerciseError


# ---- (a) target forwards per answer ----------------------------------------------------------

def _forwards_reference(lengths: np.ndarray, taus: np.ndarray) -> float:
    """Each answer takes L_i / tau_i target forwards; the mean over answers."""
    return float(np.mean(lengths / taus))


def _forwards_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Answers of 1..24 tokens, each committed in 1..L forwards (so tau_i = L_i / F_i >= 1)."""
    n = int(rng.integers(3, 40))
    lengths = rng.integers(1, 25, size=n)
    forwards = np.array([rng.integers(1, length + 1) for length in lengths])
    return lengths.astype(float), lengths / forwards


def check_forwards_per_answer(fn: Callable, cases: int = 200, seed: int = 0) -> None:
    """`fn(lengths, taus)`: lengths[i] new tokens in answer i, taus[i] its tokens per target forward
    (prefill excluded); returns the mean number of target verification forwards per answer."""
    def call(lengths, taus) -> float:
        try:
            return float(fn(list(lengths), list(taus)))
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"target_forwards_per_answer must return one number, the mean over answers: "
                                f"{error}") from error

    # two answers: a short one the target writes token by token, a long one at tau 3
    lengths, taus = np.array([24.0, 6.0]), np.array([3.0, 1.0])
    want, got = _forwards_reference(lengths, taus), call(lengths, taus)
    if math.isclose(got, lengths.mean() / taus.mean(), rel_tol=1e-9):
        raise ExerciseError(f"lengths {lengths.tolist()}, taus {taus.tolist()}: you gave {got:g}, the mean length "
                            f"over the mean tau; the answers take 24/3 = 8 and 6/1 = 6 forwards, so {want:g}: tau "
                            "differs by answer, so divide each answer's length by its own tau, then average")
    if math.isclose(got, want + 1, rel_tol=1e-9):
        raise ExerciseError(f"you gave {got:g}, the reference {want:g}: one forward too many per answer. The prefill "
                            "forward over the prompt is not counted: tau counts verification forwards only")
    if math.isclose(got, float(np.mean(taus / lengths)), rel_tol=1e-9):
        raise ExerciseError(f"you gave {got:g}, the reference {want:g}: that is tau / L; an answer of L tokens at "
                            "tau tokens per forward takes L / tau forwards")
    if math.isclose(got, float((lengths / taus).sum()), rel_tol=1e-9):
        raise ExerciseError(f"you gave {got:g}, the total over both answers; return the mean per answer, {want:g}")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        lengths, taus = _forwards_case(rng)
        want, got = _forwards_reference(lengths, taus), call(lengths, taus)
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            raise ExerciseError(f"case {case} ({len(lengths)} answers): the reference gives {want:.4f} forwards per "
                                f"answer, you gave {got:.4f}; forwards of answer i = lengths[i] / taus[i]")
    # the chapter's point: a lossy rule with a higher tau but longer answers can still take more forwards
    sd, lossy = (np.full(50, 13.5), np.full(50, 1.30)), (np.full(50, 20.0), np.full(50, 1.70))
    per_answer = call(*sd), call(*lossy)
    print(f"target_forwards_per_answer: right on {cases} random tables and the edge cases; e.g. 13.5 tokens at "
          f"tau 1.30 take {per_answer[0]:.1f} forwards, 20 tokens at tau 1.70 take {per_answer[1]:.1f}")


# ---- (b) a paired bootstrap interval on an accuracy difference ------------------------------

def _quantile(values: np.ndarray, probabilities: np.ndarray, q: float) -> float:
    """The q-quantile of a discrete distribution (values sorted ascending)."""
    return float(values[np.searchsorted(np.cumsum(probabilities), q - 1e-12)])


def _exact_paired(a: np.ndarray, b: np.ndarray, level: float) -> tuple[float, float]:
    """The bootstrap distribution of mean(b - a), resampling questions with replacement, computed exactly:
    d = b - a takes +1, -1 or 0, so a resample's difference is (N+ - N-) / n, N+ ~ Binomial(n, P(d = +1))
    and, given N+, N- ~ Binomial(n - N+, P(d = -1) / P(d != +1)). Its (1 -+ level) / 2 quantiles."""
    n, d = len(a), b - a
    p_up, p_down = float(np.mean(d > 0)), float(np.mean(d < 0))
    total = np.zeros(2 * n + 1)  # index: N+ - N- + n
    for up, weight in enumerate(binom.pmf(np.arange(n + 1), n, p_up)):
        if weight > 0:
            downs = np.arange(n - up + 1)
            conditional = binom.pmf(downs, n - up, p_down / (1 - p_up)) if p_up < 1 else (downs == 0).astype(float)
            total[up - downs + n] += weight * conditional
    values = (np.arange(2 * n + 1) - n) / n
    tail = (1 - level) / 2
    return _quantile(values, total / total.sum(), tail), _quantile(values, total / total.sum(), 1 - tail)


def _exact_unpaired(a: np.ndarray, b: np.ndarray, level: float) -> tuple[float, float]:
    """The same with a and b resampled independently (the classic bug): (N_b - N_a) / n, two binomials."""
    n, k = len(a), np.arange(len(a) + 1)
    difference = np.convolve(binom.pmf(k, n, float(np.mean(b))), binom.pmf(k, n, float(np.mean(a)))[::-1])
    values = (np.arange(2 * n + 1) - n) / n  # np.convolve's index i is N_b - N_a + n
    tail = (1 - level) / 2
    return _quantile(values, difference / difference.sum(), tail), _quantile(values, difference / difference.sum(),
                                                                               1 - tail)


def _correlated(rng: np.random.Generator, n: int, accuracy: float, agree: float, shift: float = 0.0):
    """Two 0/1 arrays over the same n questions: b equals a except on about 1 - agree of them."""
    a = (rng.random(n) < accuracy).astype(float)
    b = a.copy()
    flip = rng.random(n) > agree
    b[flip] = (rng.random(int(flip.sum())) < accuracy + shift).astype(float)
    return a, b


def check_accuracy_interval(fn: Callable, seed: int = 0) -> None:
    """`fn(a, b, seed, draws=4000, level=0.95)`: a, b per-question 0/1 verdicts of two runs on the same
    questions; returns the percentile interval (low, high) of mean(b) - mean(a) from `draws` resamples of
    the questions with replacement, a and b together (paired), reproducible for a fixed seed."""
    def call(a, b, s) -> tuple[float, float]:
        out = fn(np.array(a), np.array(b), s)
        try:
            low, high = (float(x) for x in out)
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"return two numbers, (low, high); got {out!r}") from error
        if not low <= high:
            raise ExerciseError(f"got low {low:.3f} above high {high:.3f}")
        return low, high

    rng = np.random.default_rng(seed)
    a = (rng.random(80) < 0.7).astype(float)
    same = call(a, a.copy(), 0)
    if max(abs(same[0]), abs(same[1])) > 1e-9:
        raise ExerciseError(f"two identical runs gave ({same[0]:+.3f}, {same[1]:+.3f}); paired, every resample "
                            "differs by exactly 0, so the interval is (0, 0). You resampled a and b independently "
                            "(unpaired): draw ONE set of question indices per resample and use it for both arrays")
    a, b = _correlated(rng, 102, 0.6, 0.5, shift=0.2)
    try:  # few draws, so that unseeded intervals would differ
        few = [fn(a.copy(), b.copy(), 1, draws=101) for _ in range(4)]
    except TypeError as error:
        raise ExerciseError(f"keep the signature (a, b, seed, draws=4000, level=0.95): {error}") from error
    if any(not np.allclose(np.asarray(x, dtype=float), np.asarray(few[0], dtype=float)) for x in few):
        raise ExerciseError("the same seed gave different intervals: draw every resample from "
                            "np.random.default_rng(seed), and nothing from the global random state")
    # runs that agree on most questions (where pairing matters), then a large, noisy one (where a wrong level shows)
    shown = None
    for case, (n, accuracy, agree, shift) in enumerate([(102, 0.7, 0.94, -0.1), (102, 0.55, 0.85, 0.15),
                                                          (150, 0.6, 0.9, 0.0), (600, 0.5, 0.4, 0.0)]):
        a, b = _correlated(rng, n, accuracy, agree, shift)
        paired, unpaired = _exact_paired(a, b, 0.95), _exact_unpaired(a, b, 0.95)
        got = call(a, b, 7 + case)
        tolerance = 1.5 / n + 0.003  # the bootstrap's values lie on a grid of 1/n; a few thousand draws
        shown = shown or (paired, unpaired)
        where = (f"case {case} ({n} questions, mean(b) - mean(a) = {b.mean() - a.mean():+.3f}, the two runs "
                 f"disagree on {int((a != b).sum())})")
        if all(abs(g + w) <= tolerance for g, w in zip(got, paired[::-1])) and abs(paired[0] + paired[1]) > tolerance:
            raise ExerciseError(f"{where}: you gave ({got[0]:+.3f}, {got[1]:+.3f}), the interval of mean(a) - "
                                f"mean(b); the difference asked for is mean(b) - mean(a): "
                                f"({paired[0]:+.3f}, {paired[1]:+.3f})")
        if all(abs(g - w) <= tolerance for g, w in zip(got, unpaired)):
            raise ExerciseError(f"{where}: you gave ({got[0]:+.3f}, {got[1]:+.3f}), the unpaired interval: a and b "
                                f"were resampled independently. Paired it is ({paired[0]:+.3f}, {paired[1]:+.3f}), "
                                "narrower, because the runs agree on most questions: resample question indices once "
                                "and take both arrays at them")
        if any(abs(g - w) > tolerance for g, w in zip(got, paired)):
            raise ExerciseError(f"{where}: you gave ({got[0]:+.3f}, {got[1]:+.3f}); the paired bootstrap's 2.5th and "
                                f"97.5th percentiles are ({paired[0]:+.3f}, {paired[1]:+.3f}) (to {tolerance:.3f}). "
                                "Resample all n questions with replacement, a few thousand times, and take the "
                                "percentiles of mean(b[idx]) - mean(a[idx])")
    paired, unpaired = shown
    print(f"accuracy_difference_interval: paired, reproducible and on the exact bootstrap quantiles; on the first "
          f"case the unpaired interval would be {unpaired[1] - unpaired[0]:.3f} wide, the paired one "
          f"{paired[1] - paired[0]:.3f}")


# ---- (c) the ROC AUC of a score --------------------------------------------------------------

def _auc_reference(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(a correct token scores above a wrong one), a tie counting one half, over every pair."""
    positive, negative = scores[labels == 1], scores[labels == 0]
    above = (positive[:, None] > negative[None, :]).mean()
    tied = (positive[:, None] == negative[None, :]).mean()
    return float(above + 0.5 * tied)


def check_auc(fn: Callable, cases: int = 100, seed: int = 0) -> None:
    """`fn(scores, labels)`: labels 1 for a correct (harmless) token, 0 for a wrong one; a higher score
    should mean more likely correct. Returns the ROC AUC, ties counted one half."""
    def call(scores, labels) -> float:
        try:
            return float(fn(np.array(scores, dtype=float), np.array(labels, dtype=int)))
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"return one number, the AUC: {error}") from error

    rng = np.random.default_rng(seed)
    # the wrong tokens score low: AUC well above one half
    labels = np.array([1] * 30 + [0] * 10)
    scores = np.concatenate([rng.normal(1.0, 1.0, 30), rng.normal(-0.5, 1.0, 10)])
    want, got = _auc_reference(scores, labels), call(scores, labels)
    if math.isclose(got, 1 - want, abs_tol=1e-9):
        raise ExerciseError(f"you gave {got:.3f}, the reference {want:.3f}: the labels are inverted. Label 1 marks a "
                            "correct token, the class a good score puts high; AUC = P(score of a label-1 token > "
                            "score of a label-0 token)")
    tied = np.full(12, 0.25)
    got = call(tied, [1, 0] * 6)
    if not math.isclose(got, 0.5, abs_tol=1e-9):
        raise ExerciseError(f"every score equal gave {got:.3f}; a score that cannot tell the classes apart has AUC "
                            "0.5: count a tied (correct, wrong) pair as one half")
    for case in range(cases):
        n = int(rng.integers(4, 300))
        labels = (rng.random(n) < rng.uniform(0.1, 0.9)).astype(int)
        labels[:2] = [1, 0]
        if case % 2:  # probabilities rounded as a log would print them: many ties
            scores = np.round(rng.beta(2, 1, n) * (0.6 + 0.4 * labels), 1)
        else:
            scores = rng.normal(labels * rng.uniform(0, 2), 1.0)
        want, got = _auc_reference(scores, labels), call(scores, labels)
        if not math.isclose(got, want, abs_tol=1e-6):
            ties = int((scores[labels == 1][:, None] == scores[labels == 0][None, :]).sum())
            hint = (f"it has {ties} tied (correct, wrong) pairs: each counts one half (average ranks, not "
                    "argsort's)" if ties else "AUC = P(score of a label-1 token > score of a label-0 token)")
            raise ExerciseError(f"case {case} ({int(labels.sum())} correct, {int((1 - labels).sum())} wrong tokens): "
                                f"the reference gives {want:.4f}, you gave {got:.4f}; {hint}")
    print(f"score_auc: right on {cases} random cases (half of them with tied scores), all-tied scores and the labels' "
          "direction")
