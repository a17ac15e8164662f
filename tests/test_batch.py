"""Batched decoding (lab.batched.decode_batch on lab.target.exact.forward_batch): every sequence of a
batch gets exactly its own single-sequence output, greedy and sampled with its own seed; one batched
target forward per round serves every unfinished sequence, and the drafters' forwards are batched
too, at most one per draft step of a cycle; sampling in a batch keeps the target's
distribution, and a broken verification fails the same check (since a batch of one is `decode`
token for token, this is also the exact engine's sampling check); `bench --batch-size` runs and
refuses what it cannot do in one line."""
import json
from collections import Counter

import numpy as np
import pytest
import torch
from test_cli import lab as run_lab
from test_verify import chi2_pvalue

import lab.batched
import lab.decode
from lab.batched import decode_batch
from lab.decode import decode
from lab.drafters import EagleDraft, ModelDraft, NoDraft, TreeModelDraft
from lab.drafters.eagle1 import EagleHead
from lab.errors import LabError
from lab.sampling import Sampling
from lab.target.engine import Engine, Request
from lab.target.exact import ExactEngine, forward_batch
from lab.target.load import engine_for, make_draft, tiny_target
from lab.verify.lossless import children_of

PROMPTS = [[5, 900, 31, 77], [1200], [8, 8, 8, 8, 8, 8, 8, 8, 8, 41, 3], [4000, 12], [7, 300, 5000, 22, 9, 1]]


@pytest.fixture(scope="module")
def model():
    return tiny_target(6).to(torch.bfloat16)


_DRAFTS = {}  # the draft model and an (untrained) EAGLE head per target, built once


def drafters(model, kind: str, n: int) -> list:
    """n fresh drafters of one kind (each keeps its own state and its own cache)."""
    if id(model) not in _DRAFTS:
        torch.manual_seed(0)
        _DRAFTS[id(model)] = make_draft(model, 1), EagleHead(model).eval()
    draft, head = _DRAFTS[id(model)]
    make = {"ar": NoDraft, "sd": lambda: ModelDraft(draft), "tree": lambda: TreeModelDraft(draft, 3, 2, 6),
            "eagle2": lambda: EagleDraft(head, "dynamic", 3, 2, 6)}
    return [make[kind]() for _ in range(n)]


def alone(model, kind: str, prompts, sampling, seeds, eos_id):
    return [decode(ExactEngine(model), d, p, 20, sampling, 3, seed, eos_id).tokens
            for d, p, seed in zip(drafters(model, kind, len(prompts)), prompts, seeds)]


def together(model, kind: str, prompts, sampling, seeds, eos_id):
    return decode_batch([ExactEngine(model) for _ in prompts], drafters(model, kind, len(prompts)), prompts, 20,
                        sampling, 3, seeds, eos_id)


@pytest.mark.parametrize("kind", ["ar", "sd", "tree", "eagle2"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(1.0)], ids=["greedy", "T=1"])
def test_each_sequence_of_a_batch_is_its_own_decoding(model, kind, sampling):
    """Prompts of 1 to 11 tokens, batches of 1 to 5, and an EOS token chosen from a sequence's own
    output so that sequences stop at different rounds and leave the batch."""
    seeds = [11, 12, 13, 14, 15]
    first = alone(model, kind, PROMPTS, sampling, seeds, None)
    eos = first[2][6]  # the third prompt stops at its 7th token (or earlier); the others when they meet it
    expected = alone(model, kind, PROMPTS, sampling, seeds, eos)
    assert len({len(t) for t in expected}) > 1
    for b in range(1, len(PROMPTS) + 1):
        got = [r.tokens for r in together(model, kind, PROMPTS[:b], sampling, seeds[:b], eos)]
        assert got == expected[:b], b


