"""The exact bfloat16 engine (lab/exact.py): every scored position's logits and hidden states
are bit-for-bit what scoring the same positions one at a time gives, for chains and random
trees after random cache lengths; and transformers' own bfloat16 path fails the same check,
so the check can fail."""
from collections import Counter

import numpy as np
import pytest
import torch

from lab.decode import decode
from lab.drafters import NoDraft, TreeModelDraft
from lab.engine import Engine, engine_for
from lab.errors import LabError
from lab.exact import ExactEngine, bf16_support
from lab.models import make_draft, tiny_target
from lab.sampling import Sampling
from lab.trees import DraftTree

pytestmark = pytest.mark.skipif(bf16_support() is not None, reason=f"{bf16_support()}")
LAYERS = (0, 1)  # hidden states checked besides the logits (plus the top feature)


def random_tree(n: int, vocab: int, g: torch.Generator) -> DraftTree:
    """n nodes, each under a uniformly chosen earlier node (parents first), random tokens."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return DraftTree(torch.randint(0, vocab, (n,), generator=g).tolist(), parents)


def one_at_a_time(engine, prefix: list[int], path: list[int], layers: tuple[int, ...]):
    """Logits and hidden states of the last token of `path`, scored AR after `prefix`."""
    engine.reset()
    engine.forward(prefix)
    for token in path:
        scored = engine.forward([token], hidden_layers=layers)
    return scored.logits[0], {i: h[0] for i, h in scored.hidden.items()}


def check_trees(model, trials: int, max_nodes: int, max_prefix: int, seed: int, make=engine_for) -> list[str]:
    """Score random trees after random prefixes in one forward; compare sampled nodes with the
    AR scoring of their paths. Returns what differed (empty: bit-identical everywhere)."""
    g = torch.Generator().manual_seed(seed)
    vocab, top = model.config.vocab_size, model.config.num_hidden_layers
    layers = LAYERS + (top,)
    batched, alone = make(model), make(model)
    differences = []
    for trial in range(trials):
        prefix = torch.randint(0, vocab, (int(torch.randint(1, max_prefix, (1,), generator=g)),), generator=g).tolist()
        tree = random_tree(int(torch.randint(2, max_nodes + 1, (1,), generator=g)), vocab, g)
        batched.reset()
        batched.forward(prefix[:-1])
        tree.tokens[0] = prefix[-1]
        scored = batched.forward(tree.tokens, mask=tree.ancestor_mask(), positions=tree.positions(len(prefix) - 1),
                                 hidden_layers=layers)
        for node in torch.randperm(len(tree), generator=g)[:6].tolist():
            logits, hidden = one_at_a_time(alone, prefix[:-1], [tree.tokens[i] for i in tree.path_to(node)], layers)
            if not torch.equal(logits, scored.logits[node]):
                differences.append(f"trial {trial}: logits of node {node} of {len(tree)}")
            differences += [f"trial {trial}: layer {i} of node {node}" for i in layers
                            if not torch.equal(hidden[i], scored.hidden[i][node])]
    return differences


def test_the_exact_engine_scores_tiny_trees_as_ar():
    assert check_trees(tiny_target(0).to(torch.bfloat16), trials=12, max_nodes=64, max_prefix=300, seed=0) == []


@pytest.mark.slow
def test_the_exact_engine_scores_real_trees_as_ar(target_bf16):
    assert check_trees(target_bf16, trials=4, max_nodes=64, max_prefix=200, seed=1) == []


@pytest.mark.slow
def test_transformers_bfloat16_fails_the_same_check(target_bf16):
    """The broken variant: transformers' bfloat16 forward, checked the same way, differs."""
    assert check_trees(target_bf16, trials=4, max_nodes=64, max_prefix=200, seed=1, make=Engine) != []


def test_compaction_then_more_tokens_equals_ar():
    """After a tree forward and `keep` of a path that is not a prefix, the next forward sees
    exactly the cache AR would have built."""
    model = tiny_target(1).to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 1000, (40,), generator=g).tolist()
    tree = DraftTree([prefix[-1], 5, 6, 7, 8, 9], [-1, 0, 0, 2, 2, 4])
    engine = engine_for(model)
    engine.forward(prefix[:-1])
    engine.forward(tree.tokens, mask=tree.ancestor_mask(), positions=tree.positions(len(prefix) - 1))
    path = tree.path_to(5)  # root, 2, 4, 5: not a prefix of the node order
    engine.keep(len(prefix) - 1, path)
    after = engine.forward([11, 12]).logits
    ar = engine_for(model)
    ar.forward(prefix[:-1] + [tree.tokens[i] for i in path])
    assert torch.equal(after, ar.forward([11, 12]).logits)


