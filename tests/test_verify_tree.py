"""Tree verification (EAGLE's rule for deterministic top-k children): edge cases, and
statistical losslessness, which a deliberately wrong variant (no renormalisation after a
rejected sibling) must fail."""
import pytest
import torch
from test_verify import chi2_pvalue

from lab.sampling import Sampling, probabilities
from lab.simulate import simulate_tree
from lab.verify.lossless import TreeResult, children_of, race, verify_tree, verify_tree_greedy

# root 0 -> children 1, 2, 3 (tokens 0, 1, 2); node 1 -> 4, 5 (tokens 3, 0); node 2 -> 6 (token 4)
TOKENS = [9, 0, 1, 2, 3, 0, 4]
PARENTS = [-1, 0, 0, 0, 1, 1, 2]


def test_children_in_node_order():
    assert children_of(PARENTS) == [[1, 2, 3], [4, 5], [6], [], [], [], []]


def test_greedy_tree_follows_the_argmax_path():
    argmax = [1, 7, 4, 0, 0, 0, 5]   # root wants token 1 (node 2), node 2 wants 4 (node 6), then 5
    assert verify_tree_greedy(TOKENS, PARENTS, argmax) == TreeResult([0, 2, 6], [1, 4, 5])
    assert verify_tree_greedy(TOKENS, PARENTS, [8] * 7).tokens == [8]


def test_all_children_rejected_draws_from_what_is_left():
    p = torch.zeros(7, 6)
    p[0] = torch.tensor([0.3, 0.3, 0.3, 0.0, 0.0, 0.1])
    r = verify_tree(TOKENS, PARENTS, p, torch.ones(7), torch.ones(6))  # u = 1 rejects everything
    assert r.path == [0] and r.tokens == [5]                            # only token 5 is left


def test_accepted_leaf_gets_a_bonus_from_its_own_row():
    p = torch.full((7, 6), 1 / 6)
    p[6] = torch.tensor([0, 0, 0, 0, 0, 1.0])
    r = verify_tree(TOKENS, PARENTS, p, torch.tensor([0, 1, 0, 1, 1, 1, 0.0]), torch.ones(6))
    assert r.path == [0, 2, 6] and r.tokens == [1, 4, 5]


def test_nan_is_an_error():
    with pytest.raises(ValueError, match="NaN"):
        verify_tree(TOKENS, PARENTS, torch.full((7, 6), float("nan")), torch.zeros(7), torch.ones(6))


def no_renormalisation(tokens, parents, p, uniforms, noise):
    """Wrong: accepts child x with probability p(x) even after siblings were rejected."""
    children, node, path = children_of(parents), 0, [0]
    while children[node]:
        remaining = p[node].clone()
        for child in children[node]:
            if uniforms[child] < remaining[tokens[child]]:
                node = child
                path.append(node)
                break
            remaining[tokens[child]] = 0.0
        else:
            return TreeResult(path, [tokens[i] for i in path[1:]] + [race(remaining, noise)])
    return TreeResult(path, [tokens[i] for i in path[1:]] + [race(p[node], noise)])


def tree_distributions(s: Sampling):
    """Context-free target rows (one per depth) and a tree of the same shape as TOKENS whose
    children are the top-k tokens of a noisy draft of those rows, as an EAGLE drafter's are."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 6, generator=g) * 1.5
    by_depth = probabilities(logits, s)
    draft_rank = torch.argsort(logits + torch.randn(3, 6, generator=g), dim=-1, descending=True)
    tokens = [9] + draft_rank[0, :3].tolist() + draft_rank[1, :2].tolist() + draft_rank[1, :1].tolist()
    depth = [0, 1, 1, 1, 2, 2, 2]
    return by_depth, by_depth[depth], tokens


@pytest.mark.slow
@pytest.mark.parametrize("s", [Sampling(1.0), Sampling(0.7), Sampling(1.0, top_p=0.8)], ids=str)
def test_tree_verification_is_lossless_and_the_check_can_fail(s):
    by_depth, p, tokens = tree_distributions(s)
    sim = simulate_tree(tokens, PARENTS, p, 20_000, seed=3)
    assert chi2_pvalue(sim.first, by_depth[0].numpy()) > 1e-3
    assert chi2_pvalue(sim.second, by_depth[1].numpy()) > 1e-3
    wrong = simulate_tree(tokens, PARENTS, p, 20_000, seed=3, verify=no_renormalisation)
    assert chi2_pvalue(wrong.first, by_depth[0].numpy()) < 1e-6
