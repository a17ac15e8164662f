"""EAGLE heads: drafting equals AR at temperature 0, the head's cache follows the accepted
tokens' true features, the unrolled evaluation matches sequential drafting, static trees are
well formed, training lowers the loss and checkpoints round-trip."""
import time

import numpy as np
import pytest
import torch
from test_decode import ar_runs

from lab.data import RegenSet, chat_ids, load_regen, mt_bench
from lab.decode import decode
from lab.drafters import EagleDraft, NoDraft, static_shape
from lab.drafters.eagle1 import EagleHead
from lab.drafters.heads import load_head, save_head
from lab.errors import LabError
from lab.sampling import Sampling
from lab.target.engine import Engine
from lab.train.eagle import _batch, head_loss, train_head
from lab.train.evaluate import unroll_mask, unrolled_predictions
from lab.train.options import Eagle1Options
from lab.trees import DraftTree

GREEDY = Sampling()


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Feature caches and checkpoints of these small runs go to a temporary folder."""
    import lab.train.eagle as module
    import lab.train.features as features
    monkeypatch.setattr(module, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(features, "CACHE_DIR", tmp_path)


def prompts(tokenizer, n):
    return [chat_ids(tokenizer, p.text)[-200:] for p in mt_bench()[:n]]


def drafters(head):
    return [EagleDraft(head, "dynamic", 4, 3, 12),
            EagleDraft(head, "static", shape=static_shape(12, 4, [0.5, 0.2, 0.1]))]


def assert_eagle_equals_ar(model, drafters, tokenizer, references, new_tokens) -> list[float]:
    """Every drafter gives exactly AR's greedy tokens (`references`: (prompt, AR's tokens) pairs
    for `model`); returns each drafter's overall tau."""
    target = Engine(model)
    tokens, cycles = [0] * len(drafters), [0] * len(drafters)
    for prompt, ar in references:
        for i, drafter in enumerate(drafters):
            out = decode(target, drafter, prompt, new_tokens, GREEDY, 6, 0, tokenizer.eos_token_id)
            assert out.tokens == ar, drafter.name
            assert out.cycles <= len(ar)  # AR takes one forward per token
            tokens[i], cycles[i] = tokens[i] + len(out.tokens), cycles[i] + out.cycles
    return [t / c for t, c in zip(tokens, cycles)]


def test_eagle_equals_ar_tiny(tiny, tokenizer):
    head = EagleHead(tiny).eval()
    subset = EagleDraft(head, "dynamic", 3, 2, 8, vocab=torch.arange(0, tiny.config.vocab_size, 3))
    assert_eagle_equals_ar(tiny, drafters(head) + [subset, EagleDraft(head, "chain", depth=5)], tokenizer,
                           ar_runs(tiny, tokenizer, 5, 24), 24)


def test_an_eagle_chain_is_the_head_top1_and_takes_a_lossy_rule(tiny, tokenizer):
    """Chain mode drafts the dynamic tree's top-1 path, one-hot; under a rule that accepts every
    draft the output is the head's own text (so the rule saw the head's drafts), not AR's."""
    from lab.verify.lossy import TopKRule
    head, prompt, target = EagleHead(tiny).eval(), prompts(tokenizer, 1)[0], Engine(tiny)
    seen = {"chain": [], "path": []}
    for name, drafter, take in (("chain", EagleDraft(head, "chain", depth=4), lambda p: (p[0], p[1])),
                                ("path", EagleDraft(head, "dynamic", 4, 1, 5), lambda p: (p.tokens[1:], None))):
        decode(target, drafter, prompt, 16, GREEDY, 4, 0, None, on_cycle=lambda c, p, *_: seen[name].append(take(p)))
    assert seen["chain"] == seen["path"] and len(seen["chain"][0][0]) == 4
    ar = decode(target, NoDraft(), prompt, 16, GREEDY, 0, 0, None)
    everything = decode(target, EagleDraft(head, "chain", depth=4), prompt, 16, GREEDY, 4, 0, None,
                        rule=TopKRule(tiny.config.vocab_size))
    assert everything.tokens != ar.tokens and everything.accepted_per_cycle[0] == 4