def test_tree_decoding_in_bfloat16_equals_ar(tokenizer):
    model = tiny_target(2).to(torch.bfloat16)
    draft = make_draft(model, 1)
    prompt = tokenizer("The exact engine", add_special_tokens=False).input_ids
    ar = decode(engine_for(model), NoDraft(), prompt, 24, Sampling(), 0, 0, eos_id=None)
    tree = decode(engine_for(model), TreeModelDraft(draft, 4, 3, 12), prompt, 24, Sampling(), 4, 0, eos_id=None)
    assert tree.tokens == ar.tokens and tree.cycles < ar.cycles


def test_step_seconds_times_every_step_and_leaves_the_forward_as_it_was():
    """`exact_step_latency` splits a forward into its steps (they add up to at most its total),
    and the timed forward computes the same bits as the untimed one, which comes back after."""
    import lab.exact
    from lab.measure import exact_step_latency
    model = tiny_target(4).to(torch.bfloat16)
    split = exact_step_latency(model, [1, 6], prefix=20, repeats=2)
    for steps in split.values():
        assert set(steps) == {"products", "tree_attention", "add_norm", "rope_into_cache", "swiglu", "other", "total"}
        assert all(v > 0 for k, v in steps.items() if k != "other")
        assert sum(v for k, v in steps.items() if k not in ("other", "total")) <= steps["total"]
    engine, tokens = engine_for(model), list(range(100, 130))
    untimed = engine.forward(tokens).logits
    engine.reset()
    with lab.exact.step_seconds() as seconds:
        timed = engine.forward(tokens).logits
    assert torch.equal(timed, untimed) and seconds["products"] > 0
    assert lab.exact.ops() is not None and not isinstance(lab.exact.ops(), lab.exact._TimedOps)
    assert lab.exact.packed_linear.__name__ == "packed_linear"


def test_a_cpu_without_bfloat16_units_gets_one_line(monkeypatch):
    import lab.exact
    monkeypatch.setattr(lab.exact, "bf16_support", lambda: "this CPU has no bfloat16 matrix instructions")
    with pytest.raises(LabError, match="--dtype float32"):
        ExactEngine(tiny_target(3).to(torch.bfloat16))


def _first_two(model, drafter, prompt, sampling, n):
    """Counts of the first two sampled tokens over n seeds (each a fresh decode)."""
    engine = engine_for(model)
    return Counter(tuple(decode(engine, drafter, prompt, 2, sampling, 2, seed, eos_id=None).tokens) for seed in range(n))


def _target_pairs(model, prompt, sampling):
    """The target's exact distribution of the first two tokens: {(a, b): p(a) p(b | a)}."""
    from lab.sampling import probabilities
    engine = engine_for(model)
    engine.forward(prompt[:-1])
    first = probabilities(engine.forward(prompt[-1:]).logits, sampling)[0]
    out = {}
    for a in first.nonzero().flatten().tolist():
        engine.crop(len(prompt))
        second = probabilities(engine.forward([a]).logits, sampling)[0]
        for b in second.nonzero().flatten().tolist():
            out[(a, b)] = float(first[a] * second[b])
    return out


def _always_take_the_first_child(tokens, parents, p, uniforms, noise):
    """Broken verification: walks down the first child of every node without checking it."""
    from lab.verify import TreeResult, children_of
    children, path = children_of(parents), [0]
    while children[path[-1]]:
        path.append(children[path[-1]][0])
    return TreeResult(path, [tokens[i] for i in path[1:]] + [int(torch.multinomial(p[path[-1]], 1))])


@pytest.mark.slow
def test_sampled_tree_decoding_in_bfloat16_keeps_the_target_distribution(tokenizer, monkeypatch):
    """At temperature 1 (top-k 6 to keep the cells few), the first two tokens of tree decoding
    on the exact engine follow the target's own distribution; broken verification does not."""
    from test_verify import chi2_pvalue
    import lab.decode
    model = tiny_target(4).to(torch.bfloat16)
    drafter = TreeModelDraft(make_draft(model, 1), depth=2, top_k=2, total_tokens=5)
    prompt = tokenizer("Sampling must not change", add_special_tokens=False).input_ids
    sampling = Sampling(1.0, top_k=6)
    expected = _target_pairs(model, prompt, sampling)
    cells = sorted(expected)

    def pvalue(counts):
        if set(counts) - set(expected):
            return 0.0
        return chi2_pvalue(np.array([counts.get(c, 0) for c in cells]), [expected[c] for c in cells])

    assert pvalue(_first_two(model, drafter, prompt, sampling, 1500)) > 1e-3
    monkeypatch.setattr(lab.decode, "verify_tree", _always_take_the_first_child)
    assert pvalue(_first_two(model, drafter, prompt, sampling, 1500)) < 1e-6
