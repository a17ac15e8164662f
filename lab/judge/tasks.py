"""Checkable tasks: questions generated from a seed whose answers a program can check, to measure
what a lossy rule costs in quality; the kinds are ones the 135M target often gets right (at zero a
comparison shows nothing). Each kind's questions are cut once into two halves: `judge` gives the
judge head its labels, `evaluation` is what notebook 07 measures, so no question is in both."""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from ..data import HUMANEVAL_INSTRUCTION
from ..errors import LabError
from .sandbox import run_python

CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "England": "London", "Greece": "Athens",
            "Canada": "Ottawa", "Ireland": "Dublin", "Portugal": "Lisbon", "Austria": "Vienna", "Poland": "Warsaw",
            "Norway": "Oslo", "Sweden": "Stockholm", "Kenya": "Nairobi", "Peru": "Lima", "Cuba": "Havana",
            "Finland": "Helsinki", "Denmark": "Copenhagen", "the Netherlands": "Amsterdam", "Belgium": "Brussels",
            "Hungary": "Budapest", "Thailand": "Bangkok", "South Korea": "Seoul", "India": "New Delhi",
            "Argentina": "Buenos Aires", "Chile": "Santiago", "Iran": "Tehran", "Iraq": "Baghdad",
            "Turkey": "Ankara", "the Philippines": "Manila", "Indonesia": "Jakarta", "Vietnam": "Hanoi",
            "Saudi Arabia": "Riyadh", "Syria": "Damascus", "Lebanon": "Beirut", "Scotland": "Edinburgh",
            "Romania": "Bucharest", "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb",
            "Morocco": "Rabat", "Venezuela": "Caracas", "Afghanistan": "Kabul", "Nepal": "Kathmandu",
            "Australia": "Canberra", "New Zealand": "Wellington"}
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark", "open": "closed",
             "early": "late", "high": "low", "full": "empty", "hard": "soft", "long": "short", "wet": "dry",
             "rich": "poor", "strong": "weak", "thick": "thin", "loud": "quiet", "clean": "dirty", "up": "down",
             "left": "right", "win": "lose", "true": "false", "good": "bad", "push": "pull", "day": "night",
             "black": "white", "love": "hate", "buy": "sell", "first": "last", "inside": "outside",
             "begin": "end", "heavy": "light", "near": "far", "top": "bottom", "front": "back", "alive": "dead",
             "always": "never", "above": "below", "north": "south", "east": "west", "accept": "reject"}
PLURALS = {"child": "children", "mouse": "mice", "foot": "feet", "tooth": "teeth", "man": "men", "woman": "women",
           "person": "people", "goose": "geese", "box": "boxes", "city": "cities", "leaf": "leaves", "knife": "knives",
           "ox": "oxen", "wolf": "wolves", "wife": "wives", "half": "halves", "baby": "babies", "party": "parties",
           "bus": "buses", "church": "churches", "dish": "dishes", "fox": "foxes", "potato": "potatoes",
           "tomato": "tomatoes", "hero": "heroes", "life": "lives", "shelf": "shelves", "story": "stories",
           "glass": "glasses", "thief": "thieves"}
SPLITS = ("judge", "evaluation")
# questions per kind the judge's labels come from: every kind's whole judge half (the largest holds 40)
JUDGE_TASKS_PER_KIND = 40


@dataclass
class Task:
    id: str
    kind: str
    question: str
    answer: str                       # the exact answer, as a reference text
    check: Callable[[str], bool]      # does a generated answer contain the right result?


def last_int(text: str) -> int | None:
    """The last integer in the text (thousands separators allowed: 1,200): a small model often
    restates the question ("11 meters is 11 * 100 = 1100 centimeters") before the result."""
    found = re.findall(r"-?\d+", re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))
    return int(found[-1]) if found else None


def _number(kind: str, i: int, question: str, value: int) -> Task:
    return Task(f"{kind}-{i}", kind, question, str(value), lambda text: last_int(text) == value)


def _word(kind: str, i: int, question: str, word: str) -> Task:
    pattern = re.compile(rf"\b{re.escape(word)}\b", re.I)
    return Task(f"{kind}-{i}", kind, question, word, lambda text: bool(pattern.search(text)))


def _questions(kind: str) -> list[tuple[str, int | str]]:
    """Every distinct (question, answer) of a kind, in a fixed order."""
    if kind == "addition":
        return [(f"What is {a} + {b}? Reply with the number only.", a + b) for a in range(1, 10) for b in range(1, 10)]
    if kind == "conversion":
        return [(f"How many centimeters are in {n} meters? Reply with the number only.", 100 * n) for n in range(2, 51)]
    if kind == "weekday":
        return [(f"What day comes {way} {day}? Reply with the day only.", WEEKDAYS[(d + step) % 7])
                for way, step in (("after", 1), ("before", -1)) for d, day in enumerate(WEEKDAYS)]
    if kind == "opposite":
        return [(f"What is the opposite of \"{w}\"? Reply with one word.", o) for w, o in OPPOSITES.items()]
    if kind == "plural":
        return [(f"What is the plural of \"{w}\"? Reply with one word.", p) for w, p in PLURALS.items()]
    return [(f"What is the capital of {c}? Reply with the city name only.", city) for c, city in CAPITALS.items()]


KINDS = ("addition", "conversion", "weekday", "opposite", "plural", "capital")


def question_space(kind: str, split: str) -> list[Task]:
    """One half of a kind's questions, cut the same way for every seed: the halves share no question."""
    questions = _questions(kind)
    order = list(range(len(questions)))
    random.Random(f"split:{kind}").shuffle(order)
    half = order[: len(order) // 2] if split == "judge" else order[len(order) // 2:]
    make = {int: _number, str: _word}
    return [make[type(questions[i][1])](kind, i, *questions[i]) for i in sorted(half)]


def make_tasks(kinds: list[str] | None = None, per_kind: int = 20, seed: int = 0, split: str = "judge") -> list[Task]:
    """Up to `per_kind` distinct questions of each kind from one half (`judge` or `evaluation`), the
    same for the same seed; LabError for an unknown kind or split."""
    kinds = kinds or list(KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise LabError(f"unknown task {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    if split not in SPLITS:
        raise LabError(f"unknown task split {split!r}: choose from {', '.join(SPLITS)}")
    tasks = []
    for kind in kinds:
        space = question_space(kind, split)
        tasks += random.Random(f"{seed}:{kind}").sample(space, min(per_kind, len(space)))
    return tasks


# ---- checking an answer: a task's own check, or a HumanEval problem's tests ------------------

def humaneval_program(problem: dict, answer: str) -> str:
    """A runnable program from a generated answer: its first code block (or the whole answer),
    as a whole function if it defines the entry point, else as the body after the prompt."""
    block = re.search(r"```(?:python)?\n(.*?)(?:```|$)", answer, re.S)
    code = block.group(1) if block else answer
    head = code if f"def {problem['entry_point']}" in code else problem["prompt"] + code
    return f"{head}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def question_and_check(item: Task | dict) -> tuple[str, str, Callable[[str], bool]]:
    """A checkable item's kind, question and answer check: a `Task`'s own, or a HumanEval problem's
    tests in the sandbox. `answer_quality` and the mined labels share it to agree on correctness."""
    if isinstance(item, dict):
        return "humaneval", HUMANEVAL_INSTRUCTION + item["prompt"], \
            lambda text: run_python(humaneval_program(item, text)).passed
    return item.kind, item.question, item.check
