"""Checkable tasks: questions generated from a seed whose answers a program can check.

A lossy method (Judge Decoding, Top-K verification) changes what the target writes, so its
quality has to be measured, and at the lab's scale (a 135M target) only on questions the target
actually gets right often enough: a comparison where the target scores zero shows nothing.
`python -m lab judge tasks` reports the target's and the drafts' accuracy per task.
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


@dataclass
class Task:
    id: str
    kind: str
    question: str
    answer: str                       # the exact answer, as a reference text
    check: Callable[[str], bool]      # does a generated answer contain the right result?


def _first_int(text: str) -> int | None:
    """The first integer in the text (thousands separators allowed: 1,200)."""
    m = re.search(r"-?\d+", re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))
    return int(m.group()) if m else None


def _number_task(kind: str, i: int, question: str, value: int) -> Task:
    return Task(f"{kind}-{i}", kind, question, str(value),
                lambda text: _first_int(text) == value)


def _sorting(i: int, rng: random.Random) -> Task:
    xs = rng.sample(range(1, 50), 4)
    want = sorted(xs)
    question = f"Sort these numbers from smallest to largest: {', '.join(map(str, xs))}. Reply with the sorted list only."

    def check(text: str) -> bool:
        return [int(x) for x in re.findall(r"\d+", text)][:4] == want
    return Task(f"sorting-{i}", "sorting", question, ", ".join(map(str, want)), check)


def _capital(i: int, rng: random.Random) -> Task:
    country = rng.choice(sorted(CAPITALS))
    city = CAPITALS[country]
    return Task(f"capital-{i}", "capital", f"What is the capital of {country}? Reply with the city name only.",
                city, lambda text: city.lower() in text.lower())


GENERATORS: dict[str, Callable[[int, random.Random], Task]] = {
    "addition": lambda i, r: (lambda a, b: _number_task("addition", i, f"What is {a} + {b}? Reply with the number only.",
                                                         a + b))(r.randint(10, 99), r.randint(10, 99)),
    "multiplication": lambda i, r: (lambda a, b: _number_task("multiplication", i, f"What is {a} times {b}? Reply "
                                                               "with the number only.", a * b))(r.randint(2, 9),
                                                                                               r.randint(2, 9)),
    "conversion": lambda i, r: (lambda n: _number_task("conversion", i, f"How many centimeters are in {n} meters? "
                                                        "Reply with the number only.", 100 * n))(r.randint(2, 30)),
    "sorting": _sorting,
    "capital": _capital,
}


def make_tasks(kinds: list[str] | None = None, per_kind: int = 20, seed: int = 0) -> list[Task]:
    """`per_kind` questions of each kind, the same for the same seed."""
    kinds = kinds or list(GENERATORS)
    unknown = [k for k in kinds if k not in GENERATORS]
    if unknown:
        raise LabError(f"unknown task {', '.join(unknown)}: choose from {', '.join(GENERATORS)}")
    rng = random.Random(seed)
    return [GENERATORS[k](i, rng) for k in kinds for i in range(per_kind)]
