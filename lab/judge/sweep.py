"""Quality, measured: what lossy verification does to answers a program can check (`answer_quality`)
beside how many tokens it accepts per verification forward, and notebook 07's resumable sweep of
every drafter and rule (`quality_sweep`, `python -m lab quality`)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..artifacts import command_line, git_commit, machine, read_results, resumable_runs, write_json
from ..data import chat_ids, humaneval_split
from ..decode import decode
from ..drafters import EagleDraft, ModelDraft, NoDraft, ReferenceDraft
from ..drafters.heads import head_path, load_head
from ..errors import LabError
from ..paths import DATA_DIR, results_file
from ..sampling import Sampling
from ..target.load import TARGET_NAME, draft_path, engine_for, load_draft
from ..verify.lossy import JudgeRule, TopKRule
from .labels import Checkable, greedy_answer, judged_tokens
from .probe import judge_path, load_judge
from .tasks import Task, make_tasks, question_and_check

GREEDY = Sampling()


def expert_drafts(target, tokenizer, problems: list[dict], rule=None, draft_len: int = 25) -> dict:
    """Each problem's canonical solution fed as drafts where it belongs (`humaneval_split`), and the
    drafts accepted per cycle (standard verification if `rule` is None) until the reference runs out."""
    engine, accepted = engine_for(target), []
    for p in problems:
        prompt, solution = humaneval_split(tokenizer, p)
        reference = tokenizer.encode(solution, add_special_tokens=False)
        out = decode(engine, ReferenceDraft(len(prompt), reference), prompt, len(reference), GREEDY, draft_len, 0,
                     None, rule=rule)
        drafted = len(out.attempted_by_position) and out.attempted_by_position[0]
        accepted += out.accepted_per_cycle[:drafted]
    return {"cycles": len(accepted), "accepted_per_cycle": sum(accepted) / max(len(accepted), 1),
            "histogram": accepted}


@dataclass
class Quality:
    correct: dict[str, list[bool]]   # kind -> one verdict per question
    new_tokens: int
    forwards: int                    # target verification forwards, prefill excluded (`draft only`: the draft's)
    seconds: float

    @property
    def accuracy(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.correct.items()}

    @property
    def mean_accuracy(self) -> float:
        """The share of all questions answered right (every question weighs the same)."""
        return sum(sum(v) for v in self.correct.values()) / max(self.question_count, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forwards, 1)

    @property
    def question_count(self) -> int:
        return sum(len(v) for v in self.correct.values())

    @property
    def tokens_per_answer(self) -> float:
        return self.new_tokens / max(self.question_count, 1)

    @property
    def forwards_per_answer(self) -> float:
        """Target forwards per answer (prefill excluded), what a user waits for. Tokens per forward
        alone rewards a rule that makes answers longer: its extra tokens come cheap."""
        return self.forwards / max(self.question_count, 1)


def answer_quality(target, tokenizer, items: list[Task] | list[dict], make_drafter=NoDraft, rule=None,
                   draft_len: int = 8, max_new_tokens: int = 24) -> Quality:
    """Decode every item greedily with a fresh `make_drafter()` and `rule`, and check the answer."""
    engine = engine_for(target)
    quality = Quality({}, 0, 0, 0.0)
    for item in items:
        kind, question, check = question_and_check(item)
        out = decode(engine, make_drafter(), chat_ids(tokenizer, question), max_new_tokens, GREEDY, draft_len, 0,
                     tokenizer.eos_token_id, rule=rule)
        ok = check(tokenizer.decode(out.tokens, skip_special_tokens=True))
        quality.correct.setdefault(kind, []).append(ok)
        quality.new_tokens += len(out.tokens)
        quality.forwards += out.cycles
        quality.seconds += out.seconds
    return quality


# ---- notebook 07's sweep, resumable ----------------------------------------------------------

QUALITY_FILE = DATA_DIR / "results" / "judge_quality.json"
QUALITY_HOW = "`python -m lab quality` (about an hour on 2 cores; rerun it to resume)"
EVALUATION_SEED = 1   # which evaluation-half questions the sweep asks (lab.judge.tasks.make_tasks)
SWEEP_DRAFT_LEN, SWEEP_MAX_NEW_TOKENS, EAGLE_CHAIN_DEPTH = 8, 24, 8
DEFAULT_JUDGE = "judge"  # data/judge/judge.json, the shipped judge head


def lost_questions(runs: dict[str, Quality], name: str, tasks: list[Task]) -> list[Task]:
    """The questions the target alone gets right and run `name` gets wrong (in `tasks` order)."""
    by_kind: dict[str, list[Task]] = {}
    for t in tasks:
        by_kind.setdefault(t.kind, []).append(t)
    target = runs["target only"].correct
    return [by_kind[k][i] for k, verdicts in runs[name].correct.items()
            for i, ok in enumerate(verdicts) if target[k][i] and not ok]


def judge_only_tokens(target, tokenizer, task: Task, draft, rule, draft_len: int = SWEEP_DRAFT_LEN,
                      max_new_tokens: int = SWEEP_MAX_NEW_TOKENS) -> dict:
    """One question decoded as the sweep does: the target's own answer, the answer with `rule`, and
    every token in it that only the rule accepted, as (the draft's token, the target's choice) text."""
    item = Checkable(task.id, "", chat_ids(tokenizer, task.question), task.check, max_new_tokens)
    engine, eos = engine_for(target), tokenizer.eos_token_id
    answer, found = judged_tokens(engine, ModelDraft(draft), rule, item, draft_len, eos)
    own = greedy_answer(engine, item.prompt, max_new_tokens, eos)
    return {"question": task.question, "target": tokenizer.decode(own, skip_special_tokens=True),
            "judged": tokenizer.decode(answer, skip_special_tokens=True),
            "judge_only": [(tokenizer.decode([d]), tokenizer.decode([t])) for _, d, t in found]}


def sweep_runs(delta: float, fast: bool = False, judge: str = DEFAULT_JUDGE) -> dict[str, dict]:
    """Name -> spec: which model answers (`target`, or the 2-layer `draft` alone), which drafter
    proposes (`none`, `draft`, the EAGLE-1 `eagle1` chain) and which rule accepts (`standard`, `topk:K`,
    `judge:delta` up to 0.99; fast: one of each). Another head's judge runs end in `(NAME)`."""
    ks = [3] if fast else [2, 3, 5]
    deltas = [round(delta, 3)] if fast else sorted({0.5, 0.6, 0.7, round(delta, 3), 0.9, 0.95, 0.99})
    suffix, which = ("", {}) if judge == DEFAULT_JUDGE else (f" ({judge})", {"judge": judge})
    runs = {"target only": {"model": "target", "drafter": "none", "rule": "standard"},
            "draft only": {"model": "draft", "drafter": "none", "rule": "standard"},
            "standard SD": {"model": "target", "drafter": "draft", "rule": "standard"}}
    runs |= {f"top-{k}": {"model": "target", "drafter": "draft", "rule": f"topk:{k}"} for k in ks}
    runs["eagle SD"] = {"model": "target", "drafter": "eagle1", "rule": "standard"}
    runs |= {f"judge {d:g}{suffix}": {"model": "target", "drafter": "draft", "rule": f"judge:{d}", **which}
             for d in deltas}
    runs[f"eagle judge {delta:.3g}{suffix}"] = {"model": "target", "drafter": "eagle1", "rule": f"judge:{delta}",
                                                **which}
    return runs


