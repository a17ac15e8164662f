"""A bench result in words: its table, what it verified against AR, what its EAGLE methods
drafted with, repeated runs of one command side by side, and two methods compared over such runs."""
from __future__ import annotations

import statistics

from ..intervals import ratio_bootstrap
from .run import CYCLE_PHASES
from .setup import LOSSY_METHODS, PEERS


def format_table(result: dict) -> str:
    k = max(len(s["acceptance_by_position"]) for s in result["methods"].values())
    predicted = any(s.get("predicted_speedup") for s in result["methods"].values())
    quality = any("humaneval_pass_at_1" in s for s in result["methods"].values())
    # time shares, each shown only if some method has it (results from before it have none)
    shares = [(column, key) for column, key in (("scoring", "score_share"), ("drafting", "draft_share"))
              if any(s.get(key) for s in result["methods"].values())]
    head = (["method", "tok/s", "speedup"] + (["predicted"] if predicted else []) + ["tau", "new tok", "fwd"]
            + [column for column, _ in shares] + [f"acc@{i + 1}" for i in range(k)] + ["identical"]
            + (["pass@1"] if quality else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in result["methods"].items():
        acc = [f"{a:.2f}" if a is not None else "" for a in s["acceptance_by_position"]]
        acc += [""] * (k - len(acc))
        ident = {True: "yes", False: "NO" if s.get("lossless", True) else "no (lossy)",
                 None: "n/a"}[s["identical_to_ar"]]
        if s["numerical_ties"]:
            ident += f" ({s['numerical_ties']} ties)"
        speed = [f"{s['speedup']:.2f}x" if s["speedup"] else ""]
        if predicted:
            speed.append(f"{s['predicted_speedup']:.2f}x" if s.get("predicted_speedup") else "")
        share = [f"{s[key]:.0%}" if s.get(key) else "" for _, key in shares]
        lines.append("| " + " | ".join([name, f"{s['tokens_per_s']:.1f}", *speed, f"{s['tau']:.2f}",
                                        str(s["new_tokens"]), str(s["target_forwards"])] + share + acc + [ident]
                                       + ([f"{s['humaneval_pass_at_1']:.2f}"] if quality else [])) + " |")
    return "\n".join(lines)


def format_breakdown(result: dict) -> str:
    """Where a cycle's time goes, per method of our loop (ms per cycle by phase), beside the
    bandwidth floor recorded with the run (`bandwidth_floor` in its config): the target's weights
    read once at the machine's measured read bandwidth, the least time any forward can take."""
    floor = result["config"]["bandwidth_floor"]
    lines = [f"bandwidth floor: {floor['weight_bytes'] / 1e6:.0f} MB of target weights at {floor['read_gb_s']:.1f} "
             f"GB/s = {floor['ms']:.1f} ms per forward",
             "| method | tau | " + " | ".join(f"{p} ms" for p in CYCLE_PHASES)
             + " | ms/cycle | ms/token | forward / floor | floor / ms per token |", "|---|" + "---|" * 10]
    for name, s in result["methods"].items():
        c = s.get("cycle_ms")
        if not c:
            continue
        cycle = sum(c[p] for p in CYCLE_PHASES)
        per_token = cycle / s["tau"]
        lines.append(f"| {name} | {s['tau']:.2f} | " + " | ".join(f"{c[p]:.2f}" for p in CYCLE_PHASES)
                     + f" | {cycle:.2f} | {per_token:.2f} | {c['forward'] / floor['ms']:.2f}x | "
                       f"{floor['ms'] / per_token:.0%} |")
    return "\n".join(lines)


def verification_line(result: dict) -> str:
    """One line on what the run checked: for each method of our loop, on how many prompts its
    tokens were AR's (greedy runs only: sampled runs are checked statistically by the tests)."""
    engine = result["config"]["engine"]
    checked, lossy = [], []
    for name, s in result["methods"].items():
        rows = [p["identical_to_ar"] for p in s["per_prompt"]]
        if name != "ar" and name not in PEERS and rows and None not in rows:
            (lossy if name in LOSSY_METHODS else checked).append(f"{name} {sum(rows)}/{len(rows)}")
    line = (f"verified: identical to ar, prompt by prompt: {', '.join(checked)}" if checked else
            "verified: nothing against AR (sampled run, or no lossless method of ours besides ar)")
    if lossy:
        line += f"; lossy by design, identical on: {', '.join(lossy)}"
    return f"{line}; target forward: {engine}"


def head_file(result: dict, method: str) -> str:
    """The head file a tree method of a bench run drafted with (its --eagle-head or --eagle3-head)."""
    kind = result["config"]["methods"][method]["head"]
    return result["config"][{"eagle1": "eagle_head", "eagle3": "eagle3_head"}[kind]]


def drafting_line(result: dict) -> str | None:
    """One line on what each EAGLE method drafted with (head file and tree: depth, top-k, tokens),
    or None when the run has none: two heads ship for the same methods, and the table alone does
    not say which one ran."""
    trees = [(name, s) for name, s in result["config"].get("methods", {}).items() if "tree" in s and "head" in s]
    if not trees:
        return None
    return "drafted with (tree: depth,top-k,tokens): " + "; ".join(
        f"{name} head {head_file(result, name)}, " + ("no tree (this machine's tuning chose AR)"
                                                       if s["total_tokens"] == 1 else
                                                       f"{s['tree'].split(' ')[0]} tree {s['depth']},"
                                                       f"{s['top_k'] or '-'},{s['total_tokens']}")
        for name, s in trees)


def format_repeats(results: list[dict], best: str = "eagle2") -> str:
    """Several runs of one bench command (the same methods and prompts, each run interleaved):
    every method's tok/s in each run and the median, and the median over runs of `best`'s ratio to
    each method (run by run, so that a machine's drift between runs cancels)."""
    methods = list(results[0]["methods"])
    lines = ["| method | " + " | ".join(f"run {i + 1} tok/s" for i in range(len(results)))
             + f" | median tok/s | median {best} / method |", "|---|" + "---|" * (len(results) + 2)]
    for m in methods:
        speeds = [r["methods"][m]["tokens_per_s"] for r in results]
        ratios = [r["methods"][best]["tokens_per_s"] / r["methods"][m]["tokens_per_s"] for r in results]
        lines.append(f"| {m} | " + " | ".join(f"{s:.1f}" for s in speeds)
                     + f" | {statistics.median(speeds):.1f} | {statistics.median(ratios):.2f}x |")
    return "\n".join(lines)


def compare_pair(results: list[dict], a: str = "eagle2", b: str = "eagle3") -> dict:
    """Interleaved runs of one greedy bench command holding methods `a` and `b`, both identical to AR
    (so the same tokens): `b`'s τ over `a`'s as a ratio of target forwards with its bootstrap interval
    over prompts (τ is the same in every run: the first run's), each run's speed-ups over ar and their
    medians, and `b`'s speed over `a`'s (a ratio of seconds) in the run with the median ratio, with
    its interval over prompts. ValueError if a run's outputs differ from AR's."""
    if not all(r["methods"][m]["identical_to_ar"] for r in results for m in (a, b)):
        raise ValueError(f"compare_pair compares {a} and {b} where both reproduce AR's tokens")

    def seconds(r: dict, m: str) -> list[float]:
        return [p["seconds"] for p in r["methods"][m]["per_prompt"]]

    def forwards(r: dict, m: str) -> list[float]:  # verification forwards: tokens / τ
        return [len(p["token_ids"]) / p["tau"] for p in r["methods"][m]["per_prompt"]]

    first = results[0]["methods"]
    speed = [ratio_bootstrap(seconds(r, a), seconds(r, b)) for r in results]
    median_run = sorted(range(len(results)), key=lambda i: speed[i][0])[len(results) // 2]
    return {"tau": {a: first[a]["tau"], b: first[b]["tau"]},
            "tau_ratio": ratio_bootstrap(forwards(results[0], a), forwards(results[0], b)),
            "speedups": {m: [r["methods"][m]["speedup"] for r in results] for m in (a, b)},
            "median_speedup": {m: statistics.median(r["methods"][m]["speedup"] for r in results) for m in (a, b)},
            "speed_ratio": speed[median_run], "prompts": len(first[a]["per_prompt"]), "runs": len(results)}
