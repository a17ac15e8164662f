"""The exact bfloat16 engine (lab/target/exact.py): every scored position's logits and hidden states
are bit-for-bit what scoring the same positions one at a time gives, for chains and random
trees after random cache lengths, with oneDNN's products where this CPU has them and with the
lab's own product kernel everywhere; and transformers' own bfloat16 path fails the same check,
so the check can fail."""
from collections import Counter

import numpy as np
import pytest
import torch

from lab.decode import decode
from lab.drafters import NoDraft, TreeModelDraft
from lab.errors import LabError
from lab.sampling import Sampling
from lab.target.engine import Engine
from lab.target.exact import ExactEngine
from lab.target.products import KernelWeight, packed_linear
from lab.target.load import engine_for, make_draft, tiny_target
from lab.trees import DraftTree
from lab.verify.lossless import children_of


def random_tree(n: int, vocab: int, g: torch.Generator) -> DraftTree:
    """n nodes, each under a uniformly chosen earlier node (parents first), random tokens."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return DraftTree(torch.randint(0, vocab, (n,), generator=g).tolist(), parents)


def one_at_a_time(engine, prefix: list[int], tree: DraftTree, layers: tuple[int, ...]) -> list:
    """Every node of `tree` scored AR after `prefix`: (logits, {layer: hidden}) per node. The
    nodes go in depth-first order, so cropping the cache to a node's depth leaves exactly its
    ancestors there, as if its path had been scored alone, one token per forward."""
    engine.reset()
    engine.forward(prefix)
    children, depths, out, stack = children_of(tree.parents), tree.depths(), [None] * len(tree), [0]
    while stack:
        node = stack.pop()
        engine.crop(len(prefix) + depths[node])
        scored = engine.forward([tree.tokens[node]], hidden_layers=layers)
        out[node] = (scored.logits[0], {i: h[0] for i, h in scored.hidden.items()})
        stack += children[node][::-1]
    return out


def check_trees(model, trials: int, max_nodes: int, max_prefix: int, seed: int, make=engine_for) -> list[str]:
    """Score random trees after random prefixes in one forward (the first trial a chain of
    `max_nodes` with no mask, the second a tree of `max_nodes`, the rest of random sizes) and
    compare every node's logits and every layer's hidden state with the AR scoring of its path.
    Returns what differed (empty: bit-identical everywhere)."""
    g = torch.Generator().manual_seed(seed)
    vocab, layers = model.config.vocab_size, tuple(range(model.config.num_hidden_layers + 1))
    batched, alone = make(model), make(model)
    differences = []
    for trial in range(trials):
        prefix = torch.randint(0, vocab, (int(torch.randint(1, max_prefix, (1,), generator=g)),), generator=g).tolist()
        size = max_nodes if trial < 2 else int(torch.randint(2, max_nodes + 1, (1,), generator=g))
        tree = random_tree(size, vocab, g)
        if trial == 0:
            tree.parents = list(range(-1, size - 1))
        batched.reset()
        batched.forward(prefix[:-1])
        tree.tokens[0] = prefix[-1]
        mask, positions = (None, None) if trial == 0 else (tree.ancestor_mask(), tree.positions(len(prefix) - 1))
        scored = batched.forward(tree.tokens, mask=mask, positions=positions, hidden_layers=layers)
        for node, (logits, hidden) in enumerate(one_at_a_time(alone, prefix[:-1], tree, layers)):
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
    assert check_trees(target_bf16, trials=2, max_nodes=64, max_prefix=200, seed=1, make=Engine) != []


def _logit_gap(engine_logits: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """Mean absolute logit difference, and the share of positions whose argmax agrees."""
    return (float((engine_logits - reference).abs().mean()),
            float((engine_logits.argmax(-1) == reference.argmax(-1)).float().mean()))


@pytest.mark.slow
def test_the_exact_engine_computes_the_same_model_as_transformers(target_bf16, tokenizer):
    """Batch invariance alone would not catch a wrong forward that is wrong the same way for every
    row. Against transformers' float32 forward over the same (bfloat16) weights, the engine's
    logits on an MT-Bench prompt differ only by bfloat16 rounding (here a mean of about 0.07 on
    logits up to about 40, every argmax the same); with RoPE's frequencies doubled they do not."""
    from transformers import LlamaForCausalLM

    from lab.data import chat_ids, mt_bench
    from lab.target.exact import PackedLlama
    ids = chat_ids(tokenizer, mt_bench()[0].text)
    float32 = LlamaForCausalLM(target_bf16.config).float().eval()
    float32.load_state_dict({k: v.float() for k, v in target_bf16.state_dict().items()})
    with torch.inference_mode():
        reference = float32(torch.tensor([ids])).logits[0]
    mean, agree = _logit_gap(ExactEngine(target_bf16).forward(ids).logits, reference)
    assert mean < 0.15 and agree >= 0.95, (mean, agree)
    packed = PackedLlama.of(target_bf16)
    right = packed.inv_freq
    packed.inv_freq = right * 2  # the broken variant: a wrong RoPE, batch-invariant all the same
    try:
        mean, agree = _logit_gap(ExactEngine(target_bf16).forward(ids).logits, reference)
    finally:
        packed.inv_freq = right
    assert mean > 1.0 and agree < 0.9, (mean, agree)


