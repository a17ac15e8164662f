"""Code that needs a model's forward may hand it out instead of running it: written as a generator
("steps") that yields each forward as a request (`lab.target.engine.Request`: anything whose `run()`
scores it) and is sent back the scores. `run_alone` runs such steps one forward at a time;
`lab.batched.decode_batch` runs the steps of many sequences together, batching the forwards they
hand out in the same round."""
from __future__ import annotations

from types import GeneratorType
from typing import Any, Generator

Steps = Generator[Any, Any, Any]  # yields requests, is sent their scores, returns its value


def run_alone(steps: Steps) -> Any:
    """Run `steps` to its end, each forward it hands out scored on its own; the value it returns."""
    try:
        request = next(steps)
        while True:
            request = steps.send(request.run())
    except StopIteration as done:
        return done.value


def stepped(value: Any) -> Steps:
    """`yield from stepped(f(...))` takes f's value whether f computes it at once or returns steps
    that hand out forwards on the way (a tree builder calls drafters of both kinds)."""
    if isinstance(value, GeneratorType):
        return (yield from value)
    return value
