"""`python -m lab bench --batch-size 1,2,4,...`: the lossless methods of the lab's loop decoding
groups of b prompts at once on the exact engine (`lab.batched.decode_batch`), each method against
batched AR at the same b, beside the cost model's prediction from T(b, n) measured on the same
engine. Every b runs in one process, the methods interleaved group by group."""
from __future__ import annotations

import time
from pathlib import Path

from ..artifacts import command_line, git_commit, machine, write_json
from ..costmodel import batch_speedups
from ..data import Prompt, chat_ids
from ..batched import decode_batch
from ..decode import DecodeResult
from ..errors import LabError
from ..measure import exact_batch_latency
from ..sampling import prompt_seed
from ..target.load import engine_for, engine_kind
from .methods import make_drafter, method_settings
from .setup import LOSSY_METHODS, PEERS, Setup

LATENCY_PREFIX = 200  # cached tokens per sequence when T(b, n) is measured for the prediction


def batch_sizes(text: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4]: distinct positive sizes, in the order given."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise LabError(f"--batch-size takes distinct positive integers like 1,2,4,8,16 (got {text!r})")
    return sizes


def _group(setup: Setup, method: str, ids: list[list[int]], indices: list[int]) -> tuple[list[DecodeResult], float]:
    """One group decoded at once: its results and the group's wall time (engines and drafters are
    built before the clock starts)."""
    targets = [engine_for(setup.target) for _ in ids]
    made = [make_drafter(setup, method) for _ in ids]
    seeds = [prompt_seed(setup.seed, i) for i in indices]
    start = time.perf_counter()
    results = decode_batch(targets, [d for d, _, _ in made], ids, setup.max_new_tokens, setup.sampling, made[0][1],
                           seeds, setup.tokenizer.eos_token_id, kernel=setup.kernel)
    return results, time.perf_counter() - start


def _summary(rows: list[DecodeResult], seconds: float, reference: list[DecodeResult] | None) -> dict:
    tokens, cycles = sum(len(r.tokens) for r in rows), sum(r.cycles for r in rows)
    same = None if reference is None else [r.tokens == a.tokens for r, a in zip(rows, reference)]
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "new_tokens": tokens, "tau": tokens / cycles,
            "cycles": cycles, "positions_per_cycle": sum(r.scored_positions for r in rows) / cycles,
            "draft_seconds_per_cycle": sum(r.draft_seconds for r in rows) / cycles,
            # from the group's start to each request's last token
            "latency_s": [round(r.seconds, 4) for r in rows],
            "identical_to_ar": None if same is None else all(same),
            "identical_prompts": None if same is None else sum(same)}


