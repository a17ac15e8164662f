"""Lookahead decoding (lab/drafters/lookahead.py): the step's tree, the Jacobi step and the pool,
losslessness at T = 1 through the loop's candidate prefix (with a broken rule that fails), and
decoding equal to AR on the real target."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import lab.decode
from lab.decode import _tree_cycle, decode
from lab.steps import run_alone
from lab.drafters import Lookahead
from lab.drafters.lookahead import lookahead_positions
from lab.errors import LabError
from lab.sampling import RandomStream, Sampling
from lab.target.engine import Engine
from lab.timing import Seconds
from lab.verify.lossless import TreeResult, children_of, race


def seeded(n: int, window: int, pool: int, prompt: list[int], grams: list[tuple[int, ...]]) -> Lookahead:
    drafter = Lookahead(n, window, pool)
    drafter.begin(prompt)
    for gram in reversed(grams):  # remembered last = most recent = first in the pool
        drafter._remember(prompt[-1], gram)
    return drafter


def test_the_step_is_one_tree_drafts_first_then_the_window_at_its_depths():
    drafter = seeded(3, 2, 3, [7, 8, 9, 10, 11], [(1, 2), (1, 3), (4, 5)])
    tree = drafter.propose([11], 2, Sampling(), RandomStream(0))
    assert tree.candidates == 6  # the root, 1 -> {2, 3}, 4 -> 5
    assert tree.tokens[:6] == [11, 1, 2, 3, 4, 5]
    assert drafter.window == [[8, 9], [10, 11]]  # the prompt's last (N-1) * W tokens, level by level
    # window: trunk 8 -> 9 from the root; level 1: 10 off the trunk's 8, 11 off its 9
    assert tree.tokens[6:] == [8, 9, 10, 11] and tree.parents[6:] == [0, 6, 6, 7]
    assert tree.depths()[6:] == [1, 2, 2, 3]
    assert len(tree) == lookahead_positions(3, 2, 3) - 1  # two of the pooled n-grams share their first node
    kids = children_of(tree.parents[:6])
    assert all(len({tree.tokens[c] for c in k}) == len(k) for k in kids)


def test_a_jacobi_step_pools_every_column_and_moves_the_window_up():
    drafter = seeded(3, 2, 2, [7, 8, 9, 10, 11], [])
    tree = drafter.propose([99], 2, Sampling(), RandomStream(0))  # a root with nothing pooled: the window alone
    logits = torch.zeros(len(tree), 50)
    logits[tree.tokens.index(10), 20] = 1.0  # after 8 -> 10 the target says 20; after 9 -> 11, 21
    logits[tree.tokens.index(11), 21] = 1.0
    drafter.observe(tree, logits)
    assert drafter.pool == {8: [(10, 20)], 9: [(11, 21)]}
    assert drafter.window == [[10, 11], [20, 21]]


def test_the_pool_keeps_the_g_most_recent_continuations_per_first_token():
    drafter = seeded(2, 1, 2, [3], [])
    for gram in [(1,), (2,), (1,), (4,)]:
        drafter._remember(3, gram)
    assert drafter.pool[3] == [(4,), (1,)]


def test_bad_settings_are_one_line_errors():
    with pytest.raises(LabError, match="--lookahead N,W,G"):
        Lookahead(1, 4, 3)
    r = subprocess.run([sys.executable, "-m", "lab", "bench", "--target", "tiny", "--methods", "lookahead",
                        "--lookahead", "4,4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "N,W,G" in r.stderr and "Traceback" not in r.stderr


class FixedTarget:
    """A stand-in for the engine whose scores are fixed rows: a cycle's randomness is then only
    the verification's, so thousands of cycles cost no forwards."""

    def __init__(self, logits: torch.Tensor, hidden: dict[int, torch.Tensor] | None = None):
        self.logits, self.hidden = logits, hidden or {}

    def forward(self, tokens, mask=None, positions=None, hidden_layers=(), last_only=False, embeds=None, logits=True):
        return SimpleNamespace(logits=self.logits[: len(tokens)],
                               hidden={layer: h[: len(tokens)] for layer, h in self.hidden.items()})

    def keep(self, start: int, indices: list[int]) -> None:
        pass


def first_tokens(draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first token of `draws` lookahead cycles at T = 1 (root 0, pooled drafts 1, 2, 3, a
    window of 4 then 5 that must never be accepted), and the target's distribution at the root."""
    p_root = torch.tensor([0.05, 0.3, 0.2, 0.1, 0.25, 0.1])
    drafter = seeded(2, 2, 3, [0], [(1,), (2,), (3,)])
    drafter.window = [[4, 5]]
    tree = drafter.propose([0], 1, Sampling(1.0), RandomStream(0))
    assert tree.tokens == [0, 1, 2, 3, 4, 5] and tree.candidates == 4
    logits = torch.log(torch.softmax(torch.randn(len(tree), 6, generator=torch.Generator().manual_seed(1)), -1))
    logits[0] = p_root.log()
    target, counts = FixedTarget(logits), torch.zeros(6)
    for seed in range(draws):
        cycle = run_alone(_tree_cycle(target, Seconds(), [4, 5, 0], tree, "torch", Sampling(1.0),
                                     RandomStream(seed), ()))
        assert cycle.n_accepted == 0 or cycle.tokens[0] in (1, 2, 3)  # the window is never accepted
        counts[cycle.tokens[0]] += 1
    return counts, p_root


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


CRITICAL = 20.5  # chi-square, 5 degrees of freedom, p = 0.001


def without_zeroing(tokens, parents, p, uniforms, noise):
    """A broken tree rule: a rejected draft stays in the distribution that the next sibling and
    the final draw use (tried at the root only, which is all these tests need)."""
    for child in children_of(parents)[0]:
        if uniforms[child] < p[0, tokens[child]]:
            return TreeResult([0, child], [tokens[child], race(p[child], noise)])
    return TreeResult([0], [race(p[0], noise)])


@pytest.mark.slow
def test_lookahead_keeps_the_target_distribution_and_a_broken_rule_fails(monkeypatch):
    counts, p = first_tokens(4000)
    assert chi_square(counts, p) < CRITICAL
    monkeypatch.setattr(lab.decode, "verify_tree", without_zeroing)
    broken, _ = first_tokens(4000)
    assert chi_square(broken, p) > CRITICAL


@pytest.mark.slow
def test_lookahead_equals_ar_real(target, tokenizer, real_ar):
    """On the real target at T = 0 Lookahead reproduces AR token for token."""
    engine = Engine(target)
    for prompt, ar in real_ar(6, 24):
        out = decode(engine, Lookahead(4, 4, 3), prompt, 24, Sampling(), 3, 0, tokenizer.eos_token_id)
        assert out.tokens == ar
