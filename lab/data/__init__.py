"""Prompt sets (ShareGPT, MT-Bench, HumanEval, the user's JSONL) and the regenerated training set,
both read from what the wheels and data/ ship; `load_prompts` names them for the command line."""
from __future__ import annotations

from ..errors import LabError
from .prompts import (HUMANEVAL_INSTRUCTION, Prompt, chat_ids, humaneval, humaneval_problems, humaneval_split,
                      mt_bench, prompts_file, sharegpt_conversations, sharegpt_first_turns)
from .regenerated import (HELDOUT_PROMPTS, MAX_NEW_TOKENS, REGEN_DIR, RegenSet, load_regen, regen_files,
                          sharegpt_heldout, sharegpt_replies, training_items, unique_heldout)

DATASETS = ("mt_bench", "humaneval", "sharegpt", "sharegpt_heldout")

__all__ = ["DATASETS", "HELDOUT_PROMPTS", "HUMANEVAL_INSTRUCTION", "MAX_NEW_TOKENS", "REGEN_DIR", "Prompt", "RegenSet",
           "chat_ids", "humaneval", "humaneval_problems", "humaneval_split", "load_prompts", "load_regen", "mt_bench",
           "prompts_file", "regen_files", "sharegpt_conversations", "sharegpt_first_turns", "sharegpt_heldout",
           "sharegpt_replies", "training_items", "unique_heldout"]


def load_prompts(dataset: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of a named dataset (`mt_bench`, `humaneval`, `sharegpt`, `sharegpt_heldout`)."""
    if dataset == "mt_bench":
        return mt_bench(limit)
    if dataset == "humaneval":
        return humaneval(limit)
    if dataset == "sharegpt":
        return sharegpt_first_turns()[:limit] if limit else sharegpt_first_turns()
    if dataset == "sharegpt_heldout":
        return sharegpt_heldout(limit)
    raise LabError(f"unknown dataset {dataset!r}: choose one of {', '.join(DATASETS)}, or pass --prompts FILE.jsonl")