@pytest.mark.slow
def test_eagle_equals_ar_real(target, tokenizer, real_ar):
    """The shipped head on 8 MT-Bench prompts: exactly AR's tokens, and it does accept drafts."""
    taus = assert_eagle_equals_ar(target, drafters(load_head(target, "eagle1")), tokenizer, real_ar(8, 24), 24)
    assert min(taus) > 1.3


def test_reduced_vocabulary_drafts_only_its_tokens(tiny, tokenizer):
    from lab.viz.cycles import CycleRecorder
    subset = torch.arange(5, tiny.config.vocab_size, 7)
    recorder = CycleRecorder(GREEDY)
    decode(Engine(tiny), EagleDraft(EagleHead(tiny).eval(), "dynamic", 3, 3, 10, vocab=subset),
           prompts(tokenizer, 1)[0], 12, GREEDY, 3, 0, None, on_cycle=recorder)
    drafted = {t for r in recorder.records for t in r.tree.tokens[1:]}
    assert drafted and drafted <= set(subset.tolist())


def test_sampled_eagle_runs_and_is_reproducible(tiny, tokenizer):
    prompt = prompts(tokenizer, 1)[0]
    s = Sampling(1.0, top_p=0.9)
    runs = [decode(Engine(tiny), EagleDraft(EagleHead(tiny).eval(), "dynamic", 3, 2, 6), prompt, 20, s, 4, 7, None)
            for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 20


class Recorder(EagleDraft):
    def commit_steps(self, context, features=None):  # the loop commits through the steps
        yield from super().commit_steps(context, features)
        self.last_context = list(context)


def test_head_cache_holds_the_true_features_of_the_accepted_context(tiny, tokenizer):
    """After several cycles, the head's root prediction equals a fresh run of the head over
    the whole accepted context with the target's features from one full forward."""
    torch.manual_seed(0)
    head = EagleHead(tiny).eval()
    drafter = Recorder(head, "dynamic", 3, 2, 6)
    decode(Engine(tiny), drafter, prompts(tokenizer, 1)[0], 20, GREEDY, 4, 0, None)
    ids = torch.tensor(drafter.last_context)
    with torch.no_grad():
        f = tiny(input_ids=ids[None], output_hidden_states=True).hidden_states[head.feature_layers[0]][0]
        fresh = head(f[:-1][None], ids[1:][None])[0, -1]
    assert torch.allclose(drafter.root[0], fresh, atol=1e-4)


def test_unrolled_predictions_match_feeding_own_outputs(tiny):
    """Depth-3 predictions from the one-pass unrolled mask equal running the head on a
    sequence whose last two features are its own earlier predictions."""
    torch.manual_seed(0)
    head = EagleHead(tiny).eval()
    ids = torch.randint(0, 1000, (14,))
    with torch.no_grad():
        f = tiny(input_ids=ids[None], output_hidden_states=True).hidden_states[-1][0]
        preds = unrolled_predictions(head, f, ids, 3)
        for i in (2, 7, 11):
            p1 = head(f[:i][None], ids[1: i + 1][None])[0, -1]  # predicts f_i
            p2 = head(torch.cat([f[:i], p1[None]])[None], ids[1: i + 2][None])[0, -1]
            p3 = head(torch.cat([f[:i], p1[None], p2[None]])[None], ids[1: i + 3][None])[0, -1]
            assert torch.allclose(preds[0][i - 1], p1, atol=1e-5)
            assert torch.allclose(preds[1][i], p2, atol=1e-5)
            assert torch.allclose(preds[2][i + 1], p3, atol=1e-5)


def test_unroll_mask_block_zero_is_causal_and_chains_see_their_members():
    m = unroll_mask(5, 3)
    assert torch.equal(m[:5, :5], torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    row = 2 * 5 + 4  # block 2, position 4: true pairs <= 2, block 1 position 3, itself
    assert m[row].nonzero().flatten().tolist() == [0, 1, 2, 8, 14]


def test_static_shape_is_a_connected_parents_first_tree():
    acc = [0.4, 0.15, 0.08, 0.04]
    shape = static_shape(20, 5, acc)
    assert len(shape) == 19 and len(set(shape)) == 19
    seen = set()
    for path in shape:
        assert len(path) <= 5 and max(path) < len(acc)
        assert len(path) == 1 or path[:-1] in seen
        seen.add(path)
    assert shape[:3] == [(0,), (1,), (2,)] and (0, 0) in shape
    assert static_shape(4, 2, [0.5, 0.0]) == [(0,), (1,), (0, 0)]  # a zero tail rank is chosen last, not fatal
    with pytest.raises(LabError):
        static_shape(8, 3, [0.0, 0.1])


def test_follow_walks_the_matching_path():
    tree = DraftTree([9, 1, 2, 3, 4], [-1, 0, 0, 1, 2])
    assert tree.follow([2, 4, 5]) == [0, 2, 4]
    assert tree.follow([1, 4]) == [0, 1]
    assert tree.follow([7]) == [0]


def small_set(n=12, heldout=2, start=3):
    """n regenerated sequences from `start` on, the first `heldout` of them held out (from 3 on,
    the held-out ones have prompts ShareGPT holds once, which the evaluator scores)."""
    d = load_regen()
    return RegenSet(d.tokens[d.offsets[start]: d.offsets[start + n]],
                    d.offsets[start: start + n + 1] - d.offsets[start],
                    d.prompt_lens[start: start + n], np.array([0] * heldout + [1] * (n - heldout), np.uint8))


def test_training_lowers_the_loss_and_the_head_round_trips(tiny, tmp_path):
    out = tmp_path / "head.safetensors"
    train_head(Eagle1Options(minutes=5.0, max_steps=25, lr=3e-3, eval_prompts=1), target=tiny, data=small_set(),
               out=out)
    import json
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["loss_last_20"]["feature"] < manifest["loss_first_20"]["feature"]
    evaluation = manifest["evaluation"]
    assert len(evaluation["top1_by_depth"]["rate"]) == 6 and manifest["steps"] == 25
    assert evaluation["sequences"] == 1  # the unique prompts among the first held-out one
    import lab.train.evaluate as evaluator
    report = evaluator.evaluate_saved_head(out, target=tiny, data=small_set(), prompts=1)  # the saved (fp16) head
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["evaluation"] == report and again["steps"] == 25
    assert report["positions"] == evaluation["positions"]
    head = load_head(tiny, path=out)
    copy = load_head(tiny, path=out)
    assert isinstance(head, EagleHead) and head.variant == "eagle1"  # the kind comes from the file itself
    f, t = torch.randn(1, 5, tiny.config.hidden_size), torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        assert torch.equal(head(f, t), copy(f, t))
    from safetensors.torch import load_file, save_file
    other = tmp_path / "other.safetensors"  # the same tensors, recorded as trained for another target
    save_file(load_file(str(out)), str(other), metadata={**head.metadata(), "target": "another-model"})
    with pytest.raises(LabError, match="another target or head shape"):
        load_head(tiny, path=other)


def test_a_saved_head_loads_back_as_it_was(tiny, tmp_path):
    """A checkpoint round-trips: every tensor the head owns comes back as saved (fp16 on disk),
    and the shared embedding and LM head are the target's own."""
    torch.manual_seed(0)
    head = EagleHead(tiny).eval()
    save_head(head, tmp_path / "h.safetensors")
    back = load_head(tiny, "eagle1", tmp_path / "h.safetensors")
    saved, loaded = head.own_state(), back.own_state()
    assert set(saved) == set(loaded)
    for name, value in saved.items():
        assert torch.equal(loaded[name], value.half().to(value.dtype)), name
    assert back.body.lm_head is tiny.lm_head and back.body.model.embed_tokens is tiny.model.embed_tokens


def test_head_loss_feature_term_is_zero_for_a_perfect_prediction(tiny):
    """The batch aligns pair i with the true feature f_{i+1}: a head that outputs exactly
    that has zero feature loss (noise aside), so the targets are not shifted wrongly."""
    d = small_set(4, 1)
    from lab.train.features import target_features
    feats = target_features(tiny, d, (tiny.config.num_hidden_layers,), progress=False)
    items = [(d.tokens[d.offsets[i]: d.offsets[i + 1]].astype(np.int64), feats[i], int(d.prompt_lens[i]))
             for i in range(1, 4)]
    f_in, tokens, f_next, pad, scored = _batch(items)
    assert torch.equal(f_next[0, :3], f_in[0, 1:4])
    assert scored.sum() > 0

    class Oracle(EagleHead):
        def forward(self, features, tokens, attention_mask=None, position_ids=None):
            return f_next

    import lab.train.eagle as module
    old, module.NOISE = module.NOISE, 0.0
    try:
        _, feature, _ = head_loss(Oracle(tiny), (f_in, tokens, f_next, pad, scored), 1.0)
    finally:
        module.NOISE = old
    assert feature == 0.0


@pytest.mark.parametrize("pays", [0.0, 1e9])  # every tree pays, so the best is chosen; none does, so AR is
def test_cost_model_picks_the_best_predicted_tree(tiny, tokenizer, trusted_timings, monkeypatch, pays):
    import lab.costmodel.choice as choice
    from lab.costmodel import predicted_speedup, tune
    monkeypatch.setattr(choice, "PAYS", pays)
    result = tune(tiny, tokenizer, EagleHead(tiny).eval(), prompts=mt_bench(2), max_new_tokens=10, positions=6,
                  prefix=16, path=None, rank_accuracy=[0.3, 0.1], depths=(2, 3), top_ks=(1, 2), sizes=(2, 4))
    latency = {int(k): v for k, v in result["target_latency_seconds"].items()}
    rows = result["dynamic"]
    # every size the tree can reach (depth 2, top-1 drafts only 3 nodes with the root)
    possible = {(d, k, n) for d in (2, 3) for k in (1, 2) for n in (2, 4) if n <= 1 + k + (d - 1) * k * k}
    assert {(r["depth"], r["top_k"], r["total_tokens"]) for r in rows} == possible
    costs = [result[k] for k in ("commit_seconds", "ar_forward_seconds", "loop_seconds", "prefill_seconds_per_token")]
    for r in rows:
        assert 1 <= r["tau"] <= r["total_tokens"]
        assert r["predicted_speedup"] == predicted_speedup(r, latency, *costs)
    assert result["prefill_seconds_per_token"] > 0 and result["loop_seconds"] > 0
    # the best trees by the uniform-position tau were walked, each priced with its walked tau,
    # and the choice is the best walked one
    walked = [r for r in rows if "walked_tau" in r]
    assert len(walked) == min(result["walked_trees"], len(rows))
    assert min(r["predicted_speedup"] for r in walked) >= max(r["predicted_speedup"] for r in rows if r not in walked)
    for r in walked:
        assert 1 <= r["walked_tau"] <= r["total_tokens"]
        assert r["walked_predicted_speedup"] == predicted_speedup({**r, "tau": r["walked_tau"]}, latency, *costs)
    assert result["dtype"] == "float32" and len(result["tuning_prompts"]) == 2
    measured = {int(k): v for k, v in result["target_latency_seconds_measured"].items()}
    assert all(latency[a] <= latency[b] for a, b in zip(sorted(latency), sorted(latency)[1:]))
    assert set(measured) == set(latency)
    best = max(walked, key=lambda r: r["walked_predicted_speedup"])
    assert result["best_tree_predicted_speedup"] == round(best["walked_predicted_speedup"], 4)
    if best["walked_predicted_speedup"] >= pays:  # the best walked tree, if it pays; else AR
        assert result["choice"]["predicted_speedup"] == round(best["walked_predicted_speedup"], 4)
        assert result["choice"]["predicted_tau"] == round(best["walked_tau"], 4)
    else:
        assert result["choice"]["total_tokens"] == 1 and result["choice"]["predicted_speedup"] == 1.0
    assert [r["total_tokens"] for r in result["static"]] == [2, 4]


def test_the_commit_is_timed_after_a_target_forward_and_without_it(tiny, tokenizer):
    """decode commits right after the target's verification forward, which evicts the head's
    weights from the caches: measure_trees runs that forward before every timed commit, outside
    the commit's time (here a 50 ms sleep stands in for it, far longer than the tiny commit)."""
    from lab.costmodel import draft_positions, greedy_continuations, measure_trees, verification_pass
    seqs = greedy_continuations(tiny, tokenizer, mt_bench(1), 12, (tiny.config.num_hidden_layers,))
    picks = draft_positions(seqs, 4, 0)
    calls = []
    forward = verification_pass(tiny, prefix=8)

    def before_commit():
        calls.append(1)
        forward()
        time.sleep(0.05)
    out = measure_trees(EagleHead(tiny).eval(), seqs, picks, depths=(2,), top_ks=(2,), sizes=(4,),
                        before_commit=before_commit)
    assert len(calls) == len(picks) == out["positions"]
    assert out["commit_seconds"] < 0.05 and out["commit_seconds_repeated"] < 0.05

def test_ar_time_splits_into_prefill_forwards_and_the_loop(tiny, tokenizer):
    """The timed engine sees decode's prefill first, then one forward per new token."""
    from lab.costmodel.tau import _TimedEngine, greedy_continuations
    engine = _TimedEngine(Engine(tiny))
    prompt = prompts(tokenizer, 1)[0]
    out = decode(engine, NoDraft(), prompt, 12, GREEDY, 0, 0, None)
    assert len(engine.seconds) == 1 + len(out.tokens) and engine.forwards == len(engine.seconds)
    c = greedy_continuations(tiny, tokenizer, mt_bench(1), 12, (tiny.config.num_hidden_layers,))[0]
    assert c.ids[c.prompt_len:] == decode(Engine(tiny), NoDraft(), c.ids[: c.prompt_len], 12, GREEDY, 0, 0,
                                          tokenizer.eos_token_id).tokens
    assert 0 < c.prefill_seconds and 0 < c.forward_seconds and c.prefill_seconds + c.forward_seconds < c.seconds


@pytest.mark.slow
def test_walked_tau_is_decodes_tau_on_the_exact_engine(target_bf16, tokenizer):
    """On the batch-invariant engine the tuner's walk along AR's continuations reproduces
    decode's tau for dynamic and static trees to the bit."""
    from lab.costmodel import greedy_continuations, walk_tau
    from lab.target.load import engine_for
    head = load_head(target_bf16, "eagle1")
    questions = mt_bench()[10:13]
    seqs = greedy_continuations(target_bf16, tokenizer, questions, 48, head.feature_layers)
    shape = static_shape(8, 3, [0.5, 0.2, 0.1])
    for make, depth in ((lambda: EagleDraft(head, "dynamic", 3, 4, 8), 3),
                        (lambda: EagleDraft(head, "static", shape=shape), 3)):
        tokens = cycles = 0
        for q, c in zip(questions, seqs):
            out = decode(engine_for(target_bf16), make(), chat_ids(tokenizer, q.text), 48, GREEDY, depth, 0,
                         tokenizer.eos_token_id)
            assert out.tokens == c.ids[c.prompt_len:]
            tokens, cycles = tokens + len(out.tokens), cycles + out.cycles
        assert tokens / cycles > 1.3  # the head does accept drafts: the walk has runs to skip
        assert walk_tau(make(), seqs, depth) == tokens / cycles


def test_training_resumes_from_a_checkpoint_and_refuses_a_wrong_one(tiny, tmp_path, monkeypatch):
    import json

    import lab.train.checkpoint as checkpoint
    monkeypatch.setattr(checkpoint, "CHECKPOINT_SECONDS", 0)                   # checkpoint after every step
    monkeypatch.setattr(checkpoint.Checkpoint, "finish", lambda self: None)    # as if the run had been killed
    out = tmp_path / "head.safetensors"
    data = small_set(6, 1)
    train_head(Eagle1Options(minutes=5.0, max_steps=4, eval_prompts=1), target=tiny, data=data, out=out)
    assert (tmp_path / "checkpoints" / "head.pt").exists()
    import lab.train.eagle as module
    calls, real_loss = [], module.head_loss
    monkeypatch.setattr(module, "head_loss", lambda *a: calls.append(1) or real_loss(*a))
    train_head(Eagle1Options(minutes=5.0, max_steps=6, eval_prompts=1, resume=True), target=tiny, data=data,
               out=out)
    assert json.loads(out.with_suffix(".json").read_text())["steps"] == 6 and len(calls) == 2  # from step 4
    with pytest.raises(LabError, match="drop --resume"):
        train_head(Eagle1Options(variant="no-token", minutes=5.0, max_steps=6, eval_prompts=1, resume=True),
                   target=tiny, data=data, out=out)


def test_tuning_refuses_rounds_a_busy_machine_made_disagree():
    from lab.costmodel import agreeing_rounds
    from lab.errors import LabError
    quiet = [{1: 0.020, 8: 0.024}, {1: 0.021, 8: 0.025}, {1: 0.023, 8: 0.024}]
    assert agreeing_rounds(quiet, measure=lambda: pytest.fail("quiet rounds need no more")) == quiet
    # the review's busy machine: T(2..6) ten times T(1) in one round; a fourth round agrees
    busy = [{1: 0.2, 4: 2.6}, {1: 0.2, 4: 0.21}, {1: 0.35, 4: 0.5}]
    assert len(agreeing_rounds(busy, measure=lambda: {1: 0.2, 4: 0.22})) == 4
    with pytest.raises(LabError, match="busy"):
        agreeing_rounds(busy, measure=lambda: {1: 0.9, 4: 4.0})


def test_monotone_latency_pools_dips_and_keeps_increasing_curves():
    from lab.costmodel import monotone
    rising = {1: 0.03, 4: 0.05, 16: 0.08}
    assert monotone(rising) == rising
    smoothed = monotone({1: 0.03, 16: 0.084, 20: 0.076, 24: 0.095})
    assert smoothed[16] == smoothed[20] == (0.084 + 0.076) / 2
    values = [smoothed[n] for n in sorted(smoothed)]
    assert values == sorted(values) and smoothed[1] == 0.03 and smoothed[24] == 0.095


def test_training_budget_sums_the_warm_start_chain():
    from lab.drafters.heads import training_budget
    first = {"cpu_budget_minutes": 30, "steps": 1500, "data": {"train_response_tokens": 200}, "init": None}
    second = {"cpu_budget_minutes": 45, "steps": 2000, "init": {"path": "x", "manifest": first},
              "data": {"train_response_tokens": 200, "sharegpt_reply_tokens": 400}}
    assert training_budget(first) == {"cpu_minutes": 30, "gpu_minutes": 0.0, "steps": 1500, "stages": 1,
                                      "train_tokens": 200}
    assert training_budget(second) == {"cpu_minutes": 75, "gpu_minutes": 0.0, "steps": 3500, "stages": 2,
                                       "train_tokens": 600}


def test_cached_features_keep_the_sequence_order(tiny):
    from lab.train.features import target_features
    lengths = [9, 3, 12, 5, 7]  # batched by length inside a chunk, returned in this order
    seqs = [np.arange(1, n + 1, dtype=np.uint16) * (i + 2) for i, n in enumerate(lengths)]
    data = RegenSet(np.concatenate(seqs), np.cumsum([0] + lengths), np.full(len(seqs), 2, np.int32),
                    np.ones(len(seqs), np.uint8))
    layer = tiny.config.num_hidden_layers
    feats = target_features(tiny, data, (layer,), batch=2, progress=False)
    for i, s in enumerate(seqs):
        with torch.no_grad():
            alone = tiny.model(input_ids=torch.from_numpy(s.astype(np.int64))[None],
                               output_hidden_states=True).hidden_states[layer][0]
        assert torch.allclose(torch.from_numpy(feats[i].astype(np.float32)), alone, atol=1e-2, rtol=1e-2)


def test_training_starts_from_its_init_head(tiny, tmp_path, monkeypatch):
    import json

    import lab.drafters.heads
    monkeypatch.setattr(lab.drafters.heads, "HEAD_DIR", tmp_path)  # --init NAME: data/eagle/NAME.safetensors
    first, second = tmp_path / "first.safetensors", tmp_path / "second.safetensors"
    train_head(Eagle1Options(name="first", minutes=5.0, max_steps=3, lr=3e-3, eval_prompts=1), target=tiny,
               data=small_set())
    # learning rate 0: the continued head must still be exactly the one it started from
    train_head(Eagle1Options(name="second", init="first", minutes=5.0, max_steps=1, lr=0.0, eval_prompts=1),
               target=tiny, data=small_set())
    a, b = load_head(tiny, "eagle1", first), load_head(tiny, "eagle1", second)
    assert all(torch.equal(a.own_state()[k], b.own_state()[k]) for k in a.own_state())
    manifest = json.loads(second.with_suffix(".json").read_text())
    assert manifest["init"]["manifest"]["steps"] == 3 and manifest["steps"] == 1


def test_a_given_tree_takes_the_tuned_vocabulary_and_predictions(tmp_path):
    import json

    from lab.costmodel import given_tree, load_choice
    assert given_tree(3, 2, 8, tmp_path / "missing.json").draft_vocab == 8192
    tuned = {"dtype": "float32", "choice": {"draft_vocab": 4096},
             "dynamic": [{"depth": 3, "top_k": 2, "total_tokens": 8, "tau": 2.0, "predicted_speedup": 1.1}],
             "static": [{"depth": 3, "total_tokens": 8, "tau": 1.9, "predicted_speedup": 1.05}]}
    (tmp_path / "t.json").write_text(json.dumps(tuned))
    t = given_tree(3, 2, 8, tmp_path / "t.json")
    assert (t.draft_vocab, t.predicted_tau, t.predicted_speedup, t.static_predicted_speedup) == (4096, 2.0, 1.1, 1.05)
    other = given_tree(4, 2, 8, tmp_path / "t.json")
    assert (other.predicted_speedup, other.static_predicted_speedup, other.draft_vocab) == (None, None, 4096)
    # a float32 tuning says nothing of bfloat16, whose T(n) differs: no prediction and no auto tree
    bf16 = given_tree(3, 2, 8, tmp_path / "t.json", dtype="bfloat16")
    assert (bf16.predicted_speedup, bf16.draft_vocab) == (None, 4096)
    with pytest.raises(LabError, match="tuned with the target in float32"):
        load_choice(tmp_path / "t.json", dtype="bfloat16")


def test_train_prompts_keeps_the_first_prompts_and_max_steps_sets_the_schedule(tiny, tmp_path):
    import json

    from lab.data import training_items
    data = small_set(12, 2)
    assert [i for _, i, _ in training_items([data], 3)] == [2, 3, 4]
    with pytest.raises(LabError, match="choose 0 to 10"):
        training_items([data], 11)
    # 0: none of the regenerated set, so the other sets alone (ShareGPT's replies), never nothing at all
    replies = small_set(6, 1)
    assert {s for s, _, _ in training_items([data, replies], 0)} == {1}
    with pytest.raises(LabError, match="add --replies"):
        training_items([data], 0)
    with pytest.raises(LabError, match="--snapshot-every"):
        Eagle1Options(snapshot_every=-1)
    out = tmp_path / "head.safetensors"
    train_head(Eagle1Options(variant="no-token", minutes=5.0, max_steps=3, eval_prompts=1, train_prompts=3),
               target=tiny, data=data, out=out)
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["data"]["train_sequences"] == 3 and manifest["data"]["train_prompts_limit"] == 3
    assert manifest["steps"] == 3 and manifest["optimiser"]["schedule"].endswith("cosine over the steps")
    assert manifest["cpu_budget_minutes"] < 5.0  # the minutes it took, not the unused time budget
