import os
import warnings

import pytest
import torch

# Triton kernels run in the CPU interpreter when there is no GPU. This must be set before
# anything imports triton, so it lives here, at the top of the test session.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, os.cpu_count() or 1))
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def tokenizer():
    from lab.target.load import load_tokenizer
    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny():
    from lab.target.load import tiny_target
    return tiny_target(0)


@pytest.fixture(scope="session")
def target():
    from lab.target.load import load_target
    return load_target()


@pytest.fixture(scope="session")
def target_bf16():
    from lab.target.load import load_target
    return load_target("bfloat16")


@pytest.fixture
def trusted_timings(monkeypatch):
    """The tuner accepts whatever rounds it measured: the tiny target's forwards take a few ms and
    their rounds may disagree on a loaded machine (CI failed that way). The refusal has its own
    test (test_tuning_refuses_rounds_a_busy_machine_made_disagree)."""
    import lab.costmodel.choice as choice
    monkeypatch.setattr(choice, "agreeing_rounds", lambda rounds, measure, **_: rounds)


@pytest.fixture(scope="session")
def real_ar(target, tokenizer):
    """AR's greedy tokens on the real target for the first MT-Bench prompts, shared by the tests
    that check a drafter reproduces them: `real_ar(n, new_tokens)` -> [(prompt ids, tokens)].
    Each prompt is decoded once, at the longest length asked for so far: a shorter greedy run is
    a prefix of a longer one (one position per forward, EOS ends both alike)."""
    from lab.data import chat_ids, mt_bench
    from lab.decode import decode
    from lab.drafters import NoDraft
    from lab.sampling import Sampling
    from lab.target.engine import Engine
    engine, decoded = Engine(target), {}

    def ar(n: int, new_tokens: int) -> list[tuple[list[int], list[int]]]:
        runs = []
        for p in mt_bench()[:n]:
            prompt = chat_ids(tokenizer, p.text)[-200:]
            if decoded.get(p.text, (0, None))[0] < new_tokens:
                out = decode(engine, NoDraft(), prompt, new_tokens, Sampling(), 0, 0, tokenizer.eos_token_id)
                assert out.tau == 1.0
                decoded[p.text] = (new_tokens, out.tokens)
            runs.append((prompt, decoded[p.text][1][:new_tokens]))
        return runs
    return ar


@pytest.fixture
def no_launch(monkeypatch):
    """Bad input must be refused before any Triton launch: with the kernels replaced by None, a
    launch fails with a TypeError instead of running."""
    from lab.kernels import chain, tree, tree_attention
    for module, names in ((chain, ("_chain_kernel", "_chain_greedy_kernel")),
                          (tree, ("_tree_kernel", "_tree_greedy_kernel")),
                          (tree_attention, ("_tree_attention_kernel",))):
        for name in names:
            monkeypatch.setattr(module, name, None)
