"""A tree tuning belongs to the machine it was made on: decoding uses it only where the CPU's
fingerprint matches, else tunes quickly (never under pytest or in fast mode) or falls back to a
conservative chain, and says which; where no tree pays the tuner chooses AR."""
import json

import pytest

import lab.costmodel.choice as choice
from lab.artifacts import cpu_fingerprint, fingerprint_id
from lab.bench.setup import Setup
from lab.costmodel import TreeChoice, tree_for_machine
from lab.drafters import EagleDraft, NoDraft
from lab.sampling import Sampling


@pytest.fixture
def tunings(tmp_path, monkeypatch):
    """choice files under tmp_path (shipped ones and the per-machine cache); returns a writer."""
    monkeypatch.setattr(choice, "CHOICE_PATH", tmp_path / "eagle" / "tree_choice.json")
    monkeypatch.setattr(choice, "CACHE_DIR", tmp_path / "cache")

    def write(path, fingerprint, tree=(3, 2, 8), dtype="float32"):
        path.parent.mkdir(parents=True, exist_ok=True)
        d, k, n = tree
        made_on = {"cpu": "some CPU", "cores": 2, **({"fingerprint": fingerprint} if fingerprint else {})}
        path.write_text(json.dumps({"dtype": dtype, "machine": made_on,
                                    "choice": {"depth": d, "top_k": k, "total_tokens": n, "predicted_tau": 1.9,
                                               "predicted_speedup": 1.3, "draft_vocab": 8192}}))
    return write


def other_machine() -> dict:
    here = cpu_fingerprint()
    return {**here, "isa": ["avx2"] if here["isa"] != ["avx2"] else ["avx2", "avx512", "avx512_bf16", "amx"]}


def test_another_machines_tuning_is_not_used_and_the_line_says_so(tunings):
    tunings(choice.choice_path(), other_machine())
    calls = []
    tree = tree_for_machine("float32", "eagle1", "eagle1", calls.append)
    assert (tree.depth, tree.top_k, tree.total_tokens) == choice.CONSERVATIVE
    assert calls == []  # under pytest no tuning runs
    assert fingerprint_id(other_machine()) in tree.source and fingerprint_id(cpu_fingerprint()) in tree.source
    assert "conservative" in tree.source and "--quick" in tree.source


def test_a_tuning_without_a_fingerprint_is_not_used(tunings):
    tunings(choice.choice_path(), None)
    tree = tree_for_machine("float32", "eagle1", "eagle1", None)
    assert (tree.depth, tree.top_k, tree.total_tokens) == choice.CONSERVATIVE
    assert "fingerprint unrecorded" in tree.source


def test_this_machines_tuning_is_used_shipped_or_cached(tunings):
    tunings(choice.choice_path(), cpu_fingerprint(), tree=(3, 2, 8))
    tree = tree_for_machine("float32", "eagle1", "eagle1", None)
    assert (tree.depth, tree.top_k, tree.total_tokens) == (3, 2, 8) and "tuned on this machine" in tree.source
    tunings(choice.choice_path(), other_machine())
    tunings(choice.tuning_cache_path("float32", "eagle1"), cpu_fingerprint(), tree=(2, 4, 6))
    tree = tree_for_machine("float32", "eagle1", "eagle1", None)
    assert (tree.depth, tree.top_k, tree.total_tokens) == (2, 4, 6) and "cache" in tree.source
    # a tuning for another dtype is not this one's
    assert tree_for_machine("bfloat16", "eagle1", "eagle1", None).total_tokens == choice.CONSERVATIVE[2]


def test_a_tuning_of_an_earlier_head_is_not_used(tunings, monkeypatch):
    tunings(choice.choice_path(), cpu_fingerprint())
    monkeypatch.setattr(choice, "head_weights_sha", lambda head: "the retrained head")
    path = choice.choice_path()
    path.write_text(json.dumps({**json.loads(path.read_text()), "head_weights_sha": "the first head"}))
    tree = tree_for_machine("float32", "eagle1", "eagle1", None)
    assert tree.total_tokens == choice.CONSERVATIVE[2] and "weights changed" in tree.source


