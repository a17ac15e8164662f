"""tau of a tree, counted without the target's tree forward: on the target's own greedy continuations,
greedy verification of any tree is a walk down it along the continuation. `measure_trees` scores trees
at uniformly drawn roots (cheap, optimistic: decoding never roots a cycle inside an accepted run);
`walk_tau` walks each continuation cycle by cycle as `decode` does."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..data import chat_ids, mt_bench
from ..decode import decode
from ..drafters import EagleDraft, NoDraft, static_shape
from ..drafters.eagle1 import EagleHead
from ..drafters.eagle3 import Eagle3Head
from ..sampling import RandomStream, Sampling
from ..target.load import engine_for
from ..timing import clock
from ..trees import rerank

GREEDY = Sampling(0.0, 0, 1.0)
DEPTHS = (2, 3, 4, 5, 6)
TOP_KS = (1, 2, 3, 4, 6, 8)
SIZES = (2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


@dataclass
class Continuation:
    """A prompt and the target's greedy answer, its features, and the timings of the AR decoding."""
    ids: list[int]             # prompt + greedy response
    prompt_len: int
    features: torch.Tensor     # [len(ids), F] the target's features at every position
    seconds: float             # wall time of the AR decoding that produced it
    max_new_tokens: int        # the decoding's limit (a walk stops drafting where decoding did)
    prefill_seconds: float     # of `seconds`: the prompt's forward
    forward_seconds: float     # of `seconds`: the one-token forwards (the rest is the loop's own time)


class _TimedEngine:
    """An engine whose forwards are timed, so that AR's time splits into prefill, forwards and loop."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, *args, **kwargs):
        start = clock(self.engine.model.device)
        out = self.engine.forward(*args, **kwargs)
        self.seconds.append(clock(self.engine.model.device) - start)
        return out


@torch.inference_mode()
def greedy_continuations(target, tokenizer, prompts, max_new_tokens: int,
                         layers: tuple[int, ...]) -> list[Continuation]:
    """The target's own greedy answers (our AR loop) and its features along them."""
    out = []
    for p in prompts:
        ids = chat_ids(tokenizer, p.text)
        engine = _TimedEngine(engine_for(target))
        result = decode(engine, NoDraft(), ids, max_new_tokens, GREEDY, 0, 0, tokenizer.eos_token_id)
        prefill = engine.seconds[0] if len(ids) > 1 else 0.0  # decode's first forward is the prompt's
        full = ids + result.tokens
        # the features as decoding sees them: from the same forward (the exact engine in bfloat16)
        hidden = engine_for(target).forward(full, hidden_layers=layers, logits=False).hidden
        out.append(Continuation(full, len(ids), torch.cat([hidden[layer] for layer in layers], -1).cpu(),
                                result.seconds, max_new_tokens, prefill, sum(engine.seconds) - prefill))
    return out


def draft_positions(seqs: list[Continuation], count: int, seed: int,
                    margin: int = max(DEPTHS)) -> list[tuple[int, int]]:
    """(sequence, root position) pairs inside the responses, drawn with `seed`, at least `margin` tokens
    before the end (no tree is cut short) and four after the start (the commit timing needs them)."""
    all_pos = [(s, i) for s, c in enumerate(seqs) for i in range(max(c.prompt_len - 1, 4), len(c.ids) - 1 - margin)]
    return sorted(random.Random(seed).sample(all_pos, min(count, len(all_pos))))


def measure_trees(head: EagleHead | Eagle3Head, seqs: list[Continuation], positions: list[tuple[int, int]],
                  depths=DEPTHS, top_ks=TOP_KS, sizes=SIZES, static_depth: int | None = None,
                  rank_accuracy: list[float] | None = None, vocab: torch.Tensor | None = None,
                  before_commit: Callable[[], None] | None = None) -> dict:
    """tau and drafting seconds of every (depth, top_k, size) dynamic tree and every static tree at
    `static_depth`, and the commit time, all on the same positions. `before_commit` (decoding's
    verification forward) runs untimed before each commit, so it meets the caches as decoding does."""
    grid = [(d, k) for d in depths for k in top_ks]
    dyn = {(d, k, n): [] for d, k in grid for n in sizes}
    sta = {n: [] for n in sizes} if static_depth else {}
    seconds = {(d, k): 0.0 for d, k in grid}
    static_seconds = {n: 0.0 for n in sta}
    commit_seconds, warm_seconds = [], []
    drafters = {(d, k): EagleDraft(head, "dynamic", d, k, max(sizes), vocab=vocab) for d, k in grid}
    statics = {n: EagleDraft(head, "static", shape=static_shape(n, static_depth, rank_accuracy), vocab=vocab)
               for n in sta}
    probe = next(iter(drafters.values()))

    def now() -> float:
        return clock(probe.cache.device)

    for s, i in positions:
        c = seqs[s]
        context, truth = c.ids[: i + 1], c.ids[i + 1:]
        probe.begin(context)
        probe.commit(context[:-3], c.features[: i - 3])
        if before_commit is not None:
            before_commit()
        start = now()  # a typical commit: three accepted positions' features
        probe.commit(context, c.features[i - 3: i])
        commit_seconds.append(now() - start)
        start = now()  # the same commit again (it replaces itself), now with the head's weights cached
        probe.commit(context, c.features[i - 3: i])
        warm_seconds.append(now() - start)
        for key, drafter in list(drafters.items()) + [(("static", n), d) for n, d in statics.items()]:
            drafter.cache, drafter.root = probe.cache, probe.root  # share the committed prefix
            start = now()
            tree = drafter.propose(context, 64, GREEDY, RandomStream(0))
            spent = now() - start
            if key[0] == "static":
                static_seconds[key[1]] += spent
                sta[key[1]].append(len(tree.follow(truth)))
                continue
            seconds[key] += spent
            for n in sizes:
                if n <= len(tree):
                    dyn[key + (n,)].append(len(rerank(tree, n).follow(truth)))
    count = len(positions)
    return {
        "positions": count,
        "commit_seconds": sum(commit_seconds) / count,
        "commit_seconds_repeated": sum(warm_seconds) / count,  # for comparison: not what decoding pays
        "dynamic": [{"depth": d, "top_k": k, "total_tokens": n, "tau": sum(v) / len(v),
                     "draft_seconds": seconds[(d, k)] / count}
                    for (d, k, n), v in dyn.items() if len(v) == count],
        "static": [{"depth": static_depth, "total_tokens": n, "tau": sum(v) / len(v),
                    "draft_seconds": static_seconds[n] / count} for n, v in sta.items()],
    }


