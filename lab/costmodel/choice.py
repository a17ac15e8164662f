"""Tree tuning: `tune` writes the tree with the best predicted speed-up (or AR, where none pays) to a
choice file per head and dtype that records the CPU's fingerprint; `tree_for_machine` uses a tuning
only on the machine it was made for; the readers of those files; and Medusa's tree (`medusa_tree`)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..artifacts import command_line, cpu_fingerprint, fingerprint_id, git_commit, machine, repo_path, write_json
from ..data import mt_bench
from ..drafters import EagleDraft, draft_vocabulary, static_shape
from ..drafters.eagle1 import EagleHead
from ..drafters.eagle3 import Eagle3Head
from ..drafters.heads import head_manifest, rank_accuracy_of
from ..errors import LabError
from ..measure import forward_latency, latency_table
from ..paths import CACHE_DIR, DATA_DIR, fast_mode, shipped_head
from ..target.load import dtype_name
from .costs import BusyMachine, agreeing_rounds, monotone, predicted_speedup, spread, verification_pass
from .tau import DEPTHS, SIZES, TOP_KS, Continuation, draft_positions, greedy_continuations, measure_trees, walk_tau

CHOICE_PATH = DATA_DIR / "eagle" / "tree_choice.json"
WALKED = 5  # the best trees by the uniform-position tau that tuning scores again by walking
QUICK = {"prompts": 6, "max_new_tokens": 48, "positions": 48, "depths": (2, 3, 4), "top_ks": (1, 2, 4),
         "sizes": (2, 3, 4, 6, 8, 12, 16), "walked": 3, "extra_rounds": 8}
# A quick tuning on a busy machine takes up to 8 more timing rounds (each a few seconds, together less than
# the rest of the tuning) before it gives up; decoding then falls back to CONSERVATIVE and caches nothing.
# a tree must be predicted this much faster than AR: predictions miss the bench by a few percent
PAYS = 1.05
CONSERVATIVE = (2, 1, 3)  # where no tuning for the machine exists: a chain of two drafts, cheap to verify
DRAFT_VOCAB = 8192  # an EAGLE-1 head drafts over this many most frequent training tokens by default


def draft_vocab_of(kind: str) -> int:
    """The default draft vocabulary of a head of `kind`: 0 (its own) for eagle3, else DRAFT_VOCAB."""
    return 0 if kind == "eagle3" else DRAFT_VOCAB


@dataclass
class TreeChoice:
    """A tree (depth, top-k, total tokens) and tuning's predictions for it and the same-size static tree."""
    depth: int
    top_k: int
    total_tokens: int
    predicted_tau: float
    predicted_speedup: float
    static_predicted_tau: float | None = None
    static_predicted_speedup: float | None = None
    draft_vocab: int = 0  # drafts restricted to this many most frequent tokens (0: all)
    source: str = ""      # where this tree came from, in one line (not stored in a choice file)

    @property
    def is_ar(self) -> bool:
        """The tuner found no tree that pays on its machine: decode without drafts."""
        return self.total_tokens == 1