def test_a_missing_tuning_is_made_where_tuning_is_allowed(tunings, monkeypatch):
    tunings(choice.choice_path(), other_machine())
    monkeypatch.setattr(choice, "may_tune", lambda: True)
    made = []

    def quick(path):
        made.append(path)
        tunings(path, cpu_fingerprint(), tree=(2, 2, 4))
    tree = tree_for_machine("float32", "eagle1", "eagle1", quick)
    assert made == [choice.tuning_cache_path("float32", "eagle1")]
    assert (tree.depth, tree.top_k, tree.total_tokens) == (2, 2, 4) and "tuned now" in tree.source


def test_the_tuner_chooses_ar_where_no_tree_pays_and_decoding_then_drafts_nothing():
    assert choice.tree_or_ar(TreeChoice(2, 4, 12, 2.0, choice.PAYS + 0.01)).total_tokens == 12
    ar = choice.tree_or_ar(TreeChoice(2, 4, 12, 2.0, 1.0011, draft_vocab=8192))
    assert ar.is_ar and ar.predicted_speedup == 1.0 and ar.draft_vocab == 8192
    setup = Setup(None, None, None, Sampling(), 8, 4, 0, head=object(), eagle_tree=ar)
    assert isinstance(setup.eagle_drafter("eagle2"), NoDraft)
    assert not isinstance(setup.eagle_drafter("eagle2"), EagleDraft)


def tiny_tuning(tiny, tokenizer, monkeypatch, slowdown: float):
    """A quick tuning of the tiny target whose timer returns T(n) = 1 ms * (1 + n / 8), each round `slowdown`
    times the one before (1: a quiet machine; 1.5: one that never gives two agreeing rounds); returns it as
    `tree_for_machine` calls it, and the list of rounds timed."""
    from lab.data import mt_bench
    from lab.drafters.eagle1 import EagleHead
    timed = []

    def timer(model, configs, *args, **kwargs):
        timed.append(len(timed))
        return {c: 1e-3 * (1 + c[0] / 8) * slowdown ** len(timed) for c in configs}
    monkeypatch.setattr(choice, "latency_table", timer)
    monkeypatch.setattr(choice, "forward_latency", lambda model, ks, *a, **kw: {
        k: v for (k, _), v in timer(model, [(k, True) for k in ks]).items()})
    monkeypatch.setattr(choice, "may_tune", lambda: True)  # off under pytest: this test enables it

    def quick(path):
        return choice.tune(tiny, tokenizer, EagleHead(tiny).eval(), prompts=mt_bench(2), max_new_tokens=8, positions=4,
                           prefix=16, path=path, rank_accuracy=[0.3, 0.1], depths=(2,), top_ks=(1, 2), sizes=(2, 4),
                           walked=1, extra_rounds=choice.QUICK["extra_rounds"])
    return quick, timed


def test_a_quick_tuning_on_a_busy_machine_takes_more_rounds_then_falls_back_and_caches_nothing(
        tunings, tiny, tokenizer, monkeypatch):
    quick, timed = tiny_tuning(tiny, tokenizer, monkeypatch, slowdown=1.5)
    tree = tree_for_machine("float32", "eagle1", "eagle1", quick)
    assert (tree.depth, tree.top_k, tree.total_tokens) == choice.CONSERVATIVE
    assert len(timed) == 3 + choice.QUICK["extra_rounds"]  # the usual three, then the extra ones
    assert "busy" in tree.source and "nothing cached" in tree.source and "--quick" in tree.source
    assert "\n" not in tree.source
    assert not choice.tuning_cache_path("float32", "eagle1").exists()


def test_a_quick_tuning_on_a_quiet_machine_is_cached_and_used_later(tunings, tiny, tokenizer, monkeypatch):
    quick, timed = tiny_tuning(tiny, tokenizer, monkeypatch, slowdown=1.0)
    tree = tree_for_machine("float32", "eagle1", "eagle1", quick)
    assert len(timed) == 3 and "tuned now" in tree.source
    assert choice.tuning_cache_path("float32", "eagle1").exists()
    again = tree_for_machine("float32", "eagle1", "eagle1", lambda path: pytest.fail("a cached tuning is not redone"))
    assert (again.depth, again.top_k, again.total_tokens) == (tree.depth, tree.top_k, tree.total_tokens)
    assert "cache" in again.source
