"""Judge labels: errors planted in correct answers (`code_mutations`, `number_mutations`,
`label_tokens`), and labels mined from a draft's own, more fluent mistakes, in the spirit of
AutoJudge (arXiv 2504.20039): on an item the target answers correctly, the draft's token goes in at
a mismatch, the target finishes greedily, and the token is harmless (1) if the answer still passes,
harmful (0) if not. Records are cached atomically under `.cache/judge-mined/`; a rerun resumes."""
from __future__ import annotations

import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..artifacts import write_json
from ..data import chat_ids, humaneval_problems
from ..decode import decode
from ..drafters import NoDraft
from ..drafters.eagle1 import EagleHead
from ..paths import CACHE_DIR
from ..sampling import Sampling
from ..target.engine import Engine
from ..target.load import engine_for
from .tasks import JUDGE_TASKS_PER_KIND, make_tasks, question_and_check

MINED_DIR = CACHE_DIR / "judge-mined"
# ---- planted errors ------------------------------------------------------------------------

FLIPS = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
SWAPS = {"+": "-", "-": "+", "*": "+", "//": "%", "%": "//", "and": "or", "or": "and"}
KEYWORDS = {"True", "False", "None", "return", "for", "in", "if", "else", "elif", "while", "def", "not", "and",
            "or", "is", "lambda", "import", "from", "break", "continue", "pass", "with", "as", "yield", "try",
            "except", "raise", "class", "global", "nonlocal", "assert", "del", "finally"}


@dataclass
class Mutation:
    text: str      # the answer with one error planted
    site: int      # character offset of the change in `text`
    kind: str      # flipped comparison | off-by-one | wrong operator | wrong variable | wrong number


def code_mutations(code: str) -> list[Mutation]:
    """Every single-token error planted in Python code: a flipped comparison, an integer off by
    one, a swapped operator, or a name replaced by another the code uses; [] if it does not tokenise."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    lines = code.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    names = sorted({t.string for t in tokens if t.type == tokenize.NAME and t.string not in KEYWORDS
                    and not t.string.startswith("__")})
    out = []
    for t in tokens:
        begin, end = starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]
        if t.type == tokenize.OP and t.string in FLIPS:
            options = [(FLIPS[t.string], "flipped comparison")]
        elif (t.type == tokenize.OP or t.string in ("and", "or")) and t.string in SWAPS:
            options = [(SWAPS[t.string], "wrong operator")]
        elif t.type == tokenize.NUMBER and t.string.isdigit():
            options = [(str(int(t.string) + 1), "off-by-one")]
        elif t.type == tokenize.NAME and t.string in names:
            others = [n for n in names if n != t.string]
            options = [(others[begin % len(others)], "wrong variable")] if others else []
        else:
            options = []
        out += [Mutation(code[:begin] + new + code[end:], begin, kind) for new, kind in options]
    return out


def number_mutations(text: str) -> list[Mutation]:
    """A number in prose (a math answer, an intermediate result) changed by one."""
    return [Mutation(text[: m.start()] + str(int(m.group()) + 1) + text[m.end():], m.start(), "wrong number")
            for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", text)]


# ---- token labels ----------------------------------------------------------------------------

@dataclass
class Labelled:
    """One labelled answer tokenised after its prompt: a planted error, or a mined draft token."""
    problem: str            # split key: every answer of a problem goes to the same split, whatever its source
    ids: list[int]          # prompt + answer (mutated, or up to the mined draft token)
    answer_start: int       # index in ids of the answer's first token
    labels: list[int]       # per answer token: 1 correct, 0 wrong, -1 ignored
    kind: str = ""
    site_token: int = field(default=-1)  # index (in ids) of the planted error or the mined draft token
    source: str = ""        # where the label came from, for the manifest's per-source counts and AUCs


def label_tokens(tokenizer, prompt_ids: list[int], original: str, mutation: Mutation, problem: str,
                 source: str = "") -> Labelled | None:
    """The mutated answer labelled 1 before its first token that differs from the original's, 0
    there, -1 after. None if no token differs within the shorter of the two tokenisations."""
    a = tokenizer.encode(original, add_special_tokens=False)
    b = tokenizer.encode(mutation.text, add_special_tokens=False)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        return None
    labels = [1] * first + [0] + [-1] * (len(b) - first - 1)
    start = len(prompt_ids)
    return Labelled(problem, prompt_ids + b, start, labels, mutation.kind, start + first, source)


# ---- mined labels ----------------------------------------------------------------------------

GREEDY = Sampling()
# answer lengths as the quality checks use them: notebook 07's questions, `make run E=bench-judge`'s HumanEval
MAX_NEW_TOKENS = {"tasks": 24, "humaneval": 192}


@dataclass
class Checkable:
    """One item whose answer a program checks."""
    problem: str                        # split key, the same as the planted labels' for the same item
    source: str                         # mined_tasks | mined_humaneval
    prompt: list[int]                   # chat-template ids the target answers after
    check: Callable[[list[int]], bool]  # answer token ids -> is the answer correct?
    max_new_tokens: int


def checkable_items(tokenizer, limit: int, tasks_per_kind: int = JUDGE_TASKS_PER_KIND, seed: int = 0
                    ) -> list[Checkable]:
    """The first `limit` items: the templated tasks (the planted labels' own, so an item's planted
    and mined labels share one problem key and split side), then HumanEval."""
    items: list[Checkable] = []
    for item in [*make_tasks(per_kind=tasks_per_kind, seed=seed), *humaneval_problems()][:limit]:
        kind, question, check_text = question_and_check(item)
        source = "humaneval" if kind == "humaneval" else "tasks"
        problem = f"humaneval:{item['task_id']}" if source == "humaneval" else f"tasks:{item.id}"

        def check(ids: list[int], check_text=check_text) -> bool:
            return check_text(tokenizer.decode(ids, skip_special_tokens=True))
        items.append(Checkable(problem, f"mined_{source}", chat_ids(tokenizer, question), check,
                               MAX_NEW_TOKENS[source]))
    return items


def greedy_answer(engine: Engine, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    """The target's greedy answer after `prompt`, decoded as `answer_quality` decodes it."""
    return decode(engine, NoDraft(), prompt, max_new_tokens, GREEDY, 0, 0, eos_id).tokens


