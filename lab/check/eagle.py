"""Checks for the exercises of notebooks 04 and 05: acceptance by draft depth from a matrix of
per-chain hits, and the nodes EAGLE-2's reranking keeps. Each reference is computed here, in plain
Python, not taken from the library the exercise is about."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from . import ExerciseError


# ---- notebook 04: top-1 by depth, chain acceptance and n-alpha ------------------------------

def _depth_reference(right: list[list[bool]]) -> dict[str, list]:
    """top1, chain and n_alpha by depth of a [chains][depths] table of hits, counted one by one."""
    chains, depths = len(right), len(right[0])
    top1, chain, n_alpha = [], [], []
    for d in range(depths):
        top1.append(sum(row[d] for row in right) / chains)
        given = [row for row in right if all(row[:d])]      # right at every depth before d
        chain.append(sum(all(row[: d + 1]) for row in right) / chains)
        n_alpha.append(sum(row[d] for row in given) / len(given) if given else None)
    return {"top1": top1, "chain": chain, "n_alpha": n_alpha}


def _number(value) -> float | None:
    """A student's entry as a float, or None for 'not measured' (None or NaN)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _depth_case(g: np.random.Generator) -> list[list[bool]]:
    """Chains whose hits are correlated along the chain, as real ones are: each chain has its own
    ease, so an easy chain tends to be right at every depth and top-1 differs from n-alpha."""
    chains, depths = int(g.integers(1, 60)), int(g.integers(1, 7))
    ease = g.uniform(0, 1, chains)
    falling = g.uniform(0.4, 1.0) ** np.arange(depths)
    return [[bool(g.uniform() < e * f) for f in falling] for e in ease]