def tune(target, tokenizer, head: EagleHead | Eagle3Head, prompts=None, max_new_tokens: int = 128, positions: int = 160,
         prefix: int = 300, path: Path | None = None, seed: int = 0, rank_accuracy: list[float] | None = None,
         depths=DEPTHS, top_ks=TOP_KS, sizes=SIZES, draft_vocab: int = 0, head_name: str | None = None,
         walked: int = WALKED, extra_rounds: int = 2) -> dict:
    """Measure T(n), draft costs and tau; pick the dynamic tree with the best predicted speed-up, or AR
    where none pays (PAYS). Returns everything (the static tree's figures at the same budget too) and
    writes it to `path` unless None. `head_name`: the head's file (default: its kind's shipped one).
    Timing rounds that still disagree after `extra_rounds` more raise BusyMachine, and nothing is written."""
    if prompts is None:
        prompts = mt_bench()[10:30]  # bench uses the first 10: tune on others
    # Interleaved against drift: each of three rounds decodes a third of the AR continuations, then times
    # T(n) (tree mask) and AR's unmasked T(1) in turns. Each T is the fastest of its rounds.
    seqs, rounds, ar_forwards = [], [], []
    for r in range(3):
        seqs += greedy_continuations(target, tokenizer, prompts[r::3], max_new_tokens, head.feature_layers)
        table = latency_table(target, [(n, True) for n in [1, *sizes]] + [(1, False)], prefix=prefix, repeats=5)
        rounds.append({n: table[(n, True)] for n in [1, *sizes]})
        ar_forwards.append(table[(1, False)])
    rounds = agreeing_rounds(rounds, lambda: forward_latency(target, [1] + list(sizes), prefix=prefix, repeats=5,
                                                            tree=True), extra=extra_rounds)
    measured = {n: min(r[n] for r in rounds) for n in rounds[0]}
    latency = monotone(measured)
    new_tokens = sum(len(c.ids) - c.prompt_len for c in seqs)
    ar_per_token = sum(c.seconds for c in seqs) / new_tokens  # what bench measures for AR, kept for comparison
    ar_forward = min(ar_forwards)
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
    # screened on the uniform positions, decided on the walk (lab/costmodel/tau.py says why)
    for row in sorted(first["dynamic"], key=lambda r: r["predicted_speedup"], reverse=True)[:walked]:
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
    choice = tree_or_ar(choice)
    responses = torch.tensor([t for c in seqs for t in c.ids[c.prompt_len:]])
    drafted = own.cpu() if own is not None else vocab
    coverage = 1.0 if drafted is None else float(torch.isin(responses, drafted).float().mean())
    result = {"command": command_line(), "commit": git_commit(), "machine": machine(),
              "head": head_name or shipped_head(head.variant),
              "head_weights_sha": head_weights_sha(head_name or shipped_head(head.variant)),
              "dtype": dtype_name(target),
              "tuning_prompts": [p.id for r in range(3) for p in prompts[r::3]],
              "max_new_tokens": max_new_tokens,
              "prefix_tokens_for_latency": prefix, "fast_mode": fast_mode(),
              "target_latency_seconds_measured": {str(k): v for k, v in measured.items()},
              "target_latency_rounds": len(rounds),
              "target_latency_spread": {str(k): round(v, 4) for k, v in spread(rounds).items()},
              "target_latency_seconds": {str(k): v for k, v in latency.items()},
              "ar_forward_seconds": ar_forward, "loop_seconds": loop, "prefill_seconds_per_token": prefill,
              "commit_seconds": commit, "commit_seconds_repeated": first["commit_seconds_repeated"],
              "ar_seconds_per_token": ar_per_token,
              "predicted_ar_seconds_per_token": prefill + ar_forward + loop, "positions": first["positions"],
              "walked_trees": walked, "best_tree_predicted_speedup": round(best["walked_predicted_speedup"], 4),
              "draft_vocab": draft_vocab, "draft_vocab_coverage_of_tuning_responses": coverage,
              "draft_vocab_size": len(drafted) if drafted is not None else "all",
              "choice": {k: v for k, v in asdict(choice).items() if k != "source"},
              "dynamic": first["dynamic"], "static": static,
              "rank_accuracy": rank_accuracy}
    if path:
        write_json(path, result)
    return result


def tree_or_ar(best: TreeChoice) -> TreeChoice:
    """The tuner's best tree if it is predicted to pay (PAYS), else AR (the root alone, speed-up 1)."""
    return best if best.predicted_speedup >= PAYS else TreeChoice(0, 0, 1, 1.0, 1.0, draft_vocab=best.draft_vocab)


def _walk(row: dict, drafter: EagleDraft, seqs: list[Continuation], costs: tuple) -> None:
    """Add a tuning row's walked tau and the speed-up predicted from it beside its uniform-root ones."""
    row["walked_tau"] = walk_tau(drafter, seqs, row["depth"])
    row["walked_predicted_speedup"] = predicted_speedup({**row, "tau": row["walked_tau"]}, *costs)


def choice_path(dtype: str = "float32", head: str = "eagle1") -> Path:
    """Where `tune` keeps its choice for a head and target dtype (each has its own acceptance or T(n))."""
    parts = [p for p in (None if head == "eagle1" else head, None if dtype == "float32" else dtype) if p]
    return CHOICE_PATH.with_name("_".join(["tree_choice", *parts]) + ".json")


def _tune_command(head: str, kind: str | None, dtype: str) -> str:
    kind = kind or head
    # an EAGLE-3 head is always named: the kind's default file is eagle3-full, not eagle3
    named = head != kind or kind == "eagle3"
    return f"python -m lab tune tree --head {kind}" + (f" --name {head}" if named else "") + f" --dtype {dtype}"


def load_choice(path: Path | None = None, dtype: str = "float32", head: str = "eagle1",
                kind: str | None = None) -> TreeChoice:
    """The tuned tree of the head file `head` (of `kind` eagle1 or eagle3; default the same name).
    Raises LabError if the choice file is missing or was tuned with the target in another dtype."""
    path = path or choice_path(dtype, head)
    if not path.exists():
        raise LabError(f"no tuned tree at {path}: run `{_tune_command(head, kind, dtype)}` (a few minutes) "
                       "or pass --eagle-tree depth,top-k,total")
    tuned = json.loads(path.read_text())
    if tuned["dtype"] != dtype:
        raise LabError(f"the tree in {path} was tuned with the target in {tuned['dtype']}, not {dtype}: "
                       f"run `{_tune_command(head, kind, dtype)}` or pass --eagle-tree depth,top-k,total")
    return TreeChoice(**tuned["choice"])


