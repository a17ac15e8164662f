"""The checks of notebooks 04 and 05 (lab/check/eagle.py): a correct answer passes, and the classic
wrong answers fail with a message that names the mistake."""
import pytest
import torch

from lab.check import ExerciseError
from lab.check.eagle import check_depth_rates, check_kept_nodes


# ---- notebook 04: top-1 by depth against n-alpha -------------------------------------------

def depth_rates(right):
    right = torch.as_tensor(right, dtype=torch.bool)
    survived = torch.cumprod(right.long(), dim=1).bool()
    chains = right.shape[0]
    n_alpha = []
    for d in range(right.shape[1]):
        given = chains if d == 0 else int(survived[:, d - 1].sum())
        n_alpha.append(int(survived[:, d].sum()) / given if given else None)
    return {"top1": right.double().mean(0).tolist(), "chain": survived.double().mean(0).tolist(), "n_alpha": n_alpha}


def test_a_correct_depth_rates_passes():
    check_depth_rates(depth_rates)


def test_top1_by_depth_taken_for_n_alpha_fails():
    def unconditional(right):
        out = depth_rates(right)
        return {**out, "n_alpha": out["top1"]}  # the common error: no conditioning on earlier depths
    with pytest.raises(ExerciseError, match="top-1 at depth d over all chains"):
        check_depth_rates(unconditional)


def test_chain_acceptance_taken_for_n_alpha_fails():
    def chain_as_n_alpha(right):
        out = depth_rates(right)
        return {**out, "n_alpha": out["chain"]}
    with pytest.raises(ExerciseError, match="that is chain acceptance"):
        check_depth_rates(chain_as_n_alpha)


def test_zero_where_no_chain_survived_fails():
    def zero_not_none(right):
        out = depth_rates(right)
        return {**out, "n_alpha": [0.0 if a is None else a for a in out["n_alpha"]]}
    with pytest.raises(ExerciseError, match="not measured: return None"):
        check_depth_rates(zero_not_none)

    def divides(right):
        right = torch.as_tensor(right, dtype=torch.bool)
        survived = torch.cumprod(right.long(), dim=1)
        out = depth_rates(right)
        n_alpha = [float(survived[:, d].sum()) / (int(survived[:, d - 1].sum()) if d else len(right))
                   for d in range(right.shape[1])]  # python raises on 0 / 0
        return {**out, "n_alpha": n_alpha}
    with pytest.raises(ExerciseError, match="division by zero"):
        check_depth_rates(divides)


def test_chain_as_top1_fails():
    def chain_is_top1(right):
        out = depth_rates(right)
        return {**out, "chain": out["top1"]}
    with pytest.raises(ExerciseError, match="needs every depth 1..d right"):
        check_depth_rates(chain_is_top1)


# ---- notebook 05: the nodes EAGLE-2's reranking keeps ---------------------------------------

def path_values(parents, confidences, combine):
    out = []
    for i, parent in enumerate(parents):
        out.append(1.0 if parent < 0 else combine(out[parent], confidences[i]))
    return out


def keep_by(score, total_tokens):
    return [0] + sorted(sorted(range(1, len(score)), key=lambda i: -score[i])[: total_tokens - 1])


def test_a_correct_reranking_passes():
    check_kept_nodes(lambda parents, conf, total: keep_by(path_values(parents, conf, lambda a, b: a * b), total))


def test_ranking_by_the_node_s_own_confidence_fails():
    with pytest.raises(ExerciseError, match="its own confidence"):
        check_kept_nodes(lambda parents, conf, total: keep_by(conf, total))


def test_ranking_by_the_sum_of_confidences_fails():
    with pytest.raises(ExerciseError, match="SUM of the confidences"):
        check_kept_nodes(lambda parents, conf, total: keep_by(path_values(parents, conf, lambda a, b: a + b), total))


def test_forgetting_that_the_root_counts_fails():
    def one_too_many(parents, conf, total):
        return keep_by(path_values(parents, conf, lambda a, b: a * b), total + 1)
    with pytest.raises(ExerciseError, match="the root counts as one of"):
        check_kept_nodes(one_too_many)