@torch.inference_mode()
def draft_proposals(target, draft, prompt: list[int], answer: list[int]) -> list[int]:
    """The draft's greedy proposal at each answer position j given prompt + answer[:j], in one pass;
    an EAGLE-1 head proposes from the target's features, as its first draft in decoding does."""
    if isinstance(draft, EagleHead):
        ids = prompt + answer
        layer = draft.feature_layers[0]
        features = Engine(target).forward(ids[:-1], hidden_layers=(layer,), logits=False).hidden[layer]
        predicted = draft(features[None], torch.tensor(ids[1:], device=features.device)[None])[0]
        return draft.logits(predicted[len(prompt) - 2: len(ids) - 2]).argmax(-1).tolist()
    n = draft.config.num_hidden_layers
    top = Engine(draft).forward(prompt + answer[:-1], hidden_layers=(n,), logits=False).hidden[n]
    return draft.lm_head(top[len(prompt) - 1:]).argmax(-1).tolist()


def draft_mismatches(target, draft, prompt: list[int], answer: list[int]) -> list[tuple[int, int]]:
    """(j, token) for every answer position j where the draft greedily proposes `token` != answer[j]."""
    if not answer:
        return []
    return [(j, d) for j, (d, a) in enumerate(zip(draft_proposals(target, draft, prompt, answer), answer)) if d != a]