@pytest.mark.parametrize("kind", ["sd", "tree", "eagle2"])
def test_one_batched_forward_per_model_and_step_serves_every_unfinished_sequence(model, monkeypatch, kind):
    """The target scores the whole batch once a cycle; between two target forwards each drafter
    step of the batch is one forward (sd: 3 chain steps; the trees: 3 levels of the draft model,
    or the EAGLE head's commit and 2 levels), and no draft forward is lost or repeated."""
    eos = alone(model, kind, PROMPTS, Sampling(), [0] * 5, None)[0][4]
    calls = []

    def counted(requests):
        calls.append(("target" if requests[0].engine.model is model else "draft", len(requests)))
        return forward_batch(requests)
    monkeypatch.setattr(lab.batched, "forward_batch", counted)
    batch_drafters = drafters(model, kind, len(PROMPTS))
    results = decode_batch([ExactEngine(model) for _ in PROMPTS], batch_drafters, PROMPTS, 20, Sampling(), 3,
                           [0] * 5, eos)
    target = [size for who, size in calls if who == "target"]
    rounds = [r.cycles + (len(p) > 1) for r, p in zip(results, PROMPTS)]  # a one-token prompt has no prefill
    assert len(target) == max(rounds) and sum(target) == sum(rounds)
    assert target == sorted(target, reverse=True) and target[0] == len(PROMPTS) and target[-1] < len(PROMPTS)
    between = "".join("T" if who == "target" else "d" for who, _ in calls).split("T")
    assert max(map(len, between)) == 3, between
    own = drafters(model, kind, len(PROMPTS))  # the same drafters decoding alone make as many draft forwards
    for d, p in zip(own, PROMPTS):
        decode(ExactEngine(model), d, p, 20, Sampling(), 3, 0, eos)
    alone_forwards, batch_forwards = (sum((d.cache if kind == "eagle2" else d).engine.forwards for d in group)
                                      for group in (own, batch_drafters))
    assert sum(size for who, size in calls if who == "draft") == batch_forwards == alone_forwards
    assert len(calls) - len(target) < alone_forwards


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
    from lab.verify.lossless import TreeResult
    children, path = children_of(parents), [0]
    while children[path[-1]]:
        path.append(children[path[-1]][0])
    return TreeResult(path, [tokens[i] for i in path[1:]] + [int(torch.multinomial(p[path[-1]], 1))])


def _first_two_in_batches(model, prompt, sampling, batches: int, size: int = 3) -> Counter:
    counts = Counter()
    for batch in range(batches):
        results = decode_batch([ExactEngine(model) for _ in range(size)], drafters(model, "tree", size),
                               [prompt] * size, 2, sampling, 2, [batch * size + i for i in range(size)], None)
        counts.update(tuple(r.tokens) for r in results)
    return counts


@pytest.mark.slow
def test_sampling_in_a_batch_keeps_the_target_distribution(model, monkeypatch):
    """At T = 1 (top-k 6, to keep the cells few) the first two tokens of tree decoding, three
    sequences a batch, follow the target's own distribution; a verification that always walks
    down the first child does not."""
    prompt, sampling = [17, 4000, 250], Sampling(1.0, top_k=6)
    expected = _target_pairs(model, prompt, sampling)
    cells = sorted(expected)

    def pvalue(counts: Counter) -> float:
        if set(counts) - set(expected):
            return 0.0
        return chi2_pvalue(np.array([counts.get(c, 0) for c in cells]), [expected[c] for c in cells])

    assert pvalue(_first_two_in_batches(model, prompt, sampling, 500)) > 1e-3
    monkeypatch.setattr(lab.decode, "verify_tree", _always_take_the_first_child)
    assert pvalue(_first_two_in_batches(model, prompt, sampling, 500)) < 1e-6


def test_batched_forward_refuses_what_it_cannot_do(model):
    one = ExactEngine(model)
    with pytest.raises(ValueError, match="distinct engines"):
        forward_batch([Request(one, [1]), Request(one, [2])])
    with pytest.raises(ValueError, match="same hidden layers"):
        forward_batch([Request(one, [1], hidden_layers=(1,)), Request(ExactEngine(model), [2])])
    with pytest.raises(ValueError, match="exact engines"):
        forward_batch([Request(Engine(tiny_target(6)), [1])])
    with pytest.raises(LabError, match="--dtype bfloat16"):
        decode_batch([Engine(tiny_target(6))], [NoDraft()], [[1, 2]], 4, Sampling(), 1, [0], None)


def test_bench_batch_size_table_and_refusals(tmp_path):
    out = tmp_path / "batch.json"
    r = run_lab("bench", "--target", "tiny", "--methods", "ar,sd,sd-tree", "--batch-size", "1,3", "--limit", "4",
            "--max-new-tokens", "6", "--dtype", "bfloat16", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["config"]["batch_sizes"] == [1, 3] and set(res["crossing_batch_size"]) == {"ar", "sd", "sd-tree"}
    for method, by_size in res["batched"].items():
        for b, s in by_size.items():
            assert s["identical_to_ar"] is True, (method, b)
            assert len(s["latency_s"]) == 4 and s["predicted_speedup"] > 0
    assert "| sd-tree | 3 |" in r.stdout and "crossing" in r.stdout
    for args, message in ((["--dtype", "float32"], "--dtype bfloat16"), (["--methods", "ar,hf"], "not hf"),
                          (["--methods", "sd"], "add ar"), (["--batch-size", "2,2"], "distinct positive")):
        base = {"--methods": "ar", "--batch-size": "1,2", "--dtype": "bfloat16"}
        base.update(dict(zip(args[::2], args[1::2])))
        r = run_lab("bench", "--target", "tiny", "--limit", "2", "--max-new-tokens", "4",
                *[x for kv in base.items() for x in kv])
        assert r.returncode != 0 and message in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
