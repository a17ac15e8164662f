"""Prompt lookup: drafts copied from the context itself, with no draft model at all. When the last
few tokens occurred earlier (an answer quoting its question, code repeating a name), what followed
them then is a free guess at what follows now. The drafts are one-hot, so the chain rule (q = None)
and the tree rule verify them losslessly at any temperature. A chain is the continuation of the most
recent earlier occurrence of the longest matching suffix (transformers' `prompt_lookup_num_tokens`,
vLLM's `ngram`); a tree merges up to `candidates` continuations, so that shared prefixes are scored
once (Lookahead's verification branch, with the context as its n-gram pool)."""
from __future__ import annotations

import torch

from ..errors import LabError
from ..sampling import RandomStream, Sampling
from ..trees import DraftTree


def continuations(context: list[int], k: int, max_ngram: int, min_ngram: int, limit: int) -> list[list[int]]:
    """Up to `limit` distinct non-empty continuations (at most `k` tokens each) that followed earlier
    occurrences of a suffix of `context`: longer suffixes first, then more recent occurrences."""
    found: list[list[int]] = []
    n_ctx = len(context)
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        suffix = context[n_ctx - n:]
        for start in range(n_ctx - n - 1, -1, -1):  # an occurrence ending before the suffix itself
            if context[start: start + n] == suffix:
                follow = context[start + n: start + n + k]
                if follow and follow not in found:
                    found.append(follow)
                    if len(found) == limit:
                        return found
    return found


def trie(root: int, chains: list[list[int]]) -> DraftTree:
    """The chains hung from `root` as one tree, shared prefixes merged (siblings carry distinct
    tokens, as the tree rule requires); an earlier chain's nodes come first among siblings."""
    tree = DraftTree([root], [-1])
    child: dict[tuple[int, int], int] = {}
    for chain in chains:
        node = 0
        for token in chain:
            if (node, token) not in child:
                tree.tokens.append(token)
                tree.parents.append(node)
                child[(node, token)] = len(tree.tokens) - 1
            node = child[(node, token)]
    return tree  # a node is appended after its parent, so the order is parents first


class PromptLookup:
    """Drafts from the context (module docstring): a chain when `candidates` is 1, else a tree of
    up to `candidates` continuations. Suffixes of `min_ngram` to `max_ngram` tokens are matched."""

    def __init__(self, candidates: int = 1, max_ngram: int = 3, min_ngram: int = 1):
        if candidates < 1 or not 1 <= min_ngram <= max_ngram:
            raise LabError(f"prompt lookup needs candidates >= 1 and 1 <= min_ngram <= max_ngram; got "
                           f"{candidates}, {min_ngram}, {max_ngram}")
        self.candidates, self.max_ngram, self.min_ngram = candidates, max_ngram, min_ngram
        self.name = "pld" if candidates == 1 else "pld-tree"

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        found = continuations(context, k, self.max_ngram, self.min_ngram, self.candidates) if k > 0 else []
        if self.candidates == 1 or not found:
            return (found[0] if found else []), None
        return trie(context[-1], found)

    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        pass
