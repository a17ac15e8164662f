"""Checks for the notebooks' exercises: a student's function against the lab's reference. Each
`check_*` tests seeded random cases and the edge cases the classic bugs live in, and raises
`ExerciseError` saying what went wrong and where to look; on success it prints one line."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from scipy.stats import chisquare

from .. import ablation
from ..drafters.eagle_draft import static_shape
from ..drafters.heads import head_manifest
from ..drafters.lookup import continuations
from ..intervals import wilson
from ..train.ttt import ttt_attention_mask
from ..trees import DraftTree
from ..verify.lossless import verify_chain


class ExerciseError(AssertionError):
    """A student's function disagrees with the reference; the message says how."""


def _result(out) -> tuple[int, list[int]]:
    """A student's chain result as (n_accepted, tokens): a ChainResult or a plain pair."""
    if hasattr(out, "n_accepted"):
        return int(out.n_accepted), [int(t) for t in out.tokens]
    n, tokens = out
    return int(n), [int(t) for t in tokens]


def _case(g: torch.Generator, k: int, vocab: int, one_hot: bool):
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g) * 1.5, -1)
    q = None if one_hot else torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, -1)
    draft = (torch.randint(0, vocab, (k,), generator=g) if one_hot else
             torch.multinomial(q, 1, generator=g)[:, 0]).tolist()
    return draft, q, p, torch.rand(k, generator=g), torch.empty(vocab).exponential_(generator=g)


def check_verify_chain(fn: Callable, cases: int = 300, samples: int = 20_000, seed: int = 0) -> None:
    """`fn(draft, q, p, uniforms, noise)` must make exactly the decisions of
    `lab.verify.verify_chain` (notebook 02): accept draft i when uniforms[i] * q[i, x] < p[i, x]
    (q None: one-hot drafts, q(x) = 1), else emit race(max(0, p - q), noise) and stop; after K
    acceptances emit race(p[K], noise). Then its first emitted token must follow p[0]."""
    g = torch.Generator().manual_seed(seed)
    # the edge cases first: the bugs that hide in them are the classic ones
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.2, 0.4, 0.4]])
    noise = torch.ones(3)
    n, _ = _result(fn([0], q, p, torch.zeros(1), noise))
    if n != 0:
        raise ExerciseError("accepted a draft the target gives probability 0 (u = 0, p(x) = 0): "
                            "compare u * q(x) < p(x) with a strict '<'")
    same = torch.tensor([[0.3, 0.3, 0.4], [0.2, 0.3, 0.5]])
    want, got = (_result(f([2], same[:1], same, torch.ones(1), noise)) for f in (verify_chain, fn))
    if got != want:
        raise ExerciseError("p == q and the draft was rejected (u = 1): the residual max(0, p - q) is all zero, "
                            f"so sample from p instead (the reference emits {want[1]}, you emitted {got[1]})")
    for case in range(cases):
        k, one_hot = 1 + case % 4, case % 3 == 0
        draft, q, p, u, noise = _case(g, k, 8, one_hot)
        want, got = _result(verify_chain(draft, q, p, u, noise)), _result(fn(draft, q, p, u, noise))
        if got != want:
            where = ("after accepting all drafts (the bonus token comes from p[K])" if want[0] == k else
                     f"at draft {want[0]}, where the reference rejects and draws from the residual max(0, p - q)"
                     if got[0] == want[0] else "in how many drafts are accepted (u * q(x) < p(x))")
            raise ExerciseError(f"case {case} ({'one-hot drafts, q None' if one_hot else 'sampled drafts'}, K={k}): "
                                f"the reference gives {want}, you gave {got}; they part {where}")
    counts = np.zeros(8)
    draft_q = torch.softmax(torch.randn(1, 8, generator=g), -1)
    target_p = torch.softmax(torch.randn(2, 8, generator=g) * 1.5, -1)
    for _ in range(samples):
        x = int(torch.multinomial(draft_q[0], 1, generator=g))
        _, tokens = _result(fn([x], draft_q, target_p, torch.rand(1, generator=g),
                               torch.empty(8).exponential_(generator=g)))
        counts[tokens[0]] += 1
    expected = target_p[0].double().numpy()
    pvalue = chisquare(counts, expected / expected.sum() * samples).pvalue
    if pvalue < 1e-3:
        raise ExerciseError(f"the first emitted token does not follow the target's p (chi-square p-value {pvalue:.1e} "
                            f"over {samples} cycles): the output is not lossless")
    print(f"verify_chain: agrees with lab.verify on {cases} random cases and the edge cases; lossless over "
          f"{samples} cycles (chi-square p-value {pvalue:.2f})")