def test_models_the_packed_path_does_not_support_get_one_line():
    """Linear biases, another RoPE, a head size that is not a multiple of 16: each refused in one
    line that names the fallback."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = tiny_target(0).config.to_dict()
    rope = {**config["rope_parameters"], "rope_type": "linear", "factor": 2.0}
    for change in ({"attention_bias": True}, {"mlp_bias": True}, {"rope_parameters": rope},
                   {"head_dim": 8, "num_attention_heads": 8}):
        model = LlamaForCausalLM(LlamaConfig.from_dict({**config, **change})).to(torch.bfloat16)
        with pytest.raises(LabError, match="--dtype float32") as error:
            ExactEngine(model)
        assert "\n" not in str(error.value), change


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
    import lab.target.products as products
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
    with products.step_seconds() as seconds:
        timed = engine.forward(tokens).logits
    assert torch.equal(timed, untimed) and seconds["products"] > 0
    assert products.ops() is not None and not isinstance(products.ops(), products._TimedOps)
    assert products.packed_linear.__name__ == "packed_linear"


def test_the_lab_kernel_computes_each_row_alone():
    """`linear_bf16` against float32 products of the same bfloat16 numbers (within bfloat16
    rounding), and every row the same bits whatever rows share the call: counts from 1 to 9 (its
    blocks of 1 to 6 rows, and 6 + 3) and 13 outputs (a panel of 16 part-filled)."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(13, 64, generator=g).to(torch.bfloat16)
    weight = KernelWeight(raw)
    x = torch.randn(9, 64, generator=g).to(torch.bfloat16)
    whole = packed_linear(x, weight)
    reference = x.float() @ raw.float().T
    assert whole.dtype == torch.bfloat16 and torch.allclose(whole.float(), reference, rtol=1e-2, atol=1e-2)
    for n in range(1, 10):
        for start in range(0, 10 - n):
            assert torch.equal(packed_linear(x[start: start + n], weight), whole[start: start + n]), (n, start)


def test_the_lab_kernel_scores_tiny_trees_as_ar(monkeypatch):
    """The engine with the lab's product kernel, also where oneDNN's would be used."""
    import lab.target.exact
    import lab.target.products
    monkeypatch.setattr(lab.target.products, "bf16_support", lambda: "oneDNN's kernels switched off for this test")
    model = tiny_target(3).to(torch.bfloat16)
    assert all(isinstance(layer.qkv, KernelWeight) for layer in lab.target.exact.PackedLlama.of(model).layers)
    assert check_trees(model, trials=8, max_nodes=48, max_prefix=200, seed=5) == []
