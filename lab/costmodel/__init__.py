"""Choosing an EAGLE tree for this machine: `python -m lab tune tree`.

A bigger tree accepts more tokens per cycle but costs more: the target's forward grows with
the number of tree nodes (the T(n) curve of notebook 01) and every extra drafting depth is
one more head step with its 49k-way LM head. The best tree maximises the predicted speed-up
t_AR / t_spec, where T(n) is the target's forward over n positions after a cached prefix,
draft the measured wall time of drafting the tree (every head step, top-k and reranking),
commit the head's update with the accepted tokens' true features, and tau the mean tokens per
cycle. Both sides are built from the same kind of timings, so that a machine drifting between
measurements does not enter the ratio:

    t_AR   = p + T(1) + loop              t_spec = p + (T(n) + draft + commit + loop) / tau

where p is prefill per new token (paid once per answer, not per cycle), T(1) AR's own
unmasked forward, and loop the time per cycle outside the target's forward (verification,
bookkeeping). p and loop are timed inside AR decodings of the tuning prompts; T(1), like T(n),
is the fastest of interleaved rounds at a fixed prefix (T(n) with a tree mask), smoothed to a
non-decreasing curve (`monotone`). commit is timed right after a target forward, as decoding
runs it: that forward streams all of the target's weights through the CPU's caches and evicts
the head's, and on 2 cores a cold commit costs several times a warm one.

tau is measured without running the target's tree forward: on greedy continuations the
target itself produced (MT-Bench questions that the benchmark does not use), the target's
argmax at every tree node on the true path is simply the next token of the continuation, so
greedy verification of any tree is a walk down the tree along the continuation. Every tree of
the grid is first scored at the same root positions drawn uniformly from the continuations
(`measure_trees`, cheap); but decoding starts its cycles only where the last one ended, and
skips the easy positions inside long accepted runs, so that average is optimistic. The best
candidates are therefore scored again by walking each continuation cycle by cycle exactly as
decoding does (`walk_tau`), and the choice is made on the walked tau.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from ..artifacts import command_line, git_commit, machine, write_json
from ..data import chat_ids, mt_bench
from ..decode import decode
from ..drafters import EagleDraft, NoDraft, draft_vocabulary, static_shape
from ..eagle import EagleHead
from ..heads import head_manifest, rank_accuracy_of
from ..eagle3 import Eagle3Head
from ..models import engine_for
from ..errors import LabError
from ..measure import cropped_forwards, forward_latency, latency_table
from ..paths import DATA_DIR, fast_mode, shipped_head
from ..sampling import RandomStream, Sampling
from ..trees import rerank

CHOICE_PATH = DATA_DIR / "eagle" / "tree_choice.json"
GREEDY = Sampling(0.0, 0, 1.0)
DEPTHS = (2, 3, 4, 5, 6)
TOP_KS = (1, 2, 3, 4, 6, 8)
SIZES = (2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
WALKED = 5  # the best trees by the uniform-position tau that tuning scores again by walking


@dataclass
class TreeChoice:
    depth: int
    top_k: int
    total_tokens: int
    predicted_tau: float
    predicted_speedup: float
    static_predicted_tau: float | None = None
    static_predicted_speedup: float | None = None
    draft_vocab: int = 0  # drafts restricted to this many most frequent tokens (0: all)


@dataclass
class Continuation:
    ids: list[int]             # prompt + greedy response
    prompt_len: int
    features: torch.Tensor     # [len(ids), F] the target's features at every position
    seconds: float             # wall time of the AR decoding that produced it
    max_new_tokens: int        # the decoding's limit (a walk stops drafting where decoding did)
    prefill_seconds: float     # of `seconds`: the prompt's forward
    forward_seconds: float     # of `seconds`: the one-token forwards (the rest is the loop's own time)


class _TimedEngine:
    """An engine whose forwards are timed, so that AR's time per token splits into prefill,
    the target's forward and the decoding loop around it."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.engine.forward(*args, **kwargs)
        if self.engine.model.device.type == "cuda":  # GPU work is asynchronous: wait for it
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - start)
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
    """(sequence, root position) pairs inside the responses, sampled with a fixed seed, at
    least `margin` tokens before the end (so the continuation never cuts a tree short) and
    with at least four scored positions before the root (the commit timing needs them)."""
    all_pos = [(s, i) for s, c in enumerate(seqs) for i in range(max(c.prompt_len - 1, 4), len(c.ids) - 1 - margin)]
    return sorted(random.Random(seed).sample(all_pos, min(count, len(all_pos))))


