"""EAGLE-3: the unrolled training-time test equals drafting step by step, drafts stay inside the
draft vocabulary, drafting equals AR at temperature 0 and is lossless at temperature 1, the
serving-engine layout round-trips, training lowers the loss and resumes, and two processes
train what one process trains."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_eagle import prompts, small_set
from test_verify import chi2_pvalue
from test_verify_tree import no_renormalisation

from lab.decode import decode
from lab.drafters import EagleDraft, NoDraft
from lab.drafters.eagle3 import Eagle3Head, export_head, feature_layers
from lab.drafters.heads import load_head
from lab.errors import LabError
from lab.paths import EAGLE3_SHIPPED
from lab.sampling import RandomStream, Sampling
from lab.simulate import simulate_tree
from lab.target.engine import Engine
from lab.train.eagle3 import make_batch, train_eagle3
from lab.train.ttt import ttt_attention_mask, ttt_loss
from lab.train.options import Eagle3Options
from lab.viz.cycles import CycleRecorder

GREEDY = Sampling()


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Feature caches and checkpoints of these small runs go to a temporary folder."""
    import lab.train.eagle3 as module
    import lab.train.features as features
    monkeypatch.setattr(features, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(module, "CACHE_DIR", tmp_path)


def random_head(tiny, every: int = 7, seed: int = 0) -> Eagle3Head:
    """An untrained head with weights large enough that its drafts vary."""
    torch.manual_seed(seed)
    head = Eagle3Head(tiny, torch.arange(0, tiny.config.vocab_size, every))
    with torch.no_grad():
        for name, p in head.own_state().items():
            if name.endswith("proj.weight") or name in ("fc.weight", "lm_head.weight"):
                head.get_parameter(name).normal_(0, 0.2)
    return head.eval()


def test_feature_layers_are_the_states_entering_layers_2_middle_and_n_minus_3():
    assert feature_layers(30) == (2, 15, 27)
    assert feature_layers(32) == (2, 16, 29)


def test_unrolled_steps_equal_drafting_one_step_at_a_time(tiny):
    """Step s at index t of the one-pass unrolled forward is the s-th draft of the chain rooted
    at true pair t: feeding the true pairs 0..t, then the head's own states one by one through
    the drafting cache (positions t+1, t+2, ...) gives the same states."""
    head = random_head(tiny)
    t_len, steps, h = 10, 4, tiny.config.hidden_size
    features = torch.randn(1, t_len, 3 * h)
    tokens = torch.randint(0, tiny.config.vocab_size, (1, t_len))
    with torch.no_grad():
        outs = head(features, tokens, torch.ones(1, t_len, dtype=torch.bool), steps)
    for t in range(t_len):
        cache = head.drafter_state()
        state = cache.run(head.project(features[0, : t + 1]), tokens[0, : t + 1])[-1:]
        torch.testing.assert_close(state[0], outs[0][0, t], rtol=1e-4, atol=1e-4)
        for s in range(1, min(steps, t_len - t)):
            state = cache.run(state, tokens[0, t + s: t + s + 1])
            torch.testing.assert_close(state[0], outs[s][0, t], rtol=1e-4, atol=1e-4)


def test_a_normed_head_ignores_each_taps_scale_and_drafts_as_it_trains(tiny, tmp_path):
    """taps="fused-normed": scaling one tap by 1000 (a tap on another scale than the others) leaves the
    fused state unchanged, the drafting cache projects as the head does, and the norms survive a
    save and load. The plain fused head, by contrast, is moved by the scale."""
    from lab.drafters.heads import save_head
    torch.manual_seed(0)
    h = tiny.config.hidden_size
    features = torch.randn(5, 3 * h)
    louder = torch.cat([features[:, :2 * h], 1000 * features[:, 2 * h:]], -1)
    plain = random_head(tiny)
    normed = Eagle3Head(tiny, plain.vocab, taps="fused-normed").eval()
    normed.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        normed.tap_norms[1].weight.fill_(0.5)
        torch.testing.assert_close(normed.project(louder), normed.project(features), rtol=1e-4, atol=1e-4)
        assert not torch.allclose(plain.project(louder), plain.project(features), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(normed.drafter_state().project(features), normed.project(features))
    save_head(normed, tmp_path / "normed.safetensors")
    loaded = load_head(tiny, path=tmp_path / "normed.safetensors")
    assert loaded.taps == "fused-normed" and torch.equal(loaded.tap_norms[1].weight, normed.tap_norms[1].weight)


def test_the_bfloat16_drafting_copies_compute_the_heads_own_layer(tiny):
    """In bfloat16 the drafting cache runs packed copies of the head's linears (`fast_linear`,
    where this CPU runs them): the same layer and readout as the head's modules, up to bfloat16
    rounding. A copy wired to the wrong weight would be off by the states' whole size."""
    import copy
    head = copy.deepcopy(random_head(tiny)).to(torch.bfloat16)
    h, n = tiny.config.hidden_size, 6
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(n, 3 * h, generator=gen).to(torch.bfloat16)
    tokens = torch.randint(0, tiny.config.vocab_size, (n,), generator=gen)
    with torch.inference_mode():
        cache = head.drafter_state()
        got = cache.run(cache.project(features), tokens)
        state = head.project(features)
        q, k, v = head.midlayer.qkv(state, head.embed_tokens(tokens), torch.arange(n))
        want = head.midlayer.finish(state, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        relative = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
        assert relative(got, want) < 0.02
        assert relative(cache.logits(got), head.logits(want)) < 0.05


def test_the_drawn_attention_mask_is_what_the_unrolled_forward_computes(tiny):
    """Attention with the explicit mask of `ttt_attention_mask` over all steps' keys (the
    picture in notebook 06) gives the unrolled forward's states; a mask without the diagonal
    entries does not."""
    head = random_head(tiny, seed=1)
    t_len, steps, h = 6, 3, tiny.config.hidden_size
    features, tokens = torch.randn(1, t_len, 3 * h), torch.randint(0, 1000, (1, t_len))
    mask = ttt_attention_mask(t_len, steps)
    with torch.no_grad():
        outs = head(features, tokens, torch.ones(1, t_len, dtype=torch.bool), steps)

        def explicit(mask):
            cache = head.drafter_state()
            state = head.project(features[0])
            for s in range(steps):
                rows = slice(s * t_len, (s + 1) * t_len)
                shifted = torch.cat([tokens[0, s:], tokens.new_zeros(s)])
                state = cache.run(state, shifted, mask[rows, : (s + 1) * t_len], torch.arange(t_len) + s)
            return state
        torch.testing.assert_close(explicit(mask), outs[-1][0], rtol=1e-4, atol=1e-4)
        broken = mask.clone()
        broken[t_len:, t_len:] = False  # later steps would not see their own chain
        broken[torch.arange(steps * t_len), torch.arange(steps * t_len)] = True
        assert not torch.allclose(explicit(broken), outs[-1][0], rtol=1e-3, atol=1e-3)


def test_drafts_stay_inside_the_draft_vocabulary(tiny, tokenizer):
    head = random_head(tiny, every=5)
    drafter = EagleDraft(head, "dynamic", 3, 4, 12)
    allowed = set(head.vocab.tolist())
    for sampling in (GREEDY, Sampling(1.0)):  # every cycle of a greedy and of a sampled decode
        recorder = CycleRecorder(sampling)
        decode(Engine(tiny), drafter, prompts(tokenizer, 1)[0], 20, sampling, 3, 0, None, on_cycle=recorder)
        drafted = {t for r in recorder.records for t in r.tree.tokens[1:]}
        assert drafted and drafted <= allowed
    with pytest.raises(LabError, match="own vocabulary"):
        EagleDraft(head, "dynamic", vocab=torch.arange(10))


def test_eagle3_equals_ar_tiny(tiny, tokenizer):
    head = random_head(tiny)
    target = Engine(tiny)
    for prompt in prompts(tokenizer, 4):
        ar = decode(target, NoDraft(), prompt, 24, GREEDY, 0, 0, tokenizer.eos_token_id)
        out = decode(target, EagleDraft(head, "dynamic", 4, 3, 10), prompt, 24, GREEDY, 4, 0, tokenizer.eos_token_id)
        assert out.tokens == ar.tokens and out.cycles <= ar.cycles


def test_eagle3_static_tree_equals_ar_tiny(tiny, tokenizer):
    """`eagle3-static`: the EAGLE-3 head drafting EAGLE-1's static tree, shaped by the head's
    per-rank accuracy, as the bench builds it."""
    from lab.bench import Setup
    from lab.costmodel import given_tree
    setup = Setup(tiny, None, tokenizer, GREEDY, 24, 3, 0, head3=random_head(tiny),
                  eagle3_tree=given_tree(3, 3, 8, head="eagle3"), rank_accuracy3=[0.4, 0.2, 0.1])
    drafter = setup.eagle_drafter("eagle3-static")
    assert drafter.mode == "static" and drafter.head is setup.head3
    target = Engine(tiny)
    for prompt in prompts(tokenizer, 3):
        ar = decode(target, NoDraft(), prompt, 24, GREEDY, 0, 0, tokenizer.eos_token_id)
        out = decode(target, drafter, prompt, 24, GREEDY, 3, 0, tokenizer.eos_token_id)
        assert out.tokens == ar.tokens and out.cycles <= ar.cycles


@pytest.mark.slow
def test_eagle3_equals_ar_real(target, tokenizer, real_ar):
    """The shipped head on 8 MT-Bench prompts: exactly AR's tokens, and it accepts drafts."""
    head = load_head(target, EAGLE3_SHIPPED)
    engine, tokens, cycles = Engine(target), 0, 0
    for prompt, ar in real_ar(8, 24):
        out = decode(engine, EagleDraft(head, "dynamic", 4, 4, 12), prompt, 24, GREEDY, 4, 0, tokenizer.eos_token_id)
        assert out.tokens == ar
        tokens, cycles = tokens + len(out.tokens), cycles + out.cycles
    assert tokens / cycles > 1.5


@pytest.mark.slow
def test_eagle3_trees_verify_losslessly_and_the_check_can_fail(tiny, tokenizer):
    """A tree an EAGLE-3 drafter built, its tokens relabelled 0..K-1, verified against
    context-free target rows at temperature 1: the first and second emitted tokens follow the
    target; verification without renormalisation after a rejected sibling is caught."""
    head = random_head(tiny, seed=2)
    drafter = EagleDraft(head, "dynamic", 2, 3, 7)
    context = prompts(tokenizer, 1)[0]
    drafter.begin(context)
    scored = Engine(tiny).forward(context[:-1], hidden_layers=head.feature_layers, last_only=True)
    drafter.commit(context, torch.cat([scored.hidden[layer] for layer in head.feature_layers], -1))
    tree = drafter.propose(context, 2, Sampling(1.0), RandomStream(0))
    assert len(tree) == 7 and max(tree.depths()) == 2
    alphabet = sorted(set(tree.tokens[1:]))
    size = len(alphabet) + 2  # two tokens no draft proposes
    tokens = [size - 1] + [alphabet.index(t) for t in tree.tokens[1:]]
    g = torch.Generator().manual_seed(5)
    by_depth = torch.softmax(torch.randn(3, size, generator=g) * 1.5, -1)
    p = by_depth[tree.depths()]
    sim = simulate_tree(tokens, tree.parents, p, 20_000, seed=3)
    second_depth = by_depth[1]
    assert chi2_pvalue(sim.first, by_depth[0].numpy()) > 1e-3
    assert chi2_pvalue(sim.second, second_depth.numpy()) > 1e-3
    wrong = simulate_tree(tokens, tree.parents, p, 20_000, seed=3, verify=no_renormalisation)
    assert chi2_pvalue(wrong.first, by_depth[0].numpy()) < 1e-6


def test_export_writes_every_weight_and_the_vocabulary_maps(tiny, tmp_path):
    """The serving layout holds each of the head's own tensors unchanged (the layer under
    midlayer.) and the draft vocabulary as d2t (an offset) and t2d (a mask)."""
    head = random_head(tiny, every=3)
    folder = export_head(head, tmp_path / "export", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == len(head.vocab)
    from safetensors.torch import load_file
    tensors = load_file(str(folder / "model.safetensors"))
    assert torch.equal(torch.arange(len(head.vocab)) + tensors["d2t"], head.vocab)  # d2t is an offset
    assert torch.equal(tensors["t2d"].nonzero()[:, 0], head.vocab)
    own = {k: v for k, v in head.own_state().items() if k != "vocab"}
    assert set(tensors) == set(own) | {"d2t", "t2d"}
    assert "midlayer.self_attn.q_proj.weight" in own and "midlayer.hidden_norm.weight" in own
    assert all(torch.equal(tensors[k], v.float()) for k, v in own.items())


def test_ttt_loss_masks_tokens_outside_the_vocabulary_and_the_prompt(tiny):
    """A batch whose every target argmax lies outside the draft vocabulary scores nothing;
    with the vocabulary covering everything, every response position of step 0 is scored."""
    d = small_set(3, 0)
    h = tiny.config.hidden_size
    items = [(d.ids(i), np.random.default_rng(i).standard_normal((len(d.ids(i)), 4 * h)).astype(np.float16),
              int(d.prompt_lens[i])) for i in range(3)]
    batch = make_batch(items, h)
    weight = tiny.lm_head.weight.detach()
    argmax = torch.nn.functional.linear(batch[2], weight).argmax(-1)
    outside = Eagle3Head(tiny, torch.tensor(sorted(set(range(200)) - set(argmax.flatten().tolist()))[:50]))
    loss, ces, _, _ = ttt_loss(outside, batch, weight, steps=2)
    assert float(loss.detach()) == 0.0 and all(np.isnan(ces))
    everything = Eagle3Head(tiny, torch.arange(tiny.config.vocab_size))
    loss, ces, _, _ = ttt_loss(everything, batch, weight, steps=2)
    assert float(loss.detach()) > 0 and not np.isnan(ces[0])


def test_ttt_loss_runs_only_the_chains_it_scores(tiny, monkeypatch):
    """`ttt_loss` runs only the chains that have a scored step (`chain_rows`); running every
    index instead gives the same loss and gradients. Dropping the chains rooted in the last
    S - 1 prompt positions, whose later steps are response tokens, changes the gradients."""
    import lab.train.ttt as module
    d = small_set(3, 0)
    h, steps = tiny.config.hidden_size, 3
    items = [(d.ids(i), np.random.default_rng(i).standard_normal((len(d.ids(i)), 4 * h)).astype(np.float16),
              int(d.prompt_lens[i])) for i in range(3)]
    batch = make_batch(items, h)
    weight = tiny.lm_head.weight.detach()
    head = random_head(tiny, every=1)
    _, _, _, pad, start = batch
    rows = module.chain_rows(pad, start, steps)
    assert rows.shape[1] < pad.shape[1] and int(rows[0, 0]) == int(start[0]) - (steps - 1)

    def loss_and_grads():
        head.zero_grad()
        loss = ttt_loss(head, batch, weight, steps=steps)[0]
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in head.parameters() if p.grad is not None]

    loss, grads = loss_and_grads()
    every_index = lambda pad, start, steps: torch.arange(pad.shape[1]).expand(pad.shape[0], -1)  # noqa: E731
    monkeypatch.setattr(module, "chain_rows", every_index)
    full_loss, full_grads = loss_and_grads()
    assert loss == pytest.approx(full_loss, rel=1e-5)
    for g, full in zip(grads, full_grads):
        torch.testing.assert_close(g, full, rtol=1e-4, atol=1e-6)
    too_few = lambda pad, start, steps: torch.where(  # noqa: E731
        rows >= start[:, None], rows, torch.full_like(rows, -1))
    monkeypatch.setattr(module, "chain_rows", too_few)
    assert not all(torch.allclose(g, full, rtol=1e-2, atol=1e-6) for g, full in zip(loss_and_grads()[1], grads))


def test_the_argmax_memo_gives_what_the_lm_head_gives(tiny, monkeypatch):
    """`target_argmax` with a memo returns the full LM head's argmax for every sequence, also in
    batches that mix sequences seen before with new ones, in another order; a batch of seen
    sequences does not apply the LM head again."""
    import lab.train.ttt as module
    weight = tiny.lm_head.weight.detach()
    torch.manual_seed(0)
    seqs = [torch.randn(n, tiny.config.hidden_size) for n in (5, 3, 4)]
    direct = [F.linear(x, weight).argmax(-1) for x in seqs]
    memo: dict = {}

    def memoised(order):
        return module.target_argmax(torch.cat([seqs[i] for i in order]), [len(seqs[i]) for i in order], weight, memo)

    for order in ([0, 1], [2, 0], [1, 2, 0]):
        assert torch.equal(memoised(order), torch.cat([direct[i] for i in order]))
    assert len(memo) == 3
    monkeypatch.setattr(module.F, "linear", lambda *a: pytest.fail("the LM head was applied again"))
    assert torch.equal(memoised([2, 1]), torch.cat([direct[2], direct[1]]))


def test_training_lowers_the_loss_resumes_and_round_trips(tiny, tmp_path, monkeypatch):
    import lab.train.checkpoint as checkpoint
    out = tmp_path / "head3.safetensors"
    train_eagle3(Eagle3Options(max_steps=45, lr=1e-2, eval_prompts=1, draft_vocab=2048, batch=2, ttt_steps=2,
                               heldout_every=15, snapshot_every=15), target=tiny, data=small_set(), out=out,
                 progress=False)
    manifest = json.loads(out.with_suffix(".json").read_text())
    # the head along the run, every 15 steps: the last snapshot is the final head, the first is not
    snapshots = [out.with_name(f"head3-step{n}.safetensors") for n in (15, 30, 45)]
    assert all(p.exists() for p in snapshots) and len(list(tmp_path.glob("head3-step*"))) == 3
    final, last, first = (load_head(tiny, path=p).own_state() for p in (out, snapshots[-1], snapshots[0]))
    assert all(torch.equal(final[k], last[k]) for k in final)
    assert any(not torch.equal(final[k], first[k]) for k in final)
    assert manifest["steps"] == 45 and len(manifest["evaluation"]["top1_by_depth"]["rate"]) == 6
    validation = manifest["validation_loss"]  # the held-out loss every 15 steps, and the verdict on it
    assert [step for step, _ in validation["curve"]] == [15, 30, 45]
    assert validation["verdict"] in ("trained enough", "capped") and validation["relative_change"] >= 0
    assert manifest["loss_last_20"]["ce_by_step"][0] < manifest["loss_first_20"]["ce_by_step"][0]
    assert manifest["draft_vocab"]["size"] == 2048 and manifest["feature_cache"][0]["gigabytes"] >= 0
    head = load_head(tiny, path=out)
    assert torch.equal(head.vocab, load_head(tiny, path=out).vocab)
    # killed after 3 of 5 steps, then resumed: only the remaining 2 run
    monkeypatch.setattr(checkpoint, "CHECKPOINT_SECONDS", 0)
    monkeypatch.setattr(checkpoint.Checkpoint, "finish", lambda self: None)
    again = tmp_path / "again.safetensors"
    small = Eagle3Options(max_steps=3, eval_prompts=1, draft_vocab=512, batch=2, ttt_steps=2)
    train_eagle3(small, target=tiny, data=small_set(), out=again, progress=False)
    import lab.train.eagle3 as module
    calls, real = [], module.ttt_loss
    monkeypatch.setattr(module, "ttt_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    train_eagle3(replace(small, max_steps=5, resume=True), target=tiny, data=small_set(), out=again, progress=False)
    assert len(calls) == 2 and json.loads(again.with_suffix(".json").read_text())["steps"] == 5
    with pytest.raises(LabError, match="drop --resume"):
        train_eagle3(replace(small, max_steps=5, resume=True, ttt_steps=3), target=tiny, data=small_set(), out=again,
                     progress=False)


def test_the_tuner_prices_eagle3_trees_over_the_heads_own_vocabulary(tiny, tokenizer, trusted_timings):
    from lab.costmodel import tune
    from lab.data import mt_bench
    head = random_head(tiny, every=4)
    result = tune(tiny, tokenizer, head, prompts=mt_bench()[:2], max_new_tokens=10, positions=6, prefix=16, path=None,
                  rank_accuracy=[0.3, 0.1], depths=(2,), top_ks=(2,), sizes=(2, 4))
    assert result["head"] == EAGLE3_SHIPPED and result["draft_vocab_size"] == len(head.vocab)
    assert all(1 <= r["tau"] <= r["total_tokens"] for r in result["dynamic"])


@pytest.mark.slow
def test_tau_at_a_fixed_tree_gives_each_head_its_own_layers(target, tokenizer):
    """The shipped heads of both kinds scored on one shared decoding: each head's tau equals what
    the tuner's measurement gives on continuations decoded with that head's layers alone."""
    from lab.costmodel import draft_positions, greedy_continuations, measure_trees, tau_at_tree
    from lab.data import mt_bench
    heads = {"eagle3": load_head(target, EAGLE3_SHIPPED), "eagle1": load_head(target, "eagle1")}
    tree, prompts = (3, 2, 4), mt_bench()[:2]
    shared = tau_at_tree(target, tokenizer, heads, tree, prompts=prompts, max_new_tokens=24, positions=12)
    for name, head in heads.items():
        seqs = greedy_continuations(target, tokenizer, prompts, 24, head.feature_layers)
        alone = measure_trees(head, seqs, draft_positions(seqs, 12, 0), depths=(3,), top_ks=(2,), sizes=(4,))
        assert shared[name]["tau"] == pytest.approx(alone["dynamic"][0]["tau"]) and shared[name]["tau"] > 1.2, name
        by_prompt = shared[name]["by_prompt"]
        assert sum(r["positions"] for r in by_prompt) == 12
    # a shape per head: the fixed tree for one, a smaller tree for the other, on the same positions
    own = tau_at_tree(target, tokenizer, heads, {"eagle3": tree, "eagle1": (2, 2, 3)}, prompts=prompts,
                      max_new_tokens=24, positions=12)
    seqs = greedy_continuations(target, tokenizer, prompts, 24, heads["eagle1"].feature_layers)
    smaller = measure_trees(heads["eagle1"], seqs, draft_positions(seqs, 12, 0), depths=(2,), top_ks=(2,), sizes=(3,))
    assert own["eagle3"]["tau"] == pytest.approx(shared["eagle3"]["tau"])
    assert own["eagle1"]["tau"] == pytest.approx(smaller["dynamic"][0]["tau"])
    assert [r["prompt"] for r in own["eagle1"]["by_prompt"]] == [r["prompt"] for r in shared["eagle1"]["by_prompt"]]
    # the check can fail: the EAGLE-3 head fed its layers in the wrong order drafts worse trees
    wrong = heads["eagle3"]
    wrong.feature_layers = tuple(reversed(wrong.feature_layers))
    assert tau_at_tree(target, tokenizer, {"wrong": wrong}, tree, prompts=prompts, max_new_tokens=24,
                       positions=12)["wrong"]["tau"] < shared["eagle3"]["tau"]


def test_a_short_disk_fails_before_the_first_chunk(tiny, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from lab.train.features import target_features
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 1000))
    with pytest.raises(LabError, match="GB more at .*free disk space or set LAB_CACHE"):
        target_features(tiny, small_set(3, 0), (0, 1, 2, 2), progress=False)
    assert not list(tmp_path.rglob("chunk_*.npy"))


def test_the_tree_viewer_records_eagle3_cycles(tiny, tokenizer):
    """notebook 05's inspector records an EAGLE-3 drafter's cycles like any other: one record per
    cycle, the emitted tokens are the decoded ones (the prefill scores the prompt and emits
    nothing), and each cycle renders as an SVG tree."""
    from lab.viz.drawing import cycle_svg
    recorder = CycleRecorder(GREEDY)
    out = decode(Engine(tiny), EagleDraft(random_head(tiny, seed=3), "dynamic", 3, 3, 8), prompts(tokenizer, 1)[0],
                 16, GREEDY, 3, 0, None, on_cycle=recorder)
    assert len(recorder.records) == out.cycles  # one per verification forward (prefill not counted)
    assert [t for r in recorder.records for t in r.emitted] == out.tokens
    assert all(cycle_svg(r, tokenizer).startswith("<svg") for r in recorder.records)


def test_the_feature_loss_pulls_each_step_towards_the_top_feature_of_its_label(tiny, tmp_path):
    """--feature-loss w (an ablation: EAGLE-1's constraint put back) adds, for step s, w x the
    smooth-L1 between index t's output state and the target's top feature at t+1+s (the one
    whose LM head gives the distribution step s is scored against), averaged over the scored
    positions as the token loss is. Computed here position by position; the broken variant
    that pulls every step towards step 0's feature gives a different loss."""
    d = small_set(3, 0)
    h = tiny.config.hidden_size
    # features small at even positions and large at odd ones, so that one position off is far off
    items = [(d.ids(i), (np.random.default_rng(i).standard_normal((len(d.ids(i)), 4 * h))
                         * np.where(np.arange(len(d.ids(i))) % 2 == 0, 0.1, 3.0)[:, None]).astype(np.float16),
              int(d.prompt_lens[i])) for i in range(3)]
    batch = make_batch(items, h)
    features, tokens, top, pad, start = batch
    weight = tiny.lm_head.weight.detach()
    torch.manual_seed(0)
    head = Eagle3Head(tiny, torch.arange(tiny.config.vocab_size))  # every label in vocabulary
    plain, plain_ces, _, no_feats = ttt_loss(head, batch, weight, steps=2)
    pulled, ces, _, feats = ttt_loss(head, batch, weight, steps=2, feature_weight=0.5)
    assert no_feats == [] and ces == plain_ces and len(feats) == 2
    with torch.no_grad():
        outs = head(features, tokens, pad, 2)

    def slow(label_shift):
        extra, means = 0.0, []
        for s in range(2):
            terms = [torch.nn.functional.smooth_l1_loss(outs[s][b, t], top[b, t + label_shift(s)])
                     for b in range(len(items)) for t in range(tokens.shape[1])
                     if int(start[b]) <= t + s < int(pad[b].sum())]
            means.append(float(torch.stack(terms).mean()))
            extra += 0.8 ** s * 0.5 * means[-1]
        return extra, means

    extra, means = slow(lambda s: s)
    assert float(pulled - plain) == pytest.approx(extra, rel=1e-4) and feats == pytest.approx(means, rel=1e-4)
    assert float(pulled - plain) != pytest.approx(slow(lambda s: 0)[0], rel=1e-2)
    out = tmp_path / "pulled.safetensors"
    train_eagle3(Eagle3Options(max_steps=2, eval_prompts=1, draft_vocab=512, batch=2, ttt_steps=2, feature_loss=0.5),
                 target=tiny, data=small_set(), out=out, progress=False)
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["objective"]["feature_regression"]["weight_against_token_loss"] == 0.5
    assert len(manifest["loss_last_20"]["feature_by_step"]) == 2 and len(manifest["loss_last_20"]["top1_by_step"]) == 2
    with pytest.raises(LabError, match="--feature-loss"):
        train_eagle3(Eagle3Options(max_steps=1, feature_loss=-1.0), target=tiny, data=small_set(), out=out,
                     progress=False)
