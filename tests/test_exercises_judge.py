"""Notebook 07's exercise checks: the classic bug of each fails its check with a message that names
it, and a correct answer (written here, and the chapter's own solution) passes."""
import nbformat
import numpy as np
import pytest

from lab.check import ExerciseError
from lab.check.judge import check_accuracy_interval, check_auc, check_forwards_per_answer
from lab.exercises import solution_cells
from lab.paths import INSTRUCTOR_DIR


def chapter_solutions() -> dict:
    namespace: dict = {}
    for cell in solution_cells(nbformat.read(INSTRUCTOR_DIR / "07_judge_decoding.ipynb", as_version=4)):
        exec(cell.source, namespace)
    return namespace


SOLUTIONS = chapter_solutions()


def test_the_chapter_has_three_exercises():
    assert {"target_forwards_per_answer", "accuracy_difference_interval", "score_auc"} <= set(SOLUTIONS)


# ---- (a) forwards per answer -----------------------------------------------------------------

def test_mean_length_over_mean_tau_fails_the_forwards_check():
    with pytest.raises(ExerciseError, match="mean length over the mean tau"):
        check_forwards_per_answer(lambda lengths, taus: np.mean(lengths) / np.mean(taus))


def test_counting_the_prefill_fails_the_forwards_check():
    with pytest.raises(ExerciseError, match="prefill"):
        check_forwards_per_answer(lambda lengths, taus: np.mean(np.array(lengths) / np.array(taus)) + 1)


def test_a_correct_forwards_per_answer_passes(capsys):
    check_forwards_per_answer(lambda lengths, taus: sum(n / t for n, t in zip(lengths, taus)) / len(lengths))
    check_forwards_per_answer(SOLUTIONS["target_forwards_per_answer"])
    assert "take 10.4 forwards" in capsys.readouterr().out


# ---- (b) the paired bootstrap ----------------------------------------------------------------

def unpaired(a, b, seed, draws=4000):
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a, float), np.asarray(b, float)
    first = rng.integers(0, len(a), size=(draws, len(a)))
    second = rng.integers(0, len(b), size=(draws, len(b)))  # the bug: each run resampled on its own
    return tuple(np.percentile(b[second].mean(1) - a[first].mean(1), [2.5, 97.5]))


def paired(a, b, seed, draws=4000):
    picks = np.random.default_rng(seed).integers(0, len(a), size=(draws, len(a)))
    return tuple(np.percentile((np.asarray(b, float) - np.asarray(a, float))[picks].mean(1), [2.5, 97.5]))


def test_resampling_the_two_runs_independently_fails_the_interval_check():
    with pytest.raises(ExerciseError, match="unpaired"):
        check_accuracy_interval(unpaired)


def test_the_unpaired_interval_is_caught_even_when_identical_runs_are_special_cased():
    def sly(a, b, seed, draws=4000):
        return (0.0, 0.0) if np.array_equal(a, b) else unpaired(a, b, seed, draws)
    with pytest.raises(ExerciseError, match="resampled independently"):
        check_accuracy_interval(sly)


def test_the_wrong_sign_an_unseeded_draw_or_a_normal_90_percent_interval_fail_the_interval_check():
    with pytest.raises(ExerciseError, match="mean\\(a\\) - mean\\(b\\)"):
        check_accuracy_interval(lambda a, b, seed, draws=4000: paired(b, a, seed, draws))
    with pytest.raises(ExerciseError, match="same seed"):
        check_accuracy_interval(lambda a, b, seed, draws=4000: paired(a, b, None, draws))

    def ninety(a, b, seed, draws=4000):
        d = np.asarray(b, float) - np.asarray(a, float)
        half = 1.645 * d.std() / len(d) ** 0.5
        return d.mean() - half, d.mean() + half
    with pytest.raises(ExerciseError, match="percentiles"):
        check_accuracy_interval(ninety)


def test_a_paired_bootstrap_passes_the_interval_check(capsys):
    check_accuracy_interval(paired)
    check_accuracy_interval(SOLUTIONS["accuracy_difference_interval"])
    assert "paired, reproducible" in capsys.readouterr().out


# ---- (c) the AUC -----------------------------------------------------------------------------

def test_inverted_labels_fail_the_auc_check():
    def inverted(scores, labels):
        pos, neg = scores[labels == 0], scores[labels == 1]
        return ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    with pytest.raises(ExerciseError, match="labels are inverted"):
        check_auc(inverted)


def test_ties_counted_wrong_fail_the_auc_check():
    def strict(scores, labels):  # a tie counts as a loss
        pos, neg = scores[labels == 1], scores[labels == 0]
        return (pos[:, None] > neg[None, :]).mean()
    with pytest.raises(ExerciseError, match="one half"):
        check_auc(strict)

    def argsort_ranks(scores, labels):  # Mann-Whitney with ordinal ranks: ties broken by position
        ranks = np.empty(len(scores))
        ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
        n_pos = int(labels.sum())
        return (ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * (len(labels) - n_pos))
    with pytest.raises(ExerciseError, match="tied"):
        check_auc(argsort_ranks)


def test_a_correct_auc_passes(capsys):
    from sklearn.metrics import roc_auc_score
    check_auc(lambda scores, labels: roc_auc_score(labels, scores))
    check_auc(SOLUTIONS["score_auc"])
    assert "score_auc: right" in capsys.readouterr().out
