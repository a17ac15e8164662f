"""Lookahead decoding (Fu et al., 2024): n-grams grown by Jacobi iteration, verified as a tree, with
no draft model. Each cycle's one target forward scores, each node at its depth's position, the
drafts (up to G pooled n-grams starting with the last committed token, merged into one tree from the
root, placed first: only these may be accepted) and the window: N-1 levels of W guessed tokens, level
0 a chain from the root, level l of column i hanging off level l-1 of column i. The target's tokens
after the last level are one Jacobi step: each column then reads as an n-gram, pooled under its first
token, and the window moves up a level. The drafts are one-hot and independent of the cycle's random
draws, so the tree rule verifies them losslessly at any temperature."""
from __future__ import annotations

import torch

from ..errors import LabError
from ..sampling import RandomStream, Sampling
from ..verify.lossless import argmax_rows
from .lookup import trie


def lookahead_positions(n: int, window: int, pool: int) -> int:
    """The most positions one step scores: the root, G drafts of N-1 tokens, the N-1 by W window."""
    return 1 + (pool + window) * (n - 1)


class Lookahead:
    """Lookahead's drafter (module docstring): n-gram size `n` (N), window width `window` (W), at
    most `pool` n-grams kept per first token and verified per step (G)."""
    name = "lookahead"

    def __init__(self, n: int = 4, window: int = 4, pool: int = 3):
        if n < 2 or window < 1 or pool < 1:
            raise LabError(f"lookahead needs N >= 2, W >= 1 and G >= 1, got N={n}, W={window}, G={pool}: "
                           "pass --lookahead N,W,G, for example 4,4,3")
        self.n, self.window_width, self.pool_size = n, window, pool
        self.window: list[list[int]] = []                # [N-1][W] guessed tokens, level 0 first
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> continuations, most recent first
        self._last_level: list[int] = []                  # this step's nodes of the window's last level

    def begin(self, prompt: list[int]) -> None:
        """An empty pool, and a window of the prompt's last tokens (any guess will do)."""
        self.pool = {}
        size = (self.n - 1) * self.window_width
        filler = (prompt * (size // len(prompt) + 1))[-size:]
        self.window = [filler[level * self.window_width:(level + 1) * self.window_width] for level in range(self.n - 1)]

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        if k == 0:
            self._last_level = []
            return [], None
        tree = trie(context[-1], [list(gram[:k]) for gram in self.pool.get(context[-1], [])])
        tree.candidates = len(tree)
        column_ends = [0] * self.window_width
        for level, tokens in enumerate(self.window):
            for column, token in enumerate(tokens):
                # the trunk is a chain from the root; a higher level hangs off its own column
                parent = (column_ends[column - 1] if column else 0) if level == 0 else column_ends[column]
                tree.tokens.append(token)
                tree.parents.append(parent)
                column_ends[column] = len(tree) - 1
        self._last_level = column_ends
        return tree

    def observe(self, proposal, logits: torch.Tensor) -> None:
        """One Jacobi step from the target's tokens after the window's last level (see the module)."""
        if not self._last_level:
            return
        following = argmax_rows(logits[self._last_level])
        for column, token in enumerate(following):
            gram = [level[column] for level in self.window] + [token]
            self._remember(gram[0], tuple(gram[1:]))
        self.window = self.window[1:] + [following]

    def _remember(self, first: int, rest: tuple[int, ...]) -> None:
        """Keep `rest` as the most recent continuation of `first`; the least recent beyond G go."""
        kept = [gram for gram in self.pool.get(first, []) if gram != rest]
        self.pool[first] = [rest] + kept[: self.pool_size - 1]

    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        pass
