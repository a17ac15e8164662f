"""Reference verification: edge cases, and statistical losslessness (which a deliberately
wrong variant, defined below, must fail)."""
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lab.sampling import Sampling, probabilities
from lab.simulate import simulate_chain
from lab.verify.lossless import race, verify_chain, verify_chain_greedy


def onehot(i, v=5):
    return torch.nn.functional.one_hot(torch.tensor(i), v).float()


def test_greedy_chain_accepts_prefix_then_corrects():
    assert verify_chain_greedy([3, 4, 9], [3, 4, 5, 6]).tokens == [3, 4, 5]
    assert verify_chain_greedy([3, 4], [3, 4, 7]).tokens == [3, 4, 7]  # all pass: bonus
    assert verify_chain_greedy([], [8]).tokens == [8]                  # K = 0 is AR
    assert verify_chain_greedy([1], [2, 3]).n_accepted == 0


def test_draft_with_zero_draft_probability_is_rejected_even_with_u_zero():
    p = torch.tensor([[0.5, 0.5, 0, 0, 0], [0.2] * 5])
    q = torch.tensor([[0.0, 1.0, 0, 0, 0]])
    r = verify_chain([0], q, p, torch.zeros(1), torch.ones(5))
    assert r.n_accepted == 0


def test_strict_comparison_never_accepts_zero_target_probability():
    p = torch.tensor([[0.0, 1.0, 0, 0, 0], [0.2] * 5])
    r = verify_chain([0], torch.tensor([[1.0, 0, 0, 0, 0]]), p, torch.zeros(1), torch.ones(5))
    assert r.n_accepted == 0 and r.tokens == [1]


def test_all_zero_residual_falls_back_to_p():
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0], [0.2] * 5])
    # u = 1 is an explicit input that forces the rejection branch although p == q
    r = verify_chain([3], p[:1].clone(), p, torch.ones(1), torch.tensor([1.0, 1.0, 1.0, 0.5, 1.0]))
    assert r.n_accepted == 0 and r.tokens == [3]  # raced over p itself: 0.4/0.5 wins


def test_one_hot_drafts_zero_the_draft_token_in_the_residual():
    p = torch.tensor([[0.6, 0.4, 0, 0, 0], [0.2] * 5])
    r = verify_chain([0], None, p, torch.tensor([0.7]), torch.ones(5))
    assert r.tokens == [1]


def test_bonus_after_full_acceptance_uses_last_row():
    p = torch.stack([onehot(1), onehot(2), onehot(4)])
    r = verify_chain([1, 2], torch.stack([onehot(1), onehot(2)]), p, torch.full((2,), 0.5), torch.ones(5))
    assert r.tokens == [1, 2, 4] and r.n_accepted == 2


def test_race_ties_go_to_lowest_id():
    assert race(torch.tensor([0.0, 0.5, 0.5]), torch.ones(3)) == 1


def test_nan_rows_raise_a_clear_error():
    p = torch.tensor([[float("nan")] * 5, [0.2] * 5])
    with pytest.raises(ValueError, match="NaN"):
        verify_chain([0], None, p, torch.zeros(1), torch.ones(5))
    with pytest.raises(ValueError, match="NaN"):
        probabilities(torch.tensor([float("nan"), 1.0]), Sampling(1.0))


def test_sampling_is_applied_identically_and_top_p_keeps_the_crossing_token():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    p = probabilities(logits, Sampling(1.0, top_p=0.8))
    full = torch.softmax(logits, -1)
    assert full[0] < 0.8 and p[0] > 0 and p[1] > 0 and p[2] == 0 and p[3] == 0
    assert torch.allclose(p.sum(), torch.tensor(1.0))
    assert probabilities(logits, Sampling(1.0, top_k=1))[0] == 1.0
    assert probabilities(logits, Sampling(0.0)).tolist() == [1.0, 0, 0, 0]


# ---- statistical losslessness -------------------------------------------------------------

def wrong_residual_verify_chain(draft, q, p, uniforms, noise):
    """A classic bug: on rejection, sample from p instead of the residual max(0, p - q)."""
    for i, x in enumerate(draft):
        if q[i, x] > 0 and uniforms[i] * q[i, x] < p[i, x]:
            continue
        return type(verify_chain(draft, q, p, uniforms, noise))(i, list(draft[:i]) + [race(p[i], noise)])
    return verify_chain(draft, q, p, uniforms, noise)


def chi2_pvalue(counts, probs):
    probs = np.asarray(probs, dtype=np.float64)
    keep = probs > 0
    if counts[~keep].sum() > 0:
        return 0.0  # a token of zero target probability was emitted: impossible if lossless
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return chisquare(counts[keep], expected).pvalue


CASES = {
    "T=1.0": Sampling(1.0),
    "T=0.7": Sampling(0.7),
    "T=1.0,top-p=0.8": Sampling(1.0, top_p=0.8),
}


def synthetic(s: Sampling):
    g = torch.Generator().manual_seed(1)
    target_logits = torch.randn(3, 6, generator=g) * 1.5
    draft_logits = target_logits[:2] + torch.randn(2, 6, generator=g)  # a related but different draft
    return probabilities(target_logits, s), probabilities(draft_logits, s)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_chain_verification_is_lossless(case):
    p, q = synthetic(CASES[case])
    sim = simulate_chain(p, q, 20_000, seed=7)
    first, second = sim.first, sim.second
    assert chi2_pvalue(first, p[0].numpy()) > 1e-3
    assert chi2_pvalue(second, p[1].numpy()) > 1e-3
    tv = 0.5 * np.abs(first / first.sum() - p[0].numpy()).sum()
    assert tv < 0.015


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_statistical_check_catches_a_wrong_residual(case):
    p, q = synthetic(CASES[case])
    first = simulate_chain(p, q, 20_000, seed=7, verify=wrong_residual_verify_chain).first
    assert chi2_pvalue(first, p[0].numpy()) < 1e-6


@pytest.mark.slow
def test_tokens_per_cycle_match_the_iid_formula():
    from lab.theory import acceptance_rate, expected_tokens
    s = Sampling(1.0)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, generator=g)
    p = probabilities(logits, s).repeat(4, 1)                        # same row at every position
    q = probabilities(logits + torch.randn(6, generator=g), s).repeat(3, 1)
    alpha = float(acceptance_rate(p[0], q[0]))
    sim = simulate_chain(p, q, 20_000, seed=11)
    stderr = sim.tokens_per_cycle.std() / np.sqrt(len(sim.tokens_per_cycle))
    assert abs(sim.tokens_per_cycle.mean() - expected_tokens(alpha, 3)) < 4 * stderr


def test_argmax_rows_and_top2_gaps_follow_torch_with_ties():
    """numpy stands in for torch's argmax and top-2 on the CPU: the first maximum wins a tie,
    and the gaps are topk's, 0 for a tie."""
    from lab.decode import top2_gaps
    from lab.verify.lossless import argmax_rows
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 49152, generator=g)
    x[1, 7] = x[1, 3000] = x[1].max() + 1.0  # a tie: the first index wins
    x[2, :] = 0.0
    assert argmax_rows(x) == x.argmax(-1).tolist() and argmax_rows(x)[1] == 7 and argmax_rows(x)[2] == 0
    top2 = torch.topk(x, 2, dim=-1).values
    assert top2_gaps(x) == (top2[:, 0] - top2[:, 1]).tolist() and top2_gaps(x)[1] == 0.0