def _judge_of(spec: dict) -> str | None:
    """The judge head a run's rule reads (None for the other rules)."""
    return spec.get("judge", DEFAULT_JUDGE) if spec.get("rule", "").startswith("judge") else None


def file_sha(path: Path) -> str:
    if not path.exists():
        raise LabError(f"{path} is missing: the quality sweep needs the shipped draft, EAGLE-1 head and judge head")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def judge_sha(path: Path) -> str:
    """The hash of what a judge head decides with (its layer, threshold and weights), not of its whole
    file: a manifest field added later does not make the runs that used it stale."""
    head = json.loads(path.read_text()) if path.exists() else file_sha(path)  # file_sha says what is missing
    fields = {k: head.get(k) for k in ("layer", "reads_logits", "delta", "bias", "weight", "mean", "std")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def run_inputs(spec: dict, tasks: list[Task]) -> dict:
    """What one run's numbers depend on besides the code: the questions, the decoding sizes and the
    hashes of the files it reads; a run recorded with other inputs is decoded again."""
    questions = hashlib.sha256("\n".join(t.question for t in tasks).encode()).hexdigest()[:16]
    inputs = {"target": TARGET_NAME, "questions": questions, "draft_len": SWEEP_DRAFT_LEN,
              "max_new_tokens": SWEEP_MAX_NEW_TOKENS}
    if "draft" in (spec["model"], spec["drafter"]):
        inputs["draft"] = file_sha(draft_path(2))
    if spec["drafter"] == "eagle1":
        inputs |= {"eagle1": file_sha(head_path("eagle1")), "eagle_chain_depth": EAGLE_CHAIN_DEPTH}
    if _judge_of(spec):
        inputs["judge"] = judge_sha(judge_path(_judge_of(spec)))
    return inputs


def _current(record: dict, tasks: list[Task]) -> bool:
    """Whether a recorded run's inputs are still those of its spec (its files unchanged, present)."""
    try:
        return record.get("inputs") == run_inputs(record["spec"], tasks)
    except LabError:
        return False


def load_sweep(path: Path) -> dict:
    """The sweep recorded at `path` ({"runs": {}} if there is none)."""
    return read_results(path) or {"runs": {}}


def sweep_path(fast: bool) -> Path:
    """data/results/judge_quality.json at full size, a gitignored file in fast mode."""
    return results_file(QUALITY_FILE.name, fast)


def quality_sweep(target, tokenizer, per_kind: int = 20, fast: bool = False, path: Path | None = None,
                  judge: str = DEFAULT_JUDGE, progress: bool = True) -> tuple[list[Task], dict[str, Quality]]:
    """Notebook 07's runs (`sweep_runs`) on `per_kind` evaluation questions of each kind with the judge
    head data/judge/`judge`.json, resumable: runs `path` holds with current inputs are read back, the
    rest decoded, the file rewritten atomically after each. Returns (questions, name -> `Quality`)."""
    path = Path(path or sweep_path(fast))
    tasks = make_tasks(per_kind=per_kind, seed=EVALUATION_SEED, split="evaluation")
    probe, delta = load_judge(target, judge_path(judge))
    runs = sweep_runs(delta, fast, judge)
    inputs = {n: run_inputs(spec, tasks) for n, spec in runs.items()}
    recorded = load_sweep(path)
    kept, todo, stale = resumable_runs(
        recorded["runs"], {n: (runs[n], inputs[n]) for n in runs}, lambda r: (r.get("spec"), r.get("inputs")),
        lambda n, r: _judge_of(r.get("spec", {})) not in (None, judge) and _current(r, tasks))
    if progress and stale:
        print(f"[quality] {path}: rerunning {', '.join(stale)}: recorded with other questions, sizes or files",
              flush=True)
    if progress:
        print(f"[quality] {path}: {len(runs) - len(todo)} of {len(runs)} runs recorded"
              + (f", {len(todo)} to decode ({len(tasks)} questions each)" if todo else ""), flush=True)
    models: dict = {}

    def model(name: str):  # loaded once, and only if a run needs it
        if name not in models:
            models[name] = load_draft(target, 2) if name == "draft" else load_head(target, "eagle1")
        return models[name]

    def rule(text: str):
        kind, _, value = text.partition(":")
        if kind == "standard":
            return None
        return TopKRule(int(value)) if kind == "topk" else JudgeRule(probe, float(value))

    def make_drafter(kind: str) -> Callable:  # a fresh drafter per question
        if kind == "none":
            return NoDraft
        if kind == "draft":
            return lambda: ModelDraft(model("draft"))
        return lambda: EagleDraft(model("eagle1"), "chain", depth=EAGLE_CHAIN_DEPTH)
    commit = git_commit()  # the code this process loaded: read once, not at each write
    result = {"kind": "judge_quality", "command": command_line(), "questions": len(tasks),
              "per_kind": per_kind, "seed": EVALUATION_SEED, "split": "evaluation", "draft_len": SWEEP_DRAFT_LEN,
              "max_new_tokens": SWEEP_MAX_NEW_TOKENS, "runs": _in_order(kept, list(runs))}
    for name in todo:
        spec = runs[name]
        answering = target if spec["model"] == "target" else model("draft")
        q = answer_quality(answering, tokenizer, tasks, make_drafter(spec["drafter"]), rule(spec["rule"]),
                           SWEEP_DRAFT_LEN, SWEEP_MAX_NEW_TOKENS)
        result["runs"][name] = {"spec": spec, "inputs": inputs[name], **asdict(q), "commit": commit}
        result["runs"] = _in_order(result["runs"], list(runs))
        result.update(commit=commit, machine=machine())
        write_json(path, result)
        if progress:
            print(f"[quality] {name}: {q.tokens_per_forward:.2f} tokens per forward, accuracy {q.mean_accuracy:.3f} "
                  f"({q.seconds / 60:.1f} min)", flush=True)
    if not todo and set(result["runs"]) != set(recorded["runs"]):  # nothing decoded, but stale runs to drop
        write_json(path, {**result, **{k: recorded[k] for k in ("command", "commit", "machine")}})
    return tasks, {n: q for n, q in recorded_qualities(result).items() if n in runs}


def _in_order(records: dict, names: tuple[str, ...] | list[str] = ()) -> dict:
    """The runs without a judge, then each judge head's (the shipped one first), each group in the
    order of `names` and then as recorded, so a file holding several judges reads as one table."""
    def key(item):
        name, r = item
        judge = _judge_of(r["spec"])
        return (judge is not None, judge != DEFAULT_JUDGE, judge or "",
                names.index(name) if name in names else len(names))
    return dict(sorted(records.items(), key=key))


def recorded_qualities(result: dict) -> dict[str, Quality]:
    """A sweep file's runs as `Quality`: those without a judge first, then each judge head's."""
    return {n: Quality(**{k: r[k] for k in ("correct", "new_tokens", "forwards", "seconds")})
            for n, r in _in_order(result["runs"]).items()}


def same_draft_sd(name: str, runs: dict[str, Quality]) -> Quality | None:
    """The standard-SD run with `name`'s draft: `eagle SD` for `eagle ...` runs, else `standard SD`."""
    return runs.get("eagle SD" if name.startswith("eagle ") else "standard SD")


def format_quality(runs: dict[str, Quality]) -> str:
    """A markdown table: tokens per target forward, tokens and forwards per answer (speeds also as
    multiples of same-draft standard SD's), accuracy (also against the target's, in points), by kind."""
    kinds = sorted(next(iter(runs.values())).correct)
    target = runs.get("target only")
    lines = ["| run | tok/fwd | x SD | tok/answer | fwd/answer | x SD | accuracy | vs target (points) | "
             + " | ".join(kinds) + " |", "|---|---|---|---|---|---|---|---|" + "---|" * len(kinds)]
    for name, q in runs.items():
        sd = same_draft_sd(name, runs)
        ratio = f"{q.tokens_per_forward / sd.tokens_per_forward:.2f}x" if sd else "-"
        per_answer, answer_ratio = ("-", "-") if name == "draft only" else (
            f"{q.forwards_per_answer:.1f}", f"{q.forwards_per_answer / sd.forwards_per_answer:.2f}x" if sd else "-")
        points = f"{100 * (q.mean_accuracy - target.mean_accuracy):+.1f}" if target else "-"
        lines.append(f"| {name} | {q.tokens_per_forward:.2f} | {ratio} | {q.tokens_per_answer:.1f} | {per_answer} | "
                     f"{answer_ratio} | {q.mean_accuracy:.3f} | {points} | "
                     + " | ".join(f"{q.accuracy[k]:.2f}" for k in kinds) + " |")
    return "\n".join(lines)


def judge_heads(result: dict) -> list[str]:
    """The judge heads a sweep file holds runs for, the shipped one first."""
    heads = {_judge_of(r["spec"]) for r in result["runs"].values()} - {None}
    return sorted(heads, key=lambda j: (j != DEFAULT_JUDGE, j))


def judge_runs(runs: dict[str, Quality], judge: str = DEFAULT_JUDGE) -> list[str]:
    """The names of one judge head's runs with the 2-layer draft (its threshold sweep)."""
    suffix = "" if judge == DEFAULT_JUDGE else f" ({judge})"
    return [n for n in runs if n.startswith("judge ") and n.endswith(suffix) and (suffix or "(" not in n)]


def judge_bar(runs: dict[str, Quality], judge: str = DEFAULT_JUDGE, points: float = 5.0) -> str:
    """Judge Decoding's bar in one sentence, led by the honest measure: the judge run with the most tokens
    per forward within `points` of the target's accuracy, its accuracy and target forwards per answer
    beside the lossless runs' (standard SD, and the EAGLE chain where it ran), then what its tokens per
    forward would suggest and the nearest Top-K."""
    if "target only" not in runs or "standard SD" not in runs:
        return "the sweep has not yet run the target alone and standard SD, which the bar is measured against"
    target, sd = runs["target only"].mean_accuracy, runs["standard SD"]
    within = [n for n in judge_runs(runs, judge) if runs[n].mean_accuracy >= target - points / 100]
    if not within:
        return f"no threshold of the judge head `{judge}` keeps the accuracy within {points:g} points of the target's"
    best = max(within, key=lambda n: runs[n].tokens_per_forward)
    tpf = runs[best].tokens_per_forward
    nearest = min((n for n in runs if n.startswith("top-")), key=lambda n: abs(runs[n].tokens_per_forward - tpf))
    lossless = f"standard SD's {100 * sd.mean_accuracy:.1f}% (lossless) at {sd.forwards_per_answer:.1f}"
    if "eagle SD" in runs:
        lossless += f" and the EAGLE chain's at {runs['eagle SD'].forwards_per_answer:.1f}"
    return (f"{best}, the most tokens per forward within {points:g} points of the target, answers "
            f"{100 * runs[best].mean_accuracy:.1f}% right ({100 * (runs[best].mean_accuracy - target):+.1f} points) "
            f"at {runs[best].forwards_per_answer:.1f} target forwards per answer, against {lossless}; its answers "
            f"run longer ({runs[best].tokens_per_answer:.1f} tokens against {sd.tokens_per_answer:.1f}), so its "
            f"{tpf / sd.tokens_per_forward:.2f}x standard SD's tokens per forward flatters it; the nearest Top-K "
            f"in tokens per forward, {nearest}, is {100 * (runs[nearest].mean_accuracy - target):+.1f} points")
