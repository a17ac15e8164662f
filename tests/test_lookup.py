"""Prompt lookup (lab/drafters/lookup.py): what it matches, the tree it builds, and decoding
with it equal to AR on the real target."""
import pytest
from test_decode import prompts

from lab.decode import decode
from lab.drafters import PromptLookup
from lab.drafters.lookup import continuations, trie
from lab.errors import LabError
from lab.sampling import RandomStream, Sampling
from lab.target.engine import Engine
from lab.verify.lossless import children_of


def test_the_longest_suffix_wins_then_the_most_recent_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 8, 1, 6, 7, 9, 5, 6, 7]
    # the suffix 5 6 7 occurred at 0 (followed by 8 1); 6 7 also at 5 (followed by 9 5); 7 at 2, 6
    assert continuations(context, 2, 3, 1, 1) == [[8, 1]]
    assert continuations(context, 2, 3, 1, 4) == [[8, 1], [9, 5]]  # 6 7 at 5, then at 1 (same 8 1: kept once)
    assert continuations(context, 2, 2, 2, 4) == [[9, 5], [8, 1]]  # suffix 6 7 only: the most recent first
    assert continuations([1, 2, 3], 4, 3, 1, 4) == []  # nothing repeats


def test_a_continuation_may_run_into_the_suffix_itself():
    assert continuations([4, 4, 4], 3, 1, 1, 1) == [[4]]  # the 4 at 1 is followed by the last 4 only


def test_the_trie_merges_shared_prefixes_and_keeps_siblings_distinct():
    tree = trie(9, [[1, 2, 3], [1, 2, 4], [5]])
    assert tree.tokens[0] == 9 and len(tree) == 6  # root, 1, 2, 3, 4, 5
    for kids in children_of(tree.parents):
        assert len({tree.tokens[c] for c in kids}) == len(kids)
    assert all(p < i for i, p in enumerate(tree.parents) if p >= 0)
    assert sorted(tree.tokens[i] for i in range(len(tree)) if i not in tree.parents) == [3, 4, 5]  # the leaves


def test_the_drafter_proposes_a_chain_or_a_tree_and_nothing_without_a_match():
    rng, s = RandomStream(0), Sampling()
    context = [5, 6, 7, 8, 1, 6, 7, 9, 5, 6, 7]
    assert PromptLookup().propose(context, 3, s, rng) == ([8, 1, 6], None)
    tree = PromptLookup(candidates=4).propose(context, 3, s, rng)
    assert tree.tokens[0] == 7 and len(tree) > 4
    assert PromptLookup(candidates=4).propose([1, 2, 3], 3, s, rng) == ([], None)
    with pytest.raises(LabError, match="candidates >= 1"):
        PromptLookup(candidates=0)


@pytest.mark.slow
@pytest.mark.parametrize("candidates", [1, 4], ids=["pld", "pld-tree"])
def test_prompt_lookup_equals_ar_real(target, tokenizer, real_ar, candidates):
    """On the real target at T = 0 both forms reproduce AR token for token, and accept drafts."""
    engine, accepted = Engine(target), 0
    for prompt, ar in real_ar(6, 24):
        out = decode(engine, PromptLookup(candidates), prompt, 24, Sampling(), 4, 0, tokenizer.eos_token_id)
        assert out.tokens == ar
        accepted += sum(out.accepted_per_cycle)
    assert accepted > 0


def test_sampled_prompt_lookup_is_reproducible_per_seed(tiny, tokenizer):
    prompt = prompts(tokenizer, 1)[0] * 2  # a repeated prompt gives the lookup something to find
    s = Sampling(1.0, top_p=0.9)
    for candidates in (1, 4):
        runs = [decode(Engine(tiny), PromptLookup(candidates), prompt, 16, s, 3, seed=5, eos_id=None)
                for _ in range(2)]
        assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 16