def measure_trees(head: EagleHead | Eagle3Head, seqs: list[Continuation], positions: list[tuple[int, int]],
                  depths=DEPTHS, top_ks=TOP_KS, sizes=SIZES, static_depth: int | None = None,
                  rank_accuracy: list[float] | None = None, vocab: torch.Tensor | None = None,
                  before_commit: Callable[[], None] | None = None) -> dict:
    """tau and drafting seconds for every (depth, top_k, size) of the dynamic tree, the static
    tree of every size at `static_depth`, and the commit time, all on the same positions.
    `before_commit` runs, untimed, before each timed commit: what decoding runs there (the
    target's verification forward, `verification_pass`), so that the commit is timed with the
    caches as decoding leaves them. The trees are drafted right after the commit, as in decoding."""
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

    def clock() -> float:  # GPU work is asynchronous: wait for it before reading the clock
        if probe.cache.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    for s, i in positions:
        c = seqs[s]
        context, truth = c.ids[: i + 1], c.ids[i + 1:]
        probe.begin(context)
        probe.commit(context[:-3], c.features[: i - 3])
        if before_commit is not None:
            before_commit()
        start = clock()  # a typical commit: three accepted positions' features
        probe.commit(context, c.features[i - 3: i])
        commit_seconds.append(clock() - start)
        start = clock()  # the same commit again (it replaces itself), now with the head's weights cached
        probe.commit(context, c.features[i - 3: i])
        warm_seconds.append(clock() - start)
        for key, drafter in list(drafters.items()) + [(("static", n), d) for n, d in statics.items()]:
            drafter.cache, drafter.root = probe.cache, probe.root  # share the committed prefix
            start = clock()
            tree = drafter.propose(context, 64, GREEDY, RandomStream(0))
            spent = clock() - start
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
    """tau of `drafter`'s trees as greedy decoding meets them: each continuation is walked cycle
    by cycle from the end of its prompt, every cycle rooted where the last one ended, drafting
    no deeper than decoding could (`decode`'s limit at the continuation's max_new_tokens) and
    committing the true features of the accepted positions, exactly as `decode` does (bench
    passes the tree's depth as `draft_len`). Trees only, not chains. Where the target's
    features do not depend on how many positions are scored with them (the exact bfloat16
    engine) this is decode's tau to the bit."""
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


def verification_pass(target, prefix: int = 300, n: int = 4, seed: int = 0) -> Callable[[], None]:
    """A function that runs one tree-masked target forward over `n` positions after a cached
    `prefix` and crops it away again: what decoding runs between two commits of the head."""
    return cropped_forwards(target, [(n, True)], prefix, seed)[(n, True)]


def tau_at_tree(target, tokenizer, heads: dict[str, EagleHead | Eagle3Head], tree: tuple[int, int, int],
                prompts=None, max_new_tokens: int = 128, positions: int = 160, seed: int = 0) -> dict[str, float]:
    """tau of each head's dynamic tree of shape `tree` (depth, top-k, total tokens), counted
    offline as `tune` screens trees (at uniformly drawn roots): on the target's greedy
    continuations of `prompts` (default: the tuning prompts, MT-Bench 10-29), at the same
    `positions` root positions for every head, so heads of either kind are compared on
    identical text. The continuations are decoded once, with every layer any head reads."""
    prompts = mt_bench()[10:30] if prompts is None else prompts
    layers = sorted({layer for head in heads.values() for layer in head.feature_layers})
    seqs = greedy_continuations(target, tokenizer, prompts, max_new_tokens, tuple(layers))
    picks = draft_positions(seqs, positions, seed)
    width = target.config.hidden_size
    depth, top_k, total = tree
    out = {}
    for name, head in heads.items():
        # this head's layers, in its own order, out of the concatenation of all of them
        columns = torch.cat([torch.arange(width) + layers.index(layer) * width for layer in head.feature_layers])
        own = [replace(c, features=c.features[:, columns]) for c in seqs]
        rows = measure_trees(head, own, picks, depths=(depth,), top_ks=(top_k,), sizes=(total,))["dynamic"]
        out[name] = rows[0]["tau"]
    return out


