"""Medusa (lab/drafters/medusa.py, lab/train/medusa.py): heads that start as the target's next-token
guess, the tree from per-head accuracies, decoding equal to AR, losslessness at T = 1 with a
broken rule that fails, and training that lowers the loss and round-trips through the head file."""
import json

import pytest
import torch
from test_decode import prompts
from test_eagle import small_set
from test_lookahead import CRITICAL, FixedTarget, chi_square, without_zeroing

import lab.decode
from lab.decode import _tree_cycle, decode
from lab.steps import run_alone
from lab.drafters import NoDraft, static_shape
from lab.drafters.heads import load_head
from lab.drafters.medusa import MedusaDraft, MedusaHeads
from lab.errors import LabError
from lab.sampling import RandomStream, Sampling
from lab.target.engine import Engine
from lab.timing import Seconds
from lab.train.medusa import train_medusa
from lab.train.options import MedusaOptions


def random_heads(target, vocab: torch.Tensor, seed: int = 0) -> MedusaHeads:
    heads = MedusaHeads(target, vocab)
    g = torch.Generator().manual_seed(seed)
    for block in heads.blocks:
        block.weight.data = torch.randn(block.weight.shape, generator=g) * 0.05
    return heads.eval()


def test_new_heads_are_the_targets_next_token_guess(tiny):
    vocab = torch.arange(0, tiny.config.vocab_size, 5)
    heads = MedusaHeads(tiny, vocab)
    h = torch.randn(3, tiny.config.hidden_size)
    expected = tiny.lm_head(h)[:, vocab]
    assert torch.allclose(heads(h), expected[:, None].expand(-1, 4, -1), atol=1e-5)


def test_the_tree_follows_the_product_of_per_head_accuracies():
    # (0) 0.6, (1) 0.2, (0, 0) 0.18, (0, 1) 0.06, (1, 0) 0.06
    assert static_shape(4, 2, [[0.6, 0.2], [0.3, 0.1]]) == [(0,), (1,), (0, 0)]
    assert static_shape(3, 2, [[0.6, 0.2], [0.5, 0.1]]) == [(0,), (0, 0)]  # 0.30 beats 0.2
    with pytest.raises(LabError, match="every depth"):
        static_shape(4, 3, [[0.6], [0.3]])