def tuning_cache_path(dtype: str, head: str, fingerprint: dict | None = None) -> Path:
    """Where `python -m lab tune tree --quick` keeps a head's tuning for one machine (not shipped)."""
    return CACHE_DIR / "tuning" / fingerprint_id(fingerprint or cpu_fingerprint()) / choice_path(dtype, head).name


def _made_on(tuned: dict) -> str:
    m = tuned.get("machine", {})
    made = m.get("fingerprint")
    return fingerprint_id(made) if made else f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, fingerprint unrecorded"


def machine_tuning(dtype: str, head: str) -> tuple[Path | None, str]:
    """(path, "") of the tuning of `head` in `dtype` made on this machine for the head's current
    manifest: the shipped choice file, else the cached quick tuning; (None, the reason) where neither."""
    here, head_sha = cpu_fingerprint(), head_weights_sha(head)
    shipped = choice_path(dtype, head)
    read = {path: json.loads(path.read_text()) for path in (shipped, tuning_cache_path(dtype, head, here))
            if path.exists()}
    for path, tuned in read.items():
        if (tuned["dtype"] == dtype and tuned.get("machine", {}).get("fingerprint") == here
                and tuned.get("head_weights_sha", head_sha) == head_sha):
            return path, ""
    if shipped not in read:
        why = f"{repo_path(shipped)} does not exist"
    elif read[shipped].get("head_weights_sha", head_sha) != head_sha:
        why = f"{repo_path(shipped)} tuned an earlier {head} (its weights changed since)"
    else:
        why = f"{repo_path(shipped)} was tuned on {_made_on(read[shipped])}"
    return None, f"no {dtype} tuning of {head} for this machine ({fingerprint_id(here)}; {why})"


def head_weights_sha(head: str) -> str | None:
    """A short hash of the head's weights (None without them): a retrained head is tuned again, while
    an evaluation written into its manifest leaves its tunings standing."""
    path = DATA_DIR / "eagle" / f"{head}.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else None


def may_tune() -> bool:
    """Whether decoding may tune a tree it lacks: not in fast mode or under pytest (CI tunes nothing)."""
    return not fast_mode() and "PYTEST_CURRENT_TEST" not in os.environ


def tree_for_machine(dtype: str, head: str, kind: str, quick_tune: Callable[[Path], dict] | None) -> TreeChoice:
    """The tree of the head file `head` (of `kind` eagle1 or eagle3), never from another machine's
    tuning: this machine's (`machine_tuning`); else `quick_tune(path)` into the cache where given and
    `may_tune()`; else (no tuning allowed, or a quick tuning the busy machine's timings made give up) the
    chain CONSERVATIVE. The choice's `source` says which, in one line."""
    path, why = machine_tuning(dtype, head)
    off = "" if may_tune() else " (no tuning runs in tests or fast mode)"
    if path is None and quick_tune is not None and may_tune():
        start = time.perf_counter()
        try:
            quick_tune(tuning_cache_path(dtype, head))
            path = tuning_cache_path(dtype, head)
            why += (f"; tuned now in {time.perf_counter() - start:.0f} s, "
                    f"as `{_tune_command(head, kind, dtype)} --quick`")
        except BusyMachine as busy:
            why += f"; a quick tuning gave up after {time.perf_counter() - start:.0f} s ({busy.rounds} timing " \
                   "rounds disagreed: the machine is busy), nothing cached"
            off = " (tune on a quiet machine later)"
    if path is None:
        d, k, n = CONSERVATIVE
        return TreeChoice(d, k, n, None, None, draft_vocab=draft_vocab_of(kind),
                          source=f"{why}: a conservative chain {d},{k},{n} instead{off}; tune it: "
                                 f"`{_tune_command(head, kind, dtype)} --quick` (about a minute)")
    choice = load_choice(path, dtype)
    what = ("AR: the tuning found no tree that pays here" if choice.is_ar
            else f"tree {choice.depth},{choice.top_k},{choice.total_tokens}")
    why = why or f"tuned on this machine, {fingerprint_id(cpu_fingerprint())}"
    return dataclasses.replace(choice, source=f"{what}, from {repo_path(path)} ({why})")


