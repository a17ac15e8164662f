"""Checkable tasks: questions generated from a seed whose answers a program can check.

A lossy method (Judge Decoding, Top-K verification) changes what the target writes, so its
quality has to be measured, and at the lab's scale (a 135M target) only on questions the target
actually gets right often enough: a comparison where the target scores zero shows nothing. Two
digit sums, times tables and sorting were tried and dropped after a one-off check in which the
target got almost none right.
Notebook 07 prints the target's and the 2-layer draft's accuracy per kind.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from .errors import LabError

CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "England": "London", "Greece": "Athens",
            "Canada": "Ottawa", "Ireland": "Dublin", "Portugal": "Lisbon", "Austria": "Vienna", "Poland": "Warsaw",
            "Norway": "Oslo", "Sweden": "Stockholm", "Kenya": "Nairobi", "Peru": "Lima", "Cuba": "Havana"}


WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark", "open": "closed",
             "early": "late", "high": "low", "full": "empty", "hard": "soft", "long": "short", "wet": "dry",
             "rich": "poor", "strong": "weak", "thick": "thin", "loud": "quiet", "clean": "dirty", "up": "down",
             "left": "right", "win": "lose"}
PLURALS = {"child": "children", "mouse": "mice", "foot": "feet", "tooth": "teeth", "man": "men", "woman": "women",
           "person": "people", "goose": "geese", "box": "boxes", "city": "cities", "leaf": "leaves", "knife": "knives"}


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


def _addition(i: int, rng: random.Random) -> Task:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return _number("addition", i, f"What is {a} + {b}? Reply with the number only.", a + b)


def _conversion(i: int, rng: random.Random) -> Task:
    n = rng.randint(2, 30)
    return _number("conversion", i, f"How many centimeters are in {n} meters? Reply with the number only.", 100 * n)


def _weekday(i: int, rng: random.Random) -> Task:
    d = rng.randrange(7)
    return _word("weekday", i, f"What day comes after {WEEKDAYS[d]}? Reply with the day only.", WEEKDAYS[(d + 1) % 7])


def _opposite(i: int, rng: random.Random) -> Task:
    word = rng.choice(sorted(OPPOSITES))
    return _word("opposite", i, f"What is the opposite of \"{word}\"? Reply with one word.", OPPOSITES[word])


def _plural(i: int, rng: random.Random) -> Task:
    word = rng.choice(sorted(PLURALS))
    return _word("plural", i, f"What is the plural of \"{word}\"? Reply with one word.", PLURALS[word])


def _capital(i: int, rng: random.Random) -> Task:
    country = rng.choice(sorted(CAPITALS))
    return _word("capital", i, f"What is the capital of {country}? Reply with the city name only.", CAPITALS[country])


GENERATORS: dict[str, Callable[[int, random.Random], Task]] = {
    "addition": _addition, "conversion": _conversion, "weekday": _weekday, "opposite": _opposite,
    "plural": _plural, "capital": _capital,
}


def make_tasks(kinds: list[str] | None = None, per_kind: int = 20, seed: int = 0) -> list[Task]:
    """`per_kind` questions of each kind, the same for the same seed."""
    kinds = kinds or list(GENERATORS)
    unknown = [k for k in kinds if k not in GENERATORS]
    if unknown:
        raise LabError(f"unknown task {', '.join(unknown)}: choose from {', '.join(GENERATORS)}")
    rng = random.Random(seed)
    return [GENERATORS[k](i, rng) for k in kinds for i in range(per_kind)]
