"""The decoding loop: sd equals ar at temperature 0; EOS and max_new_tokens inside an
accepted block; reproducible sampling."""
import pytest

from lab.data import chat_ids, mt_bench, sharegpt_first_turns
from lab.decode import decode
from lab.drafters import ModelDraft, NoDraft, ReferenceDraft
from lab.sampling import Sampling
from lab.target.engine import Engine
from lab.target.load import load_draft, make_draft

GREEDY = Sampling()


def prompts(tokenizer, n):
    texts = [p.text for p in mt_bench()] + [p.text for p in sharegpt_first_turns()[:n]]
    return [chat_ids(tokenizer, t)[-200:] for t in texts[:n]]


def assert_sd_equals_ar(model, draft, tokenizer, references, new_tokens):
    """`references`: (prompt, AR's greedy tokens) pairs for `model`."""
    target = Engine(model)
    for prompt, ar in references:
        sd = decode(target, ModelDraft(draft), prompt, new_tokens, GREEDY, 4, 0, tokenizer.eos_token_id)
        assert sd.tokens == ar
        assert sd.cycles <= len(ar)  # AR takes one forward per token


def ar_runs(model, tokenizer, n_prompts, new_tokens):
    target = Engine(model)
    runs = [(p, decode(target, NoDraft(), p, new_tokens, GREEDY, 0, 0, tokenizer.eos_token_id))
            for p in prompts(tokenizer, n_prompts)]
    assert all(out.tau == 1.0 for _, out in runs)
    return [(p, out.tokens) for p, out in runs]


def test_sd_equals_ar_tiny(tiny, tokenizer):
    assert_sd_equals_ar(tiny, make_draft(tiny, 1), tokenizer, ar_runs(tiny, tokenizer, 20, 32), 32)


@pytest.mark.slow
def test_sd_equals_ar_real(target, tokenizer, real_ar):
    assert_sd_equals_ar(target, load_draft(target, 1), tokenizer, real_ar(8, 32), 32)


def test_eos_inside_an_accepted_block(target, tokenizer):
    prompt = prompts(tokenizer, 1)[0]
    ar = decode(Engine(target), NoDraft(), prompt, 12, GREEDY, 0, 0, eos_id=None)
    # pretend the 7th token is EOS: it sits inside the second 4-draft accepted block
    eos = ar.tokens[6]
    assert eos not in ar.tokens[:6], "pick a prompt whose 7th token is new"
    out = decode(Engine(target), ReferenceDraft(len(prompt), ar.tokens), prompt, 12, GREEDY, 4, 0, eos_id=eos)
    assert out.tokens == ar.tokens[:7]
    assert out.origins == ["draft"] * 4 + ["bonus"] + ["draft"] * 2
    # the second cycle accepted 4 drafts, but only 2 of them (up to EOS) are text
    assert out.accepted_per_cycle == [4, 2]
    assert out.attempted_by_position == [2, 2, 1, 1] and out.accepted_by_position == [2, 2, 1, 1]


def test_max_new_tokens_reached_inside_an_accepted_block(tiny, tokenizer):
    prompt = prompts(tokenizer, 1)[0]
    ar = decode(Engine(tiny), NoDraft(), prompt, 7, GREEDY, 0, 0, eos_id=None)
    out = decode(Engine(tiny), ReferenceDraft(len(prompt), ar.tokens), prompt, 7, GREEDY, 4, 0, eos_id=None)
    assert len(out.tokens) == 7 and out.tokens == ar.tokens
    assert out.cycles == 2  # 4 drafts + bonus, then 1 draft + bonus