def run_batch_bench(methods: list[str], prompts: list[Prompt], setup: Setup, config: dict, draft_layers: int,
                    sizes: list[int], json_path: str | Path | None = None, progress: bool = True) -> dict:
    """Every method at every batch size on the same prompts (groups of b consecutive prompts).
    Identity is checked against AR at the smallest b, prompt by prompt, at temperature 0."""
    others = [m for m in methods if m in PEERS or m in LOSSY_METHODS]
    if others:
        raise LabError(f"--batch-size takes the lossless methods of the lab's loop, not {', '.join(others)}")
    if "ar" not in methods:
        raise LabError("--batch-size compares every method with batched AR: add ar to --methods")
    if not prompts:
        raise LabError("no prompts to benchmark: check --dataset/--limit or the --prompts file")
    ids = [chat_ids(setup.tokenizer, p.text) for p in prompts]
    for m in methods:  # untimed warm-up on the first prompt
        drafter, draft_len, _ = make_drafter(setup, m)
        decode_batch([engine_for(setup.target)], [drafter], ids[:1], min(16, setup.max_new_tokens), setup.sampling,
                     draft_len, [0], setup.tokenizer.eos_token_id, setup.kernel)
    rows = {(m, b): [] for m in methods for b in sizes}
    seconds = {key: 0.0 for key in rows}
    for b in sizes:
        for first in range(0, len(prompts), b):
            indices = list(range(first, min(first + b, len(prompts))))
            for m in methods:  # interleaved: each group sees every method before the next group
                results, wall = _group(setup, m, [ids[i] for i in indices], indices)
                rows[(m, b)] += results
                seconds[(m, b)] += wall
        if progress:
            print(f"[bench] batch size {b} done", flush=True)
    greedy = setup.sampling.greedy
    reference = rows[("ar", min(sizes))] if greedy else None
    batched = {m: {str(b): _summary(rows[(m, b)], seconds[(m, b)], reference) for b in sizes} for m in methods}
    # the prediction: tau and drafting per cycle as measured at the smallest b, T(b, n) measured now
    sizes_n = {m: max(1, round(batched[m][str(min(sizes))]["positions_per_cycle"])) for m in methods}
    latency = exact_batch_latency(setup.target, sorted(set(sizes) | {1}), sorted(set(sizes_n.values()) | {1}),
                                  prefix=LATENCY_PREFIX, repeats=3)
    crossing = {}
    for m in methods:
        first = batched[m][str(min(sizes))]
        predicted = batch_speedups(first["tau"], latency, sizes_n[m], first["draft_seconds_per_cycle"], "batched")
        for b in sizes:
            s = batched[m][str(b)]
            s["speedup_over_ar"] = s["tokens_per_s"] / batched["ar"][str(b)]["tokens_per_s"]
            s["predicted_speedup"] = predicted[b]
        below = [b for b in sorted(sizes) if batched[m][str(b)]["speedup_over_ar"] < 1.0]
        crossing[m] = below[0] if below else f"> {max(sizes)}"
    result = {"kind": "batch_bench", "machine": machine(), "commit": git_commit(), "command": command_line(),
              "config": {**config, "engine": engine_kind(setup.target), "batch_sizes": sizes,
                         "methods": {m: method_settings(setup, m, draft_layers) for m in methods}},
              "batched": batched, "crossing_batch_size": crossing,
              "latency_ms": {f"{b},{n}": round(t * 1e3, 3) for (b, n), t in sorted(latency.items())},
              "positions_per_cycle": sizes_n, "prediction": "tau x T(b, 1) / (T(b, n) + drafting per cycle x "
              f"T(b, 1) / T(1, 1)), tau and drafting at the smallest b (drafting batched as the target's forward "
              f"is), T(b, n) of forward_batch after {LATENCY_PREFIX} cached tokens per sequence"}
    if json_path:
        write_json(Path(json_path), result)
    return result


def format_batch_table(result: dict) -> str:
    """The table `bench --batch-size` prints: one row per method and b, and where each method crosses 1x."""
    head = ["method", "b", "tok/s", "speed-up over ar at b", "predicted", "tau", "latency s (mean)", "identical"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, by_size in result["batched"].items():
        for b, s in by_size.items():
            same = {True: "yes", False: f"NO ({s['identical_prompts']}/{len(s['latency_s'])})", None: "n/a"}
            lines.append("| " + " | ".join([
                m, b, f"{s['tokens_per_s']:.1f}", f"{s['speedup_over_ar']:.2f}x", f"{s['predicted_speedup']:.2f}x",
                f"{s['tau']:.2f}", f"{sum(s['latency_s']) / len(s['latency_s']):.2f}",
                same[s["identical_to_ar"]]]) + " |")
    lines.append("crossing (the first b where the method is slower than batched ar): " + ", ".join(
        f"{m} {b}" for m, b in result["crossing_batch_size"].items() if m != "ar"))
    ar = result["batched"]["ar"]
    smallest = min(ar, key=int)
    lines.append(f"ar throughput against b = {smallest}: " + ", ".join(
        f"b = {b} {s['tokens_per_s'] / ar[smallest]['tokens_per_s']:.2f}x" for b, s in ar.items() if b != smallest))
    return "\n".join(lines)


def batch_headline(result: dict) -> str:
    """The README's headline sentence for a batched run."""
    batched, sizes = result["batched"], result["config"]["batch_sizes"]
    ar, eagle2, first, last = batched["ar"], batched["eagle2"], str(min(sizes)), str(max(sizes))
    same = all(s["identical_to_ar"] for by_size in batched.values() for s in by_size.values())
    return (f"{len(ar[first]['latency_s'])} prompts in batches of {', '.join(map(str, sizes))}"
            f"{', every sequence identical to its own AR decoding' if same else ''}: batched `ar` reaches "
            f"{ar[last]['tokens_per_s'] / ar[first]['tokens_per_s']:.2f}x its b = {first} throughput at b = {last}; "
            f"`eagle2` {eagle2[first]['speedup_over_ar']:.2f}x batched `ar` at b = {first}, slower from b = "
            f"{result['crossing_batch_size']['eagle2']}")