def quick_tune(target, tokenizer, head: EagleHead | Eagle3Head, head_name: str, path: Path | None) -> dict:
    """`tune` on the QUICK grid, for a machine without its own tuning."""
    q = QUICK
    return tune(target, tokenizer, head, prompts=mt_bench()[10:10 + q["prompts"]], max_new_tokens=q["max_new_tokens"],
                positions=q["positions"], path=path, depths=q["depths"], top_ks=q["top_ks"], sizes=q["sizes"],
                draft_vocab=draft_vocab_of(head.variant), head_name=head_name, walked=q["walked"],
                extra_rounds=q["extra_rounds"])


def given_tree(depth: int, top_k: int, total_tokens: int, path: Path | None = None,
               dtype: str = "float32", head: str = "eagle1", kind: str | None = None) -> TreeChoice:
    """A tree the user chose, drafting over the tuned draft vocabulary, with the predictions of the tuning
    `path` (default: this machine's) where it measured that tree in `dtype`, else None: walked figures
    where tuning walked it, the optimistic uniform-root ones otherwise."""
    vocab = draft_vocab_of(kind or head)
    if path is None:
        shipped = choice_path(dtype, head)
        if shipped.exists():  # the draft vocabulary is the head's, whichever machine tuned it
            vocab = json.loads(shipped.read_text())["choice"]["draft_vocab"]
        path = machine_tuning(dtype, head)[0]
    if path is None or not path.exists():
        return TreeChoice(depth, top_k, total_tokens, None, None, draft_vocab=vocab)
    tuned = json.loads(path.read_text())
    if tuned["dtype"] != dtype:
        return TreeChoice(depth, top_k, total_tokens, None, None, draft_vocab=tuned["choice"]["draft_vocab"])
    same = [r for r in tuned["dynamic"] if (r["depth"], r["top_k"], r["total_tokens"]) == (depth, top_k, total_tokens)]
    static = [r for r in tuned["static"] if (r["depth"], r["total_tokens"]) == (depth, total_tokens)]
    def pick(rows: list[dict], key: str) -> float | None:
        return round(rows[0].get(f"walked_{key}", rows[0][key]), 4) if rows else None
    return TreeChoice(depth, top_k, total_tokens, pick(same, "tau"), pick(same, "predicted_speedup"),
                      pick(static, "tau"), pick(static, "predicted_speedup"), tuned["choice"]["draft_vocab"])


def choice_row(tuned: dict) -> dict:
    """The grid row of a `tune` result's chosen tree; empty where it chose AR, which is not in the grid."""
    c = tuned["choice"]
    if c["total_tokens"] == 1:
        return {}
    return next(r for r in tuned["dynamic"]
                if (r["depth"], r["top_k"], r["total_tokens"]) == (c["depth"], c["top_k"], c["total_tokens"]))


def tuned_cycle_costs(path: Path) -> dict:
    """From a `tune` file: the chosen tree's size and its drafting and commit seconds at batch 1."""
    tuned = json.loads(path.read_text())
    c, row = tuned["choice"], choice_row(tuned)
    return {"total_tokens": c["total_tokens"], "draft_seconds": row.get("draft_seconds", 0.0),
            "commit_seconds": tuned["commit_seconds"], "machine": tuned["machine"]["cpu"], "command": tuned["command"]}


def medusa_tree(accuracy: list[list[float]], tuned_path: Path, draft_seconds: float
                ) -> tuple[list[tuple[int, ...]], dict]:
    """Medusa's static tree sized by the cost model: the n - 1 best rank paths (`static_shape`) for the n
    of `tuned_path` whose predicted speed-up is best, tau being 1 + the sum of the paths' products of
    accuracies `accuracy[head][rank]` (heads assumed to err independently). Returns paths and figures."""
    tuned = json.loads(tuned_path.read_text())
    latency = {int(n): seconds for n, seconds in tuned["target_latency_seconds"].items()}
    rows = []
    for n in sorted(k for k in latency if k >= 2):  # a tree of at least one draft
        shape = static_shape(n, len(accuracy), accuracy)
        row = {"total_tokens": n, "draft_seconds": draft_seconds,
               "tau": 1 + sum(math.prod(accuracy[d][r] for d, r in enumerate(p)) for p in shape)}
        row["predicted_speedup"] = predicted_speedup(row, latency, 0.0, tuned["ar_forward_seconds"],
                                                     tuned["loop_seconds"], tuned["prefill_seconds_per_token"])
        rows.append(row)
    best = max(rows, key=lambda r: r["predicted_speedup"])
    return static_shape(best["total_tokens"], len(accuracy), accuracy), {**best, "latency_from": tuned["command"],
                                                                        "latency_machine": tuned["machine"]["cpu"]}