def test_sampling_is_reproducible_per_seed(tiny, tokenizer):
    prompt = prompts(tokenizer, 1)[0]
    s = Sampling(1.0, top_p=0.9)
    draft = make_draft(tiny, 1)
    a = decode(Engine(tiny), ModelDraft(draft), prompt, 16, s, 3, seed=5, eos_id=None)
    b = decode(Engine(tiny), ModelDraft(draft), prompt, 16, s, 3, seed=5, eos_id=None)
    c = decode(Engine(tiny), ModelDraft(draft), prompt, 16, s, 3, seed=6, eos_id=None)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_empty_prompt_is_an_error(tiny):
    with pytest.raises(ValueError, match="empty prompt"):
        decode(Engine(tiny), NoDraft(), [], 4, GREEDY, 0, 0, None)


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(1.0, top_p=0.9)], ids=["greedy", "T=1,top-p"])
def test_triton_verification_gives_the_same_tokens_as_the_reference(tiny, tokenizer, sampling):
    prompt = prompts(tokenizer, 1)[0]
    draft = make_draft(tiny, 1)
    runs = [decode(Engine(tiny), ModelDraft(draft), prompt, 8, sampling, 3, seed=1, eos_id=None, kernel=k)
            for k in ("torch", "triton")]
    assert runs[0].tokens == runs[1].tokens and runs[0].cycles == runs[1].cycles


def test_kernel_choice_is_validated(tiny, monkeypatch):
    from lab.decode import resolve_kernel
    from lab.errors import LabError
    assert resolve_kernel(None, tiny.device) == "torch"
    with pytest.raises(LabError, match="choose torch or triton"):
        resolve_kernel("cuda", tiny.device)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(LabError, match="needs a GPU"):
        resolve_kernel("triton", tiny.device)


def test_one_token_left_means_no_drafts_at_any_temperature(tiny, tokenizer):
    prompt = prompts(tokenizer, 1)[0]
    for s in (GREEDY, Sampling(1.0)):
        out = decode(Engine(tiny), ModelDraft(make_draft(tiny, 1)), prompt, 1, s, 4, seed=0, eos_id=None)
        assert len(out.tokens) == 1 and out.origins == ["target"]


def test_the_time_inside_the_drafter_is_counted_and_summarised(tiny, tokenizer):
    import time

    from lab.bench import summarise
    from lab.data import Prompt

    class SlowDraft(ReferenceDraft):  # 20 ms per proposal and per commit, nothing else changed
        def propose(self, *args):
            time.sleep(0.02)
            return super().propose(*args)

        def commit(self, *args):
            time.sleep(0.02)
            return super().commit(*args)
    prompt = tokenizer("Time the drafter", add_special_tokens=False).input_ids
    fast = decode(Engine(tiny), NoDraft(), prompt, 6, GREEDY, 3, 0, None)
    slow = decode(Engine(tiny), SlowDraft(len(prompt), list(range(300, 340))), prompt, 6, GREEDY, 3, 0, None)
    # every proposal and every commit (the prefill's included) slept inside the drafter
    assert 0.02 * (2 * slow.cycles + 1) <= slow.draft_seconds < slow.seconds
    assert fast.draft_seconds < 0.01 * fast.seconds + 0.005
    rows = [(Prompt("p", "Time the drafter"), slow)]
    assert summarise("sd", rows, None, True, tokenizer, ours=True)["draft_share"] == slow.draft_seconds / slow.seconds
    assert summarise("hf", rows, None, True, tokenizer, ours=False)["draft_share"] is None


def test_the_time_in_verification_cycles_is_counted_apart_from_drafting_and_prefill(tiny, tokenizer):
    import time

    from lab.bench import summarise
    from lab.data import Prompt

    class SlowEngine(Engine):  # 20 ms per forward, the prefill's included
        def forward(self, *args, **kwargs):
            time.sleep(0.02)
            return super().forward(*args, **kwargs)

    class SlowDraft(ReferenceDraft):  # 20 ms per proposal, which scoring must not count
        def propose(self, *args):
            time.sleep(0.02)
            return super().propose(*args)
    prompt = tokenizer("Time the scoring", add_special_tokens=False).input_ids
    out = decode(SlowEngine(tiny), SlowDraft(len(prompt), list(range(300, 340))), prompt, 6, GREEDY, 3, 0, None)
    # every verification forward slept inside scoring; the prefill's forward and the proposals did not
    assert 0.02 * out.cycles <= out.score_seconds < out.seconds - 0.02 * (out.cycles + 1)
    assert out.score_seconds + out.draft_seconds <= out.seconds
    rows = [(Prompt("p", "Time the scoring"), out)]
    assert summarise("sd", rows, None, True, tokenizer, ours=True)["score_share"] == out.score_seconds / out.seconds
    assert summarise("hf", rows, None, True, tokenizer, ours=False)["score_share"] is None
