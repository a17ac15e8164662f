"""Leviathan et al.'s closed forms: the paper's Table 1 values, Corollary 3.9's condition and
the price of a verification forward that is not free."""
import pytest

from lab.theory import PAPER_TABLE_1, expected_tokens, operations_factor, optimal_gamma, walltime_improvement


@pytest.mark.parametrize("alpha,gamma", list(PAPER_TABLE_1))
def test_speedup_at_zero_cost_matches_the_paper(alpha, gamma):
    assert round(walltime_improvement(alpha, gamma, 0.0), 2) == PAPER_TABLE_1[alpha, gamma]


def test_no_gamma_helps_when_alpha_is_below_c():
    """Corollary 3.9: some gamma > 0 helps iff alpha > c."""
    assert optimal_gamma(0.3, 0.35) == 0
    assert optimal_gamma(0.4, 0.35) > 0


def test_a_verification_forward_that_costs_more_lowers_the_best_gamma():
    free = optimal_gamma(0.8, 0.05)
    priced = optimal_gamma(0.8, 0.05, verify=lambda g: 1 + 0.1 * g)  # T(g+1)/T(1) rising with g
    assert priced < free
    assert walltime_improvement(0.8, 4, 0.05, verify=1.5) == pytest.approx(expected_tokens(0.8, 4) / 1.7)


def test_operations_factor_is_one_without_drafts_and_grows_with_rejections():
    assert operations_factor(0.5, 0, 0.1) == pytest.approx(1.0)
    assert operations_factor(0.5, 4, 0.0) > operations_factor(0.9, 4, 0.0) > 1.0
