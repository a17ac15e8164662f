"""`python -m lab bench`: every method on the same prompts, in one process, interleaved.

Methods of our own loop (`ar`, `sd`) share one target `Engine`; the `hf*` methods are what a
user would otherwise reach for (transformers' own `generate`, assisted generation with the
same draft, prompt lookup), with their settings set explicitly and recorded. Target forwards
of the `hf*` methods are counted with a forward hook.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..artifacts import command_line, git_commit, machine, write_json
from ..data import Prompt, chat_ids, humaneval_problems
from ..decode import DecodeResult
from ..errors import LabError
from ..judge.sandbox import run_python
from ..judge.tasks import humaneval_program
from ..target.load import engine_kind
from .methods import make_runner, method_settings
from .setup import LLAMACPP_METHODS, LOSSY_METHODS, PEERS, TIE_GAP, Setup

CYCLE_PHASES = ("propose", "forward", "verify", "commit", "loop")  # where a cycle's time goes, in order


def _mismatch(row: list[int], ar: DecodeResult) -> dict | None:
    """Where a greedy row first differs from ar, and ar's top-2 logit gap there."""
    m = next((i for i, (a, b) in enumerate(zip(row, ar.tokens)) if a != b), min(len(row), len(ar.tokens)))
    if m == len(row) == len(ar.tokens):
        return None
    gap = ar.top2_gaps[m] if m < len(ar.top2_gaps) else None
    return {"position": m, "ar_top2_gap": gap, "numerical_tie": gap is not None and gap < TIE_GAP}


def summarise(method: str, rows: list[tuple[Prompt, DecodeResult]], ar_rows: dict[str, DecodeResult] | None,
              greedy: bool, tokenizer, ours: bool) -> dict:
    per_prompt = []
    for prompt, r in rows:
        ar = ar_rows.get(prompt.id) if (ar_rows is not None and greedy) else None
        mismatch = _mismatch(r.tokens, ar) if ar is not None else None
        per_prompt.append({"id": prompt.id, "token_ids": r.tokens, "text": tokenizer.decode(r.tokens),
                           "tau": round(r.tau, 4), "seconds": round(r.seconds, 4),
                           "identical_to_ar": None if ar is None else mismatch is None,
                           **({"mismatch": mismatch} if mismatch else {})})
    new = sum(len(r.tokens) for _, r in rows)
    seconds = sum(r.seconds for _, r in rows)
    cycles = sum(r.cycles for _, r in rows)
    k = max((len(r.attempted_by_position) for _, r in rows), default=0)
    attempted = [sum(r.attempted_by_position[i] for _, r in rows if i < len(r.attempted_by_position)) for i in range(k)]
    accepted = [sum(r.accepted_by_position[i] for _, r in rows if i < len(r.accepted_by_position)) for i in range(k)]
    identical = [p["identical_to_ar"] for p in per_prompt]
    return {
        "tokens_per_s": new / seconds if seconds else 0.0,
        "tau": new / cycles if cycles else 0.0,
        "new_tokens": new,
        "seconds": seconds,
        # ours: verification forwards plus one prefill per prompt; hf: every forward the hook saw
        "target_forwards": cycles + (len(rows) if ours else 0),
        "accepted_per_cycle": (sum(sum(r.accepted_per_cycle) for _, r in rows) / cycles) if ours and cycles else None,
        # ours: the share of the time spent inside the drafter (proposing, and committing the scored features)
        "draft_share": sum(r.draft_seconds for _, r in rows) / seconds if ours and seconds else None,
        # ours: the share in verification cycles (the target's forward, acceptance, cache update);
        # the rest of `seconds` is the prefill and the loop's own bookkeeping
        "score_share": sum(r.score_seconds for _, r in rows) / seconds if ours and seconds else None,
        # ours: milliseconds per cycle by phase (decode's `phase_seconds`), the loop's own bookkeeping
        # (`loop`: what the phases leave of `seconds`) and the prefill per prompt
        "cycle_ms": _cycle_ms(rows, seconds, cycles) if ours and cycles else None,
        "acceptance_by_position": [a / t if t else None for a, t in zip(accepted, attempted)],
        "identical_to_ar": None if any(i is None for i in identical) else all(identical),
        "numerical_ties": sum(1 for p in per_prompt if p.get("mismatch", {}).get("numerical_tie")),
        "per_prompt": per_prompt,
    }


