"""Draft trees: EAGLE-2 construction invariants, masks, and tree decoding equal to AR."""
import pytest
import torch
from test_decode import prompts

from lab.decode import decode
from lab.drafters import NoDraft, TreeModelDraft
from lab.sampling import Sampling
from lab.target.engine import Engine
from lab.target.load import make_draft
from lab.trees import DraftTree, dynamic_tree, top_children


def random_expand(vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)

    def expand(tree, frontier, k):
        return top_children(torch.log_softmax(torch.randn(len(frontier), vocab, generator=g) * 2, -1), k)
    return expand


@pytest.mark.parametrize("depth,top_k,total", [(4, 3, 10), (6, 4, 25), (3, 2, 100), (5, 5, 1)])
def test_dynamic_tree_invariants(depth, top_k, total):
    tree = dynamic_tree(7, random_expand(seed=depth), depth, top_k, total)
    assert len(tree) <= total and tree.tokens[0] == 7 and tree.parents[0] == -1
    assert all(0 <= p < i for i, p in enumerate(tree.parents) if i > 0)          # parents first
    assert max(tree.depths()) <= depth
    for i in range(1, len(tree)):                                                 # values fall along paths
        assert tree.values[i] <= tree.values[tree.parents[i]] + 1e-12
    siblings = {}
    for i in range(1, len(tree)):
        siblings.setdefault(tree.parents[i], []).append(tree.tokens[i])
    assert all(len(s) == len(set(s)) for s in siblings.values())                 # distinct children


def test_reranking_keeps_the_best_nodes():
    full = dynamic_tree(7, random_expand(seed=1), 4, 3, 10_000)
    kept = dynamic_tree(7, random_expand(seed=1), 4, 3, 8)
    assert sorted(kept.values[1:], reverse=True) == sorted(full.values[1:], reverse=True)[:7]


def test_ancestor_mask_and_positions():
    tree = DraftTree([5, 6, 7, 8], [-1, 0, 0, 1])
    assert tree.ancestor_mask().int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert tree.positions(10).tolist() == [10, 11, 11, 12]
    assert tree.path_to(3) == [0, 1, 3]


def test_tree_speculative_decoding_equals_ar(tiny, tokenizer):
    target = Engine(tiny)
    drafter = TreeModelDraft(make_draft(tiny, 1), depth=3, top_k=3, total_tokens=8)
    for prompt in prompts(tokenizer, 20):
        ar = decode(target, NoDraft(), prompt, 24, Sampling(), 0, 0, tokenizer.eos_token_id)
        tree = decode(target, drafter, prompt, 24, Sampling(), 3, 0, tokenizer.eos_token_id)
        assert tree.tokens == ar.tokens and tree.cycles <= ar.cycles


@pytest.mark.slow
def test_tree_speculative_decoding_equals_ar_real(target, tokenizer, real_ar):
    from lab.target.load import load_draft
    engine = Engine(target)
    drafter = TreeModelDraft(load_draft(target, 1), depth=4, top_k=3, total_tokens=12)
    for prompt, ar in real_ar(5, 32):
        tree = decode(engine, drafter, prompt, 32, Sampling(), 4, 0, tokenizer.eos_token_id)
        assert tree.tokens == ar and tree.cycles < len(ar)  # AR takes one forward per token


def test_tree_decoding_with_the_triton_kernel_matches_the_reference(tiny, tokenizer):
    prompt = prompts(tokenizer, 1)[0]
    drafter = TreeModelDraft(make_draft(tiny, 1), depth=2, top_k=2, total_tokens=5)
    for s in (Sampling(), Sampling(1.0, top_k=50)):
        runs = [decode(Engine(tiny), drafter, prompt, 6, s, 2, seed=3, eos_id=None, kernel=k)
                for k in ("torch", "triton")]
        assert runs[0].tokens == runs[1].tokens