def spread(values: list, cap: int) -> list:
    """At most `cap` of `values`, evenly spread: a long answer's late mismatches get their share."""
    if len(values) <= cap:
        return list(values)
    return [values[i * len(values) // cap] for i in range(cap)]


def mine_item(engine: Engine, draft, item: Checkable, cap: int, eos_id: int | None) -> dict:
    """One item's JSON-able record: the target's greedy answer, whether it passes, and only if it does,
    up to `cap` draft mismatches, each with its finished answer and whether that passes (`harmless`)."""
    answer = greedy_answer(engine, item.prompt, item.max_new_tokens, eos_id)
    record = {"problem": item.problem, "source": item.source, "prompt": item.prompt, "answer": answer,
              "target_correct": bool(item.check(answer)), "mismatches_found": 0, "mismatches": []}
    if not record["target_correct"]:
        return record  # a wrong answer cannot tell harmless tokens from harmful ones
    found = draft_mismatches(engine.model, draft, item.prompt, answer)
    record["mismatches_found"] = len(found)
    for j, token in spread(found, cap):
        finished = finish(engine, item, answer[:j] + [token], eos_id)
        record["mismatches"].append({"position": j, "draft": token, "target": answer[j], "answer": finished,
                                     "harmless": bool(item.check(finished))})
    return record


def judged_tokens(engine: Engine, drafter, rule, item: Checkable, draft_len: int, eos_id: int | None
                  ) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Judge decoding's answer to `item` and (j, draft token, target's token) for every answer position
    j whose token only the judge `rule` accepted."""
    found: list[tuple[int, int, int]] = []

    def on_cycle(context, proposal, cycle, emitted, origins) -> None:
        start = len(context) - len(item.prompt)
        argmax = cycle.logits[: len(emitted)].argmax(-1).tolist()
        found.extend((start + i, t, a) for i, (t, a, o) in enumerate(zip(emitted, argmax, origins))
                     if o == "draft" and t != a)
    answer = decode(engine, drafter, item.prompt, item.max_new_tokens, GREEDY, draft_len, 0, eos_id, rule=rule,
                    on_cycle=on_cycle).tokens
    return answer, found


def finish(engine: Engine, item: Checkable, prefix: list[int], eos_id: int | None) -> list[int]:
    """`prefix` finished by the target's greedy answer (nothing more after an EOS)."""
    rest = 0 if prefix[-1] == eos_id else item.max_new_tokens - len(prefix)
    return prefix + greedy_answer(engine, item.prompt + prefix, rest, eos_id)


def labelled(record: dict) -> list[Labelled]:
    """One `Labelled` per mined mismatch: the prompt, the target's answer up to the mismatch and the
    draft's token, labelled there only (1 harmless, 0 harmful)."""
    start = len(record["prompt"])
    return [Labelled(record["problem"], record["prompt"] + record["answer"][: m["position"]] + [m["draft"]], start,
                     [-1] * m["position"] + [int(m["harmless"])], "mined", start + m["position"], record["source"])
            for m in record["mismatches"]]


def cache_path(cache_dir: Path, problem: str) -> Path:
    return cache_dir / (re.sub(r"[^\w.-]", "_", problem) + ".json")


def mine(target, draft, items: list[Checkable], cap: int = 8, eos_id: int | None = None,
         cache_dir: Path = MINED_DIR, progress: bool = True) -> list[dict]:
    """`mine_item` for every item, each record cached in `cache_dir` once done and reused on a rerun
    mined with the same prompt, answer length, cap and draft (layer count, or EAGLE head variant)."""
    settings = ({"cap": cap, "draft": draft.variant} if isinstance(draft, EagleHead)
                else {"cap": cap, "draft_layers": draft.config.num_hidden_layers})
    engine, records = engine_for(target), []
    bar = tqdm(items, desc="mining judge labels (items)", unit="item", disable=not progress)
    for item in bar:
        path = cache_path(cache_dir, item.problem)
        wanted = {**settings, "max_new_tokens": item.max_new_tokens}
        record = json.loads(path.read_text()) if path.exists() else None
        if record is None or record.get("settings") != wanted or record["prompt"] != item.prompt:
            record = mine_item(engine, draft, item, cap, eos_id)
            record["settings"] = wanted
            write_json(path, record)
        records.append(record)
        labels = [m["harmless"] for r in records for m in r["mismatches"]]
        bar.set_postfix(harmless=sum(labels), harmful=len(labels) - sum(labels))
    return records