def check_eagle_input(fn: Callable, embed: torch.nn.Module, seed: int = 0) -> None:
    """`fn(features, ids, embed)` with features [T, H] (the target's top feature at positions
    0..T-1) and ids [T+1] must return EAGLE-1's input pairs [T, 2H]: row t is f_t concatenated
    with the embedding of x_{t+1}, the token one step ahead (notebook 04)."""
    g = torch.Generator().manual_seed(seed)
    hidden = embed.weight.shape[1]
    features = torch.randn(6, hidden, generator=g)
    ids = torch.randint(0, embed.weight.shape[0], (7,), generator=g)
    with torch.no_grad():
        want = torch.cat([features, embed(ids[1:])], -1)
        got = fn(features, ids, embed)
        if tuple(got.shape) != tuple(want.shape):
            raise ExerciseError(f"expected shape {tuple(want.shape)} (T pairs of [feature, token embedding]), "
                                f"got {tuple(got.shape)}")
        if torch.equal(got, torch.cat([features, embed(ids[:-1])], -1)):
            raise ExerciseError("you paired f_t with x_t; EAGLE pairs it with x_{t+1}, the token one step ahead "
                                "(the token sampled from f_t's own distribution)")
        if torch.equal(got, torch.cat([embed(ids[1:]), features], -1)):
            raise ExerciseError("the halves are swapped: the feature comes first, then the token embedding")
        if not torch.equal(got, want):
            raise ExerciseError("the pairs differ from [f_t, embed(x_{t+1})] for t = 0..T-1")
    print("eagle_input: the pairs are [f_t, embed(x_{t+1})], as EAGLE-1's head reads them")


def check_ancestor_mask(fn: Callable, trees: int = 200, seed: int = 0) -> None:
    """`fn(parents)` (parents[0] = -1, every parent before its child) must return a bool
    [N, N] mask with mask[i, j] true iff node j is node i or one of its ancestors (notebook 05)."""
    rng = np.random.default_rng(seed)
    for case in range(trees):
        n = int(rng.integers(1, 20))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        want = DraftTree([0] * n, parents).ancestor_mask()
        got = torch.as_tensor(fn(parents)).bool()
        if tuple(got.shape) != (n, n):
            raise ExerciseError(f"parents {parents}: expected a [{n}, {n}] mask, got {tuple(got.shape)}")
        if not torch.equal(got, want):
            i, j = [int(v) for v in torch.nonzero(got != want)[0]]
            what = ("a node must see itself" if i == j else
                    f"node {j} is an ancestor of node {i}, so node {i} must see it" if want[i, j] else
                    f"node {j} is not an ancestor of node {i} (a sibling, cousin or descendant): hide it")
            raise ExerciseError(f"parents {parents}: mask[{i}, {j}] is {bool(got[i, j])}; {what}")
    print(f"ancestor_mask: equals DraftTree.ancestor_mask on {trees} random trees")


def check_ttt_mask(fn: Callable) -> None:
    """`fn(positions, steps)` must return the bool [steps*T, steps*T] mask of training-time test
    (rows and columns step by step), equal to `ttt_attention_mask` (notebook 06)."""
    for positions, steps in ((1, 1), (4, 1), (3, 2), (6, 3), (5, 7)):
        want = ttt_attention_mask(positions, steps)
        got = torch.as_tensor(fn(positions, steps)).bool()
        if tuple(got.shape) != tuple(want.shape):
            raise ExerciseError(f"T = {positions}, S = {steps}: expected a {tuple(want.shape)} mask, got "
                                f"{tuple(got.shape)}")
        if not torch.equal(got, want):
            row, col = [int(v) for v in torch.nonzero(got != want)[0]]
            (s, t), (r, u) = divmod(row, positions), divmod(col, positions)
            what = (f"step {s} at index {t} must see the true context up to index {t}" if r == 0 and want[row, col]
                    else f"step {s} at index {t} must see its own chain's earlier step {r} (same index)"
                    if want[row, col] else f"step {s} at index {t} must not see step {r} at index {u}")
            raise ExerciseError(f"T = {positions}, S = {steps}: mask[{row}, {col}] is {bool(got[row, col])}; {what}")
    print("ttt_mask: equals the library's training-time-test mask for S = 1, 2, 3 and 7")


def check_n_alpha_interval(fn: Callable) -> None:
    """`fn(evaluation, depth)` must return (hits, chains, low, high) for n-alpha at `depth`: the chains
    (those right at every earlier depth) as recorded, the hits recovered from the rounded rate (exact
    while chains < 10,000: the rate has four decimals), and their Wilson 95% interval (notebook 06)."""
    small = {"n_alpha_by_depth": {"rate": [0.8, 0.0667], "chains": [40, 30], "hits": [32, 2],
                                  "ci95": [list(wilson(32, 40)), list(wilson(2, 30))]}}
    cases = [(head_manifest(name)["evaluation"], depth) for name in ("eagle1", "eagle3-full") for depth in (1, 2, 6)]
    for evaluation, depth in cases + [(small, 1), (small, 2)]:
        recorded = evaluation["n_alpha_by_depth"]
        chains, hits = recorded["chains"][depth - 1], recorded["hits"][depth - 1]
        low, high = recorded["ci95"][depth - 1]
        got = fn({**evaluation, "n_alpha_by_depth": {k: recorded[k] for k in ("rate", "chains")}}, depth)
        if (int(got[0]), int(got[1])) != (hits, chains):
            raise ExerciseError(f"depth {depth}: expected {hits} hits of {chains} chains (hits = rate x chains, "
                                f"rounded to a whole number), got {got[0]} of {got[1]}")
        if max(abs(float(got[2]) - low), abs(float(got[3]) - high)) > 2e-4:
            raise ExerciseError(f"{hits} of {chains}: expected the Wilson interval [{low:.4f}, {high:.4f}], got "
                                f"[{float(got[2]):.4f}, {float(got[3]):.4f}] (the normal approximation "
                                f"p ± 1.96·sqrt(p(1-p)/n) is not it)")
    print("n_alpha_interval: counts and Wilson intervals match on two shipped heads and on small counts")