def node_outcomes(head: EagleHead | Eagle3Head, seqs: list[Continuation], positions: list[tuple[int, int]], depth: int,
                  top_k: int, total_tokens: int, vocab: torch.Tensor | None = None) -> list[dict]:
    """Every drafted node of a dynamic tree at each position, checked greedily against the known
    continuation: its confidence, its path confidence (the product of the confidences from the
    root, exp of the tree's path value), depth, rank among its siblings, whether its parent
    was accepted and whether it was. The data behind EAGLE-2's calibration plot and acceptance
    by tree position."""
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


def monotone(latency: dict[int, float]) -> dict[int, float]:
    """The closest non-decreasing curve to measured T(n) (least squares, pool-adjacent-
    violators). A modelling choice, not a law: a forward over more positions can cost less
    (notebook 01 shows T(n) need not be monotone: few-row products take other code paths),
    but such dips are small, and a dip from timing noise (T(20) < T(16) on a busy machine)
    would otherwise decide the tree."""
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for n in sorted(latency):
        blocks.append([latency[n], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(sorted(latency), values))


SPREAD_TOLERANCE = 0.25  # the two fastest rounds of T(n) may differ this much before tuning re-measures


def spread(rounds: list[dict[int, float]]) -> dict[int, float]:
    """Per size n, how far apart the two fastest rounds' T(n) are (second / first - 1): the
    tuner uses the fastest, so it must be reproduced by another round."""
    return {n: (lambda t: t[1] / t[0] - 1)(sorted(r[n] for r in rounds)) for n in rounds[0]}


def agreeing_rounds(rounds: list[dict[int, float]], measure: Callable[[], dict[int, float]], extra: int = 2,
                    tolerance: float = SPREAD_TOLERANCE) -> list[dict[int, float]]:
    """The T(n) rounds, once every n's fastest time is reproduced by another round within
    `tolerance`: a busy machine (another job on the same cores) makes rounds disagree, and a
    tree chosen from such timings is wrong. Up to `extra` more rounds are measured; then
    tuning refuses in one line."""
    for attempt in range(extra + 1):
        n, worst = max(spread(rounds).items(), key=lambda kv: kv[1])
        if worst <= tolerance:
            return rounds
        if attempt < extra:
            rounds = rounds + [measure()]
    raise LabError(f"the fastest two timings of T({n}) differ by {worst:.0%} after {len(rounds)} rounds (tolerance "
                   f"{tolerance:.0%}): the machine is busy; stop other jobs and rerun `python -m lab tune tree`, "
                   "or pass --eagle-tree")


def predicted_speedup(row: dict, latency: dict[int, float], commit: float, ar_forward: float, loop: float,
                      prefill: float) -> float:
    """t_AR / t_spec of the module's formula for one tree `row` (its tau and drafting time)."""
    cycle = latency[row["total_tokens"]] + row["draft_seconds"] + commit + loop
    return (prefill + ar_forward + loop) / (prefill + cycle / row["tau"])


def tune(target, tokenizer, head: EagleHead | Eagle3Head, prompts=None, max_new_tokens: int = 128, positions: int = 160,
         prefix: int = 300, path: Path | None = None, seed: int = 0, rank_accuracy: list[float] | None = None,
         depths=DEPTHS, top_ks=TOP_KS, sizes=SIZES, draft_vocab: int = 0, head_name: str | None = None) -> dict:
    """Measure T(n), draft costs and tau; pick the dynamic tree with the best predicted
    speed-up; write everything (and the static tree's figures at the same budget) to `path`
    (`python -m lab tune tree` passes `choice_path(dtype, name)`; None writes nothing).
    `head_name` is the head's file under data/eagle (default: its kind's shipped one): its
    manifest gives the per-rank accuracy that shapes the static tree."""
    if prompts is None:
        prompts = mt_bench()[10:30]  # bench uses the first 10: tune on others
    # This shared machine drifts by 10-20% over minutes, so the timings the prediction divides
    # are taken interleaved: three rounds, each a third of the AR continuations, then T(n) over
    # all sizes with a tree mask and AR's own unmasked T(1), in turns within the round. Each T
    # is the fastest of its rounds; prefill and the loop's own time come from the continuations'
    # decodings.
    seqs, rounds, ar_forwards = [], [], []
    for r in range(3):
        seqs += greedy_continuations(target, tokenizer, prompts[r::3], max_new_tokens, head.feature_layers)
        # AR's unmasked T(1) in turns with the tree sizes: the prediction divides one by the other
        table = latency_table(target, [(n, True) for n in [1, *sizes]] + [(1, False)], prefix=prefix, repeats=5)
        rounds.append({n: table[(n, True)] for n in [1, *sizes]})
        ar_forwards.append(table[(1, False)])
    rounds = agreeing_rounds(rounds, lambda: forward_latency(target, [1] + list(sizes), prefix=prefix, repeats=5,
                                                            tree=True))
    measured = {n: min(r[n] for r in rounds) for n in rounds[0]}
    latency = monotone(measured)
    new_tokens = sum(len(c.ids) - c.prompt_len for c in seqs)
    ar_per_token = sum(c.seconds for c in seqs) / new_tokens  # what bench measures for AR, kept for comparison
    ar_forward = min(ar_forwards)  # AR's forward takes no mask
    prefill = sum(c.prefill_seconds for c in seqs) / new_tokens
    loop = sum(c.seconds - c.prefill_seconds - c.forward_seconds for c in seqs) / new_tokens  # AR: a cycle per token
    picks = draft_positions(seqs, positions, seed)
    rank_accuracy = rank_accuracy or rank_accuracy_of(head_manifest(head_name or shipped_head(head.variant)))
    vocab = draft_vocabulary(draft_vocab) if draft_vocab else None
    own = getattr(head, "vocab", None)  # an EAGLE-3 head drafts over its own vocabulary
    first = measure_trees(head, seqs, picks, depths, top_ks, sizes, vocab=vocab,
                          before_commit=verification_pass(target, prefix))
    commit = first["commit_seconds"]
    costs = (latency, commit, ar_forward, loop, prefill)
    for row in first["dynamic"]:
        row["predicted_speedup"] = predicted_speedup(row, *costs)
    # screened on the uniform positions, decided on the walk (the module's docstring says why)
    for row in sorted(first["dynamic"], key=lambda r: r["predicted_speedup"], reverse=True)[:WALKED]:
        drafter = EagleDraft(head, "dynamic", row["depth"], row["top_k"], row["total_tokens"], vocab=vocab)
        _walk(row, drafter, seqs, costs)
    best = max((r for r in first["dynamic"] if "walked_tau" in r), key=lambda r: r["walked_predicted_speedup"])
    static = measure_trees(head, seqs, picks, depths=(best["depth"],), top_ks=(best["top_k"],), sizes=sizes,
                           static_depth=best["depth"], rank_accuracy=rank_accuracy, vocab=vocab)["static"]
    for row in static:
        row["predicted_speedup"] = predicted_speedup(row, *costs)
    same = next(r for r in static if r["total_tokens"] == best["total_tokens"])
    shape = static_shape(best["total_tokens"], best["depth"], rank_accuracy)
    _walk(same, EagleDraft(head, "static", shape=shape, vocab=vocab), seqs, costs)
    choice = TreeChoice(best["depth"], best["top_k"], best["total_tokens"], round(best["walked_tau"], 4),
                        round(best["walked_predicted_speedup"], 4), round(same["walked_tau"], 4),
                        round(same["walked_predicted_speedup"], 4), draft_vocab)
    responses = torch.tensor([t for c in seqs for t in c.ids[c.prompt_len:]])
    drafted = own.cpu() if own is not None else vocab
    coverage = 1.0 if drafted is None else float(torch.isin(responses, drafted).float().mean())
    result = {"command": command_line(), "commit": git_commit(), "machine": machine(),
              "head": head_name or shipped_head(head.variant), "dtype": dtype_name(target.dtype),
              "tuning_prompts": [p.id for r in range(3) for p in prompts[r::3]],
              "max_new_tokens": max_new_tokens,
              "prefix_tokens_for_latency": prefix, "fast_mode": fast_mode(),
              "target_latency_seconds_measured": {str(k): v for k, v in measured.items()},
              "target_latency_rounds": len(rounds),
              "target_latency_spread": {str(k): round(v, 4) for k, v in spread(rounds).items()},
              "target_latency_seconds": {str(k): v for k, v in latency.items()},  # monotone(measured)
              "ar_forward_seconds": ar_forward, "loop_seconds": loop, "prefill_seconds_per_token": prefill,
              "commit_seconds": commit, "commit_seconds_repeated": first["commit_seconds_repeated"],
              "ar_seconds_per_token": ar_per_token,
              "predicted_ar_seconds_per_token": prefill + ar_forward + loop, "positions": first["positions"],
              "walked_trees": WALKED,
              "draft_vocab": draft_vocab, "draft_vocab_coverage_of_tuning_responses": coverage,
              "draft_vocab_size": len(drafted) if drafted is not None else "all",
              "choice": asdict(choice), "dynamic": first["dynamic"], "static": static,
              "rank_accuracy": rank_accuracy}
    if path:
        write_json(path, result)
    return result


def _walk(row: dict, drafter: EagleDraft, seqs: list[Continuation], costs: tuple) -> None:
    """Add a tuning row's walked tau and the speed-up predicted from it beside its
    uniform-position figures (`tau`, `predicted_speedup`, which every row has)."""
    row["walked_tau"] = walk_tau(drafter, seqs, row["depth"])
    row["walked_predicted_speedup"] = predicted_speedup({**row, "tau": row["walked_tau"]}, *costs)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16", the name the command line and the choice files use."""
    return str(dtype).removeprefix("torch.")


def choice_path(dtype: str = "float32", head: str = "eagle1") -> Path:
    """Where `tune` keeps its choice for a head with the target in `dtype` (each dtype has its
    own T(n), each head its own acceptance)."""
    parts = [p for p in (None if head == "eagle1" else head, None if dtype == "float32" else dtype) if p]
    return CHOICE_PATH.with_name("_".join(["tree_choice", *parts]) + ".json")


def _tune_command(head: str, kind: str | None, dtype: str) -> str:
    kind = kind or head
    # an EAGLE-3 head is always named: the kind's default file is eagle3-full, not eagle3
    named = head != kind or kind == "eagle3"
    return f"python -m lab tune tree --head {kind}" + (f" --name {head}" if named else "") + f" --dtype {dtype}"


def load_choice(path: Path | None = None, dtype: str = "float32", head: str = "eagle1",
                kind: str | None = None) -> TreeChoice:
    """The tuned tree of the head file `head` (of `kind` eagle1 or eagle3: default, the same
    name); it is only valid for the dtype whose T(n) the tuning measured."""
    path = path or choice_path(dtype, head)
    if not path.exists():
        raise LabError(f"no tuned tree at {path}: run `{_tune_command(head, kind, dtype)}` (a few minutes) "
                       "or pass --eagle-tree depth,top-k,total")
    tuned = json.loads(path.read_text())
    if tuned["dtype"] != dtype:
        raise LabError(f"the tree in {path} was tuned with the target in {tuned['dtype']}, not {dtype}: "
                       f"run `{_tune_command(head, kind, dtype)}` or pass --eagle-tree depth,top-k,total")
    return TreeChoice(**tuned["choice"])


def given_tree(depth: int, top_k: int, total_tokens: int, path: Path | None = None,
               dtype: str = "float32", head: str = "eagle1", kind: str | None = None) -> TreeChoice:
    """A tree the user chose, drafting over the tuned draft vocabulary (8,192 tokens without a
    tuning; an EAGLE-3 head over its own), with the tuner's predictions for it where the
    tuning measured that tree with the target in the same dtype (another dtype has another
    T(n), so no prediction); the walked figures where tuning walked that tree, the (optimistic)
    uniform-root ones otherwise. `head` names the head file whose tuning applies, `kind` (eagle1 or
    eagle3) what it is: by default the same as `head`."""
    path = path or choice_path(dtype, head)
    if not path.exists():
        return TreeChoice(depth, top_k, total_tokens, None, None, draft_vocab=0 if (kind or head) == "eagle3" else 8192)
    tuned = json.loads(path.read_text())
    if tuned["dtype"] != dtype:
        return TreeChoice(depth, top_k, total_tokens, None, None, draft_vocab=tuned["choice"]["draft_vocab"])
    same = [r for r in tuned["dynamic"] if (r["depth"], r["top_k"], r["total_tokens"]) == (depth, top_k, total_tokens)]
    static = [r for r in tuned["static"] if (r["depth"], r["total_tokens"]) == (depth, total_tokens)]
    def pick(rows: list[dict], key: str) -> float | None:  # the walked figure where tuning walked that tree
        return round(rows[0].get(f"walked_{key}", rows[0][key]), 4) if rows else None
    return TreeChoice(depth, top_k, total_tokens, pick(same, "tau"), pick(same, "predicted_speedup"),
                      pick(static, "tau"), pick(static, "predicted_speedup"), tuned["choice"]["draft_vocab"])


def batch_speedups(tau: float, latency: dict[tuple[int, int], float], n: int, draft_seconds: float,
                   draft_scaling: str = "batched") -> dict[int, float]:
    """Predicted speed-up of speculative decoding over AR when `batch` sequences are decoded
    together, per batch size: tau * T(b, 1) / (T(b, n) + draft(b)), with T(b, k) measured
    (`lab.measure.batch_forward_latency`), tau assumed not to depend on the batch (each
    sequence drafts and verifies its own tree) and `draft_seconds` the drafting cost of one
    cycle at batch 1. How drafting grows with the batch is assumed, not measured:
    `batched` scales it like the target's one-token step, draft(b) = draft(1) * T(b, 1) / T(1, 1)
    (the draft batched as well as the target); `serial` as b * draft(1) (one sequence after
    another). The decoding loop's own overhead is left out on both sides."""
    if draft_scaling not in ("batched", "serial"):
        raise ValueError(f"draft_scaling must be 'batched' or 'serial', got {draft_scaling!r}")
    out = {}
    for b in sorted({b for b, _ in latency}):
        grow = latency[(b, 1)] / latency[(1, 1)] if draft_scaling == "batched" else b
        out[b] = tau * latency[(b, 1)] / (latency[(b, n)] + draft_seconds * grow)
    return out


def choice_row(tuned: dict) -> dict:
    """The grid row of a `tune` result's chosen tree (its uniform-root and walked figures)."""
    c = tuned["choice"]
    return next(r for r in tuned["dynamic"]
                if (r["depth"], r["top_k"], r["total_tokens"]) == (c["depth"], c["top_k"], c["total_tokens"]))


def tuned_cycle_costs(path: Path) -> dict:
    """From a `tune` file: the chosen tree's size and what one drafting cycle cost on the
    tuning machine at batch 1 (drafting the tree plus committing the accepted features)."""
    tuned = json.loads(path.read_text())
    c, row = tuned["choice"], choice_row(tuned)
    return {"total_tokens": c["total_tokens"], "draft_seconds": row["draft_seconds"],
            "commit_seconds": tuned["commit_seconds"], "machine": tuned["machine"]["cpu"], "command": tuned["command"]}
