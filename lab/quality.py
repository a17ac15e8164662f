"""Quality, measured: what lossy verification does to answers a program can check, and how many
tokens it accepts per verification forward.

`expert_drafts`: a known-good text (HumanEval's canonical solutions) as drafts; how many tokens
standard verification and a lossy rule accept per cycle. `answer_quality`: decode checkable
questions (lab/tasks.py) or HumanEval problems with a drafter and an acceptance rule, check every
answer (HumanEval's in the sandbox), and report accuracy beside tokens per forward.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .data import HUMANEVAL_INSTRUCTION, chat_ids, humaneval_split
from .decode import decode
from .drafters import NoDraft, ReferenceDraft
from .engine import engine_for
from .sampling import Sampling
from .sandbox import run_python
from .tasks import Task

GREEDY = Sampling()


def expert_drafts(target, tokenizer, problems: list[dict], rule=None, draft_len: int = 25) -> dict:
    """Each problem's canonical solution fed as drafts where it belongs (`humaneval_split`: the
    prompt, then a code block opening with the signature); per cycle, the drafts accepted
    (standard verification when `rule` is None). Cycles after the reference ran out (nothing
    drafted) are not counted."""
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


def humaneval_program(problem: dict, answer: str) -> str:
    """A runnable program from a generated answer: its first code block (or the whole answer),
    as a whole function if it defines the entry point, else as the body after the prompt."""
    block = re.search(r"```(?:python)?\n(.*?)(?:```|$)", answer, re.S)
    code = block.group(1) if block else answer
    head = code if f"def {problem['entry_point']}" in code else problem["prompt"] + code
    return f"{head}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


@dataclass
class Quality:
    correct: dict[str, list[bool]]   # kind -> one verdict per question
    new_tokens: int
    forwards: int                    # verification forwards of the target (prefill excluded)
    seconds: float

    @property
    def accuracy(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.correct.items()}

    @property
    def mean_accuracy(self) -> float:
        """The share of all questions answered right (every question weighs the same)."""
        return sum(sum(v) for v in self.correct.values()) / max(sum(len(v) for v in self.correct.values()), 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forwards, 1)


def question_and_check(item: Task | dict) -> tuple[str, str, Callable[[str], bool]]:
    """A checkable item's kind, the question the target is asked, and the check of an answer's
    text: a `Task`'s own check, or a HumanEval problem's tests run on the answer in the sandbox.
    Shared by `answer_quality` and the mined judge labels (lab/mining.py), so that both call the
    same answer correct."""
    if isinstance(item, dict):
        return "humaneval", HUMANEVAL_INSTRUCTION + item["prompt"], \
            lambda text: run_python(humaneval_program(item, text)).passed
    return item.kind, item.question, item.check


def answer_quality(target, tokenizer, items: list[Task] | list[dict], make_drafter=NoDraft, rule=None,
                   draft_len: int = 8, max_new_tokens: int = 24) -> Quality:
    """Decode every item (a `Task`, or a HumanEval problem dict) greedily with a fresh drafter
    from `make_drafter()` and the acceptance `rule`, and check the answer."""
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