@torch.inference_mode()
def walk_tau(drafter: EagleDraft, seqs: list[Continuation], draft_len: int) -> float:
    """tau of `drafter`'s trees (not chains) as greedy decoding meets them: each continuation walked cycle
    by cycle as `decode` does, at most `draft_len` deep. Where features do not depend on how many
    positions a forward scores (the exact bfloat16 engine), this is decode's tau to the bit."""
    tokens = cycles = 0
    for c in seqs:
        i = c.prompt_len - 1  # the root: the last token of the context
        drafter.begin(c.ids[: i + 1])
        drafter.commit(c.ids[: i + 1], c.features[:i])  # prefill
        while i + 1 < len(c.ids):
            left = c.max_new_tokens - (i + 1 - c.prompt_len)
            proposal = drafter.propose(c.ids[: i + 1], min(draft_len, left - 1), GREEDY, RandomStream(0))
            emitted = min(len(proposal.follow(c.ids[i + 1:])), left, len(c.ids) - 1 - i)
            drafter.commit(c.ids[: i + 1 + emitted], c.features[i: i + emitted])
            tokens, cycles, i = tokens + emitted, cycles + 1, i + emitted
    return tokens / cycles



def tau_at_tree(target, tokenizer, heads: dict[str, EagleHead | Eagle3Head],
                tree: tuple[int, int, int] | dict[str, tuple[int, int, int]], prompts=None, max_new_tokens: int = 128,
                positions: int = 160, seed: int = 0) -> dict[str, dict]:
    """Per head, {"tau", "by_prompt": [{"prompt", "positions", "tau"}]} of its dynamic tree `tree`
    (depth, top-k, total tokens; or `tree[name]`), counted as `tune` screens trees at the same
    `positions` roots for every head, on the greedy continuations of `prompts` (default: tuning's)."""
    prompts = mt_bench()[10:30] if prompts is None else prompts
    layers = sorted({layer for head in heads.values() for layer in head.feature_layers})
    seqs = greedy_continuations(target, tokenizer, prompts, max_new_tokens, tuple(layers))
    picks = draft_positions(seqs, positions, seed)
    by_prompt = [[p for p in picks if p[0] == s] for s in range(len(seqs))]
    width = target.config.hidden_size
    out = {}
    for name, head in heads.items():
        depth, top_k, total = tree[name] if isinstance(tree, dict) else tree
        # this head's layers, in its own order, out of the concatenation of all of them
        columns = torch.cat([torch.arange(width) + layers.index(layer) * width for layer in head.feature_layers])
        own = [replace(c, features=c.features[:, columns]) for c in seqs]
        rows = [{"prompt": s, "positions": len(ps),
                 "tau": measure_trees(head, own, ps, depths=(depth,), top_ks=(top_k,),
                                      sizes=(total,))["dynamic"][0]["tau"]}
                for s, ps in enumerate(by_prompt) if ps]
        out[name] = {"tau": sum(r["tau"] * r["positions"] for r in rows) / len(picks), "by_prompt": rows}
    return out


def node_outcomes(head: EagleHead | Eagle3Head, seqs: list[Continuation], positions: list[tuple[int, int]], depth: int,
                  top_k: int, total_tokens: int, vocab: torch.Tensor | None = None) -> list[dict]:
    """Every drafted node at each position, checked greedily: confidence, path confidence, depth, rank,
    whether its parent and it were accepted."""
    drafter = EagleDraft(head, "dynamic", depth, top_k, total_tokens, vocab=vocab)
    out = []
    for s, i in positions:
        c = seqs[s]
        context = c.ids[: i + 1]
        drafter.begin(context)
        drafter.commit(context, c.features[:i])
        tree = drafter.propose(context, depth, GREEDY, RandomStream(0))
        on_path = set(tree.follow(c.ids[i + 1:]))
        depths, rank = tree.depths(), {}
        for node in range(1, len(tree)):
            parent = tree.parents[node]
            rank[parent] = rank.get(parent, -1) + 1
            out.append({"confidence": tree.confidences[node], "path_confidence": math.exp(tree.values[node]),
                        "depth": depths[node], "rank": rank[parent], "parent_accepted": parent in on_path,
                        "accepted": node in on_path})
    return out