def check_isolating_pairs(fn: Callable) -> None:
    """`fn(manifests)` (heads' manifests, by name) must return {"feature loss": (a, b), "training-time
    test": (a, b)}: two heads whose recipes, every stage included, differ in that factor alone
    (notebook 06)."""
    names = [*ablation.FIG4.values(), ablation.TABLE2[-1][1], "ablation-token-s1"]
    manifests = {name: head_manifest(name) for name in names}
    answer = fn(manifests)
    for factor, option in (("feature loss", "feature_loss"), ("training-time test", "ttt_steps")):
        if factor not in answer:
            raise ExerciseError(f"return a pair for {factor!r}")
        a, b = answer[factor]
        unknown = [name for name in (a, b) if name not in manifests]
        if unknown:
            raise ExerciseError(f"{factor}: {unknown[0]!r} is not one of the heads given: {', '.join(manifests)}")
        found = ablation.differences(manifests[a], manifests[b])
        if found != {option}:
            raise ExerciseError(f"{factor}: {a} and {b} differ in {sorted(found) or 'nothing'}, not only in "
                                f"{option}" + (" (their numbers of stages differ: compare every stage, "
                                               "following each manifest's init)" if "stages" in found else ""))
    print("isolating_pairs: each pair differs in its factor alone, every stage included")


def check_prompt_lookup(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(context, k, max_ngram)` must return the drafts of prompt lookup (notebook 03b): the up
    to `k` tokens that followed the most recent earlier occurrence of the longest suffix of
    `context` (of `max_ngram` tokens down to one) that occurred before, or [] when none did."""
    # the edge cases first, each with what it tests; then seeded random contexts over five tokens
    edge = [([5, 6, 7, 8, 1, 6, 7, 9, 5, 6, 7], 2, 3, " (the longest suffix, 5 6 7, wins over a more recent 6 7)"),
            ([1, 2, 9, 1, 2, 8, 1, 2], 1, 2, " (of two occurrences of 1 2, the more recent one, followed by 8, wins)"),
            ([4, 4, 4], 3, 1, " (a continuation may run into the suffix itself: [4])"),
            ([1, 2, 3], 4, 3, " (nothing repeats: no drafts)")]
    g = torch.Generator().manual_seed(seed)
    for _ in range(cases):
        context = torch.randint(0, 5, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
        k, max_ngram = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        edge.append((context, k, max_ngram, ""))
    for context, k, max_ngram, why in edge:
        found = continuations(context, k, max_ngram, 1, 1)
        want, got = found[0] if found else [], list(fn(list(context), k, max_ngram))
        if got != want:
            raise ExerciseError(f"context {context}, k={k}, max_ngram={max_ngram}: got {got}, want {want}{why}")
    print(f"prompt_lookup: agrees with lab.drafters.lookup on the edge cases and {cases} random contexts")


def check_medusa_shape(fn: Callable, cases: int = 200, seed: int = 0) -> None:
    """`fn(total_tokens, accuracy)` must return Medusa's tree (notebook 03b): the `total_tokens - 1`
    rank paths (r_1, ..., r_d), d at most len(accuracy), with the largest products of
    accuracy[j][r_j], as a set (ties excepted: the check uses distinct products)."""
    g = np.random.default_rng(seed)
    for _ in range(cases):
        depth, ranks = int(g.integers(1, 5)), int(g.integers(1, 6))
        accuracy = [sorted(g.uniform(0.01, 0.9, ranks), reverse=True) for _ in range(depth)]
        accuracy = [[float(a) for a in row] for row in accuracy]
        total = int(g.integers(2, 20))
        want = set(static_shape(total, depth, accuracy))
        got = {tuple(p) for p in fn(total, accuracy)}
        if got != want:
            value = {p: float(np.prod([accuracy[j][r] for j, r in enumerate(p)])) for p in want | got}
            missing = sorted(want - got, key=lambda p: -value[p])[:3]
            extra = sorted(got - want, key=lambda p: -value[p])[:3]
            raise ExerciseError(f"{total} tokens, accuracies {accuracy}: missing {missing}, not wanted {extra} "
                                "(value a path by the product of its ranks' accuracies, one head per depth)")
    print(f"medusa_shape: the same tree as lab's static_shape on {cases} random accuracy tables")
