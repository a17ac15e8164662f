"""The shared target forward: cache cropping and compaction, tree masks, hidden-state taps."""
import pytest
import torch

from lab.target.engine import Engine

PROMPT = [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]


def fresh_logits(model, tokens):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


def check_crop_then_continue(model):
    e = Engine(model)
    e.forward(PROMPT)
    e.forward([11, 12, 13, 14, 15])   # a chain of five drafts
    e.crop(len(PROMPT) + 2)            # two of them accepted
    after = e.forward([99, 100]).logits
    expected = fresh_logits(model, PROMPT + [11, 12, 99, 100])[-2:]
    assert e.length == len(PROMPT) + 4
    assert (after - expected).abs().max() < 1e-4


def test_crop_then_continue_equals_fresh_forward_tiny(tiny):
    check_crop_then_continue(tiny)


@pytest.mark.slow
def test_crop_then_continue_equals_fresh_forward_real(target):
    check_crop_then_continue(target)


def small_tree():
    """Tree over 5 nodes: 0 -> (1, 2), 1 -> 3, 2 -> 4. Returns tokens, parents."""
    return [50, 60, 61, 70, 71], [-1, 0, 0, 1, 2]


def ancestors_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parents[j]
    return mask


def depth(parents, i):
    return 0 if parents[i] == -1 else 1 + depth(parents, parents[i])


def path(parents, i):
    return ([] if parents[i] == -1 else path(parents, parents[i])) + [i]


@pytest.mark.parametrize("which", ["tiny", "target"])
def test_tree_mask_matches_each_path_alone_and_compaction(which, request):
    model = request.getfixturevalue(which)
    tokens, parents = small_tree()
    e = Engine(model)
    e.forward(PROMPT)
    positions = torch.tensor([len(PROMPT) + depth(parents, i) for i in range(len(tokens))])
    tree = e.forward(tokens, mask=ancestors_mask(parents), positions=positions).logits
    for node in range(len(tokens)):
        alone = fresh_logits(model, PROMPT + [tokens[j] for j in path(parents, node)])[-1]
        assert (tree[node] - alone).abs().max() < 1e-4, node
    # keep the accepted path 0 -> 2 -> 4 and continue: equals a fresh forward
    e.keep(len(PROMPT), [0, 2, 4])
    nxt = e.forward([123]).logits[-1]
    expected = fresh_logits(model, PROMPT + [50, 61, 71, 123])[-1]
    assert (nxt - expected).abs().max() < 1e-4


def test_hidden_layer_taps(tiny):
    e = Engine(tiny)
    n = len(tiny.model.layers)
    out = e.forward(PROMPT, hidden_layers=(0, 1, n))
    assert set(out.hidden) == {0, 1, n}
    assert out.hidden[1].shape == (len(PROMPT), tiny.config.hidden_size)
    # the last tap is the normed feature that feeds the LM head
    with torch.inference_mode():
        assert (tiny.lm_head(out.hidden[n]) - out.logits).abs().max() < 1e-4


def test_latencies_are_taken_in_turns(tiny, monkeypatch):
    """Each step's repeats are spread over the whole measurement (one run of every step per
    round), so drift reaches all alike; a table gives one positive time per (k, tree) asked."""
    import lab.measure as measure
    from lab.timing import fastest
    calls = []
    best = fastest({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3 and set(best) == {"a", "b"}
    table = measure.latency_table(tiny, [(1, True), (4, True), (1, False)], prefix=8, repeats=2)
    assert set(table) == {(1, True), (4, True), (1, False)} and all(t > 0 for t in table.values())
    assert set(measure.forward_latency(tiny, [1, 3], prefix=8, cached=False, repeats=2)) == {1, 3}