def test_a_node_carries_its_heads_token_of_its_rank(tiny):
    vocab = torch.arange(100, 400)
    heads = random_heads(tiny, vocab)
    drafter = MedusaDraft(heads, [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    drafter.begin([1, 2])
    feature = torch.randn(1, tiny.config.hidden_size)
    drafter.commit([1, 2], feature)
    tree = drafter.propose([1, 2], 4, Sampling(), RandomStream(0))
    ranked = torch.topk(heads(feature[0]), 2, -1).indices  # [K, 2]
    assert tree.tokens[0] == 2 and tree.parents == [-1, 0, 0, 1, 1, 2, 3]
    assert tree.tokens[1:3] == vocab[ranked[0]].tolist()                 # head 1, ranks 0 and 1
    assert tree.tokens[3:6] == vocab[ranked[1, [0, 1, 0]]].tolist()      # head 2 under either
    assert tree.tokens[6] == int(vocab[ranked[2, 0]])
    assert len(drafter.propose([1, 2], 1, Sampling(), RandomStream(0))) == 3  # k = 1: depth 1 only
    with pytest.raises(LabError, match="one per head"):
        MedusaDraft(heads, [(0, 0, 0, 0, 0)])


def test_medusa_equals_ar_on_the_tiny_target(tiny, tokenizer):
    heads = random_heads(tiny, torch.arange(tiny.config.vocab_size))
    shape = static_shape(8, 3, [[0.5, 0.2, 0.1]] * 3)
    for prompt in prompts(tokenizer, 3):
        ar = decode(Engine(tiny), NoDraft(), prompt, 16, Sampling(), 0, 0, None)
        out = decode(Engine(tiny), MedusaDraft(heads, shape), prompt, 16, Sampling(), 3, 0, None)
        assert out.tokens == ar.tokens


def first_tokens(tiny, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first token of `draws` Medusa cycles at T = 1 over a 6-token vocabulary: the tree is
    head 1's top three (and head 2's best under each), the target's rows fixed."""
    heads = random_heads(tiny, torch.arange(6), seed=3)
    drafter = MedusaDraft(heads, [(0,), (1,), (2,), (0, 0)])
    drafter.begin([5, 0])
    layer = heads.feature_layers[0]
    feature = torch.randn(1, tiny.config.hidden_size, generator=torch.Generator().manual_seed(4))
    drafter.commit([5, 0], feature)
    tree = drafter.propose([5, 0], 2, Sampling(1.0), RandomStream(0))
    p_root = torch.tensor([0.05, 0.3, 0.2, 0.1, 0.25, 0.1])
    logits = torch.log(torch.softmax(torch.randn(len(tree), 6, generator=torch.Generator().manual_seed(1)), -1))
    logits[0] = p_root.log()
    target = FixedTarget(logits, {layer: torch.randn(len(tree), tiny.config.hidden_size)})
    counts = torch.zeros(6)
    for seed in range(draws):
        cycle = run_alone(_tree_cycle(target, Seconds(), [5, 0], tree, "torch", Sampling(1.0), RandomStream(seed),
                                     heads.feature_layers))
        counts[cycle.tokens[0]] += 1
    return counts, p_root


@pytest.mark.slow
def test_medusa_keeps_the_target_distribution_and_a_broken_rule_fails(tiny, monkeypatch):
    counts, p = first_tokens(tiny, 4000)
    assert chi_square(counts, p) < CRITICAL
    monkeypatch.setattr(lab.decode, "verify_tree", without_zeroing)
    broken, _ = first_tokens(tiny, 4000)
    assert chi_square(broken, p) > CRITICAL


def test_training_lowers_the_loss_and_the_heads_round_trip(tiny, tmp_path):
    out = tmp_path / "tiny-medusa.safetensors"  # its checkpoint's name is its own: no real run's
    train_medusa(MedusaOptions(minutes=5.0, max_steps=30, lr=1e-2, draft_vocab=512), target=tiny, data=small_set(),
                 out=out)
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["steps"] == 30 and sum(manifest["loss_last_20"]) < sum(manifest["loss_first_20"])
    evaluation = manifest["evaluation"]
    for top1, top5 in zip(evaluation["top1_by_head"], evaluation["top5_by_head"]):
        assert 0 < top1["positions"] == top5["positions"] and top1["hits"] <= top5["hits"] <= top5["positions"]
        low, high = top5["interval"]
        assert low <= top5["rate"] <= high
    assert len(evaluation["rank_accuracy_by_head"]) == 4
    loaded = load_head(tiny, path=out)
    assert isinstance(loaded, MedusaHeads) and loaded(torch.zeros(tiny.config.hidden_size)).shape == (4, 512)
    with pytest.raises(LabError, match="--heads"):
        MedusaOptions(heads=0)



def test_the_cost_model_sizes_the_tree_by_what_positions_cost(tmp_path):
    from lab.costmodel import medusa_tree
    accuracy = [[0.6, 0.2, 0.1], [0.4, 0.15, 0.05], [0.3, 0.1, 0.05], [0.2, 0.1, 0.05]]

    def tuned(per_position: float):
        path = tmp_path / f"tuned_{per_position}.json"
        latency = {str(n): 0.010 + per_position * (n - 1) for n in (1, 2, 4, 8, 16, 32, 64)}
        path.write_text(json.dumps({"target_latency_seconds": latency, "ar_forward_seconds": 0.010,
                                    "loop_seconds": 0.0, "prefill_seconds_per_token": 0.0,
                                    "command": "test", "machine": {"cpu": "test"}}))
        return path
    free_shape, free = medusa_tree(accuracy, tuned(0.0), 0.0)
    costly_shape, costly = medusa_tree(accuracy, tuned(0.004), 0.0)
    assert free["total_tokens"] == 64 and len(free_shape) == 63  # free positions: the largest size measured
    assert costly["total_tokens"] < free["total_tokens"] and costly["tau"] < free["tau"]
    # tau is one plus the summed path values: with (0,) alone, 1 + 0.6
    assert medusa_tree([[0.6]], tuned(0.0), 0.0)[1]["tau"] == pytest.approx(1.6)


def test_the_shipped_heads_are_scored_on_the_evaluators_positions():
    """Head k at position t guesses token t+k+1, as an EAGLE chain's depth k does with the true tokens
    fed, so both are scored where that token is a response token of the same 50 held-out prompts."""
    from lab.drafters.heads import head_manifest
    medusa, eagle1 = head_manifest("medusa")["evaluation"], head_manifest("eagle1")["evaluation"]
    assert medusa["prompts"] == eagle1["sequences"]
    assert [h["positions"] for h in medusa["top1_by_head"]] == eagle1["top1_by_depth"]["chains"][:4]