def check_depth_rates(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(right)`, right a bool tensor [chains, depths] (right[r, d-1]: the draft at depth d of the
    chain rooted at position r was the held-out token), must return {"top1": ..., "chain": ...,
    "n_alpha": ...}, each a list with one number per depth: the share of all chains right at depth d;
    the share right at every depth 1..d; and, among the chains right at every depth 1..d-1, the share
    right at d (None where no chain is) (notebook 04)."""
    edges = [
        ([[1, 0], [0, 1], [0, 1], [1, 1]], "two of the four chains are wrong at depth 1 and right at depth 2"),
        ([[0, 1, 1], [0, 1, 0]], "no chain survives depth 1"),
        ([[1], [0], [1]], "one depth only"),
        ([[1, 1, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]], "every chain is right at two of three depths"),
    ]
    g = np.random.default_rng(seed)
    for _ in range(cases):
        edges.append((_depth_case(g), ""))
    for table, why in edges:
        table = [[bool(x) for x in row] for row in table]
        want = _depth_reference(table)
        given = torch.tensor(table, dtype=torch.bool)
        try:
            got = fn(given.clone())
        except ZeroDivisionError:
            raise ExerciseError(f"right = {given.int().tolist()}: division by zero. Where no chain is right at "
                                "every earlier depth, n-α is not measured: return None there") from None
        where = f"right = {given.int().tolist()}" + (f" ({why})" if why else "")
        if not isinstance(got, dict) or set(want) - set(got):
            raise ExerciseError(f"return a dict with the keys 'top1', 'chain' and 'n_alpha', got {type(got).__name__}"
                                + (f" with keys {sorted(got)}" if isinstance(got, dict) else ""))
        for key in ("top1", "chain", "n_alpha"):
            values = list(got[key])
            if len(values) != len(want[key]):
                raise ExerciseError(f"{where}: '{key}' has {len(values)} entries, one per depth is "
                                    f"{len(want[key])} (the matrix is [chains, depths])")
            for d, (w, v) in enumerate(zip(want[key], values), start=1):
                v = _number(v)
                if w is None and v is None:
                    continue
                if w is None:
                    raise ExerciseError(f"{where}: '{key}' at depth {d} is {v:g}, but no chain was right at every "
                                        f"depth before {d}, so n-α there is not measured: return None (a 0 would "
                                        "say it was measured and every chain failed)")
                if v is None or abs(v - w) > 1e-6:
                    shown = "None" if v is None else f"{v:.4f}"
                    raise ExerciseError(f"{where}: '{key}' at depth {d} is {shown}, want {w:.4f}; "
                                        + _depth_hint(key, d, v, want))
    print(f"depth_rates: top-1, chain acceptance and n-α agree with a count by hand on {cases} random tables "
          "and the edge cases")


def _depth_hint(key: str, d: int, v: float | None, want: dict) -> str:
    """Where to look, naming the figure the wrong value equals when it is one of the others."""
    top1, chain = want["top1"][d - 1], want["chain"][d - 1]
    if key == "n_alpha" and v is not None and abs(v - top1) < 1e-6:
        return ("that is top-1 at depth d over all chains. n-α counts only the chains right at every depth "
                "before d: a chain wrong at depth 1 would never have drafted depth 2 in decoding (the common error)")
    if key == "n_alpha" and v is not None and abs(v - chain) < 1e-6:
        return ("that is chain acceptance P(depths 1..d right). n-α divides the chains right at 1..d by the "
                "chains right at 1..d-1, not by all chains")
    if key == "chain" and v is not None and abs(v - top1) < 1e-6:
        return "that is top-1 at depth d alone; chain acceptance needs every depth 1..d right"
    if key == "top1":
        return "top-1 at depth d is the share of ALL chains right at depth d, whatever happened before"
    if key == "chain":
        return "chain acceptance is the share of all chains right at every depth 1..d"
    return "n-α at depth d: among chains right at every depth 1..d-1, the share right at d"


# ---- notebook 05: what EAGLE-2's reranking keeps --------------------------------------------

def _path_probabilities(parents: list[int], confidences: list[float]) -> list[float]:
    out = []
    for i, parent in enumerate(parents):
        out.append(1.0 if parent < 0 else out[parent] * confidences[i])
    return out


def _keep(score: list[float], total_tokens: int) -> list[int]:
    """The root and the total_tokens - 1 best other nodes by `score` (ties: the lower index)."""
    others = sorted(range(1, len(score)), key=lambda i: (-score[i], i))[: max(total_tokens - 1, 0)]
    return [0] + sorted(others)


def _rerank_case(g: np.random.Generator) -> tuple[list[int], list[float], int]:
    """A random tree, parents first, whose path probabilities have no near-tie at the cut."""
    while True:
        n = int(g.integers(2, 25))
        parents = [-1] + [int(g.integers(0, i)) for i in range(1, n)]
        confidences = [1.0] + [float(g.uniform(0.02, 0.98)) for _ in range(1, n)]
        total = int(g.integers(1, n + 2))
        values = sorted(_path_probabilities(parents, confidences)[1:], reverse=True)
        cut = total - 1
        if 0 < cut < len(values) and values[cut - 1] - values[cut] < 1e-9:
            continue
        return parents, confidences, total


def check_kept_nodes(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(parents, confidences, total_tokens)` (parents[0] = -1, every parent before its child;
    confidences[i] the draft's probability of node i given its parent, 1 for the root) must return
    the nodes EAGLE-2's reranking keeps, in increasing order: the root and the total_tokens - 1 other
    nodes with the largest path probability, the product of the confidences from the root down to
    the node (notebook 05)."""
    edges = [
        ([-1, 0, 0, 1, 2], [1.0, 0.6, 0.4, 0.5, 0.95], 3, " (node 4 is confident, its parent is not)"),
        ([-1, 0, 0, 1, 3], [1.0, 0.5, 0.45, 0.5, 0.5], 3, " (a deep path of 0.5s against a shallow 0.45)"),
        ([-1, 0, 1, 2, 0], [1.0, 0.9, 0.9, 0.9, 0.8], 4, " (a chain of 0.9s: 0.9³ = 0.729 loses to 0.8)"),
        ([-1, 0, 0], [1.0, 0.7, 0.2], 1, " (a budget of one token: the root alone)"),
        ([-1, 0, 1], [1.0, 0.3, 0.6], 10, " (a budget larger than the tree: every node)"),
    ]
    g = np.random.default_rng(seed)
    for _ in range(cases):
        edges.append((*_rerank_case(g), ""))
    for parents, confidences, total, why in edges:
        path = _path_probabilities(parents, confidences)
        want = _keep(path, total)
        got = sorted(int(i) for i in fn(list(parents), list(confidences), total))
        if got == want:
            continue
        where = f"parents {parents}, confidences {confidences}, total_tokens {total}{why}"
        if len(got) != len(want):
            raise ExerciseError(f"{where}: kept {len(got)} nodes, want {len(want)}: the root counts as one of "
                                "the total_tokens, and a tree smaller than the budget is kept whole")
        if 0 not in got:
            raise ExerciseError(f"{where}: the root (node 0) must always be kept: every path starts there")
        own = _keep(confidences, total)
        summed = [0.0]
        for i, parent in enumerate(parents[1:], start=1):
            summed.append(summed[parent] + confidences[i])
        if got == own:
            raise ExerciseError(f"{where}: you kept {got}, ranking each node by its own confidence; want {want}. "
                                "A confident child of an unlikely parent is still unlikely: rank by the product "
                                "of the confidences along the path from the root")
        if got == _keep(summed, total):
            raise ExerciseError(f"{where}: you kept {got}, ranking by the SUM of the confidences along the path; "
                                f"want {want}. A sum grows with every step, so deep nodes win; the chance that a "
                                "whole path is accepted is the PRODUCT (or a sum of log-probabilities)")
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        raise ExerciseError(f"{where}: you kept {got}, want {want}: missing {missing} (path probabilities "
                            f"{[round(path[i], 4) for i in missing]}), not wanted {extra} (path probabilities "
                            f"{[round(path[i], 4) for i in extra]})")
    print(f"kept_nodes: keeps the same nodes as a product of confidences from the root, on {cases} random trees "
          "and the edge cases")