def _cycle_ms(rows: list[tuple[Prompt, DecodeResult]], seconds: float, cycles: int) -> dict[str, float]:
    phases = {k: sum(r.phase_seconds.get(k, 0.0) for _, r in rows) for k in ("prefill", *CYCLE_PHASES[:-1])}
    per_cycle = {k: round(1e3 * phases[k] / cycles, 3) for k in CYCLE_PHASES[:-1]}
    return {**per_cycle, "loop": round(1e3 * (seconds - sum(phases.values())) / cycles, 3),
            "prefill_per_prompt": round(1e3 * phases["prefill"] / len(rows), 3)}


def _humaneval_by_id(prompts: list[Prompt]) -> dict[str, dict]:
    """The HumanEval problems behind the prompts, if every prompt is one (else empty)."""
    if not prompts or not all(p.id.startswith("HumanEval/") for p in prompts):
        return {}
    return {p["task_id"]: p for p in humaneval_problems()}


def _pass_at_1(rows: list[tuple[Prompt, DecodeResult]], problems: dict[str, dict], tokenizer) -> float:
    passed = [run_python(humaneval_program(problems[p.id], tokenizer.decode(r.tokens, skip_special_tokens=True))).passed
              for p, r in rows]
    return sum(passed) / len(passed)


def run_bench(methods: list[str], prompts: list[Prompt], setup: Setup, config: dict,
              draft_layers: int, json_path: str | Path | None = None, progress: bool = True,
              on_prompt: Callable[[int, Prompt], None] | None = None) -> dict:
    """Every method on every prompt; `progress` prints a line per prompt, `on_prompt(i, prompt)`
    is called after each instead or as well (the end-to-end runner moves a progress bar with it)."""
    if not prompts:
        raise LabError("no prompts to benchmark: check --dataset/--limit or the --prompts file")
    runners = {m: make_runner(setup, m) for m in methods}
    encoded = [chat_ids(setup.tokenizer, p.text) for p in prompts]
    for m in methods:  # untimed warm-up on the first prompt
        runners[m](encoded[0], 0, min(16, setup.max_new_tokens))
    rows: dict[str, list] = {m: [] for m in methods}
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        for m in methods:  # interleaved: each prompt sees every method before the next prompt
            rows[m].append((prompt, runners[m](ids, i, setup.max_new_tokens)))
        if progress:
            print(f"[bench] prompt {i + 1}/{len(prompts)} ({prompt.id}) done", flush=True)
        if on_prompt:
            on_prompt(i, prompt)
    ar_rows = {p.id: r for p, r in rows["ar"]} if "ar" in rows else None
    result = {"machine": machine(), "commit": git_commit(), "command": command_line(),
              "config": {**config, "engine": engine_kind(setup.target),
                         "methods": {m: method_settings(setup, m, draft_layers) for m in methods}},
              "methods": {m: summarise(m, rows[m], ar_rows, setup.sampling.greedy, setup.tokenizer,
                                       ours=m not in PEERS) for m in methods}}
    ar_speed = result["methods"].get("ar", {}).get("tokens_per_s")
    problems = _humaneval_by_id(prompts)
    for m, summary in result["methods"].items():
        summary["lossless"] = m not in LOSSY_METHODS and m not in LLAMACPP_METHODS
        if problems:  # HumanEval: every answer run against its tests in the sandbox
            summary["humaneval_pass_at_1"] = _pass_at_1(rows[m], problems, setup.tokenizer)
        summary["speedup"] = summary["tokens_per_s"] / ar_speed if ar_speed else None
        # the tuned prediction is for greedy decoding: a sampled run gets none
        summary["predicted_speedup"] = (result["config"]["methods"][m].get("predicted_speedup")
                                        if setup.sampling.greedy else None)
    if json_path:
        write_json(Path(json_path), result)
    return result


