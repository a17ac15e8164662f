"""The one way the lab times code outside the kernels: seconds by name (`Seconds`), a clock that waits
for a GPU's queued work (`clock`), and the fastest of repeated runs taken in turns (`fastest`)."""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import torch


class Seconds(dict):
    """Seconds spent, by name: `call` runs a function and adds its wall time under a name."""

    def call(self, name: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start

    def wrap(self, name: str, fn: Callable) -> Callable:
        """`fn`, with every call's seconds added under `name`."""
        return lambda *args, **kwargs: self.call(name, fn, *args, **kwargs)


def clock(device: torch.device | str | None = None) -> float:
    """time.perf_counter(), after waiting for the queued work when `device` is a GPU (it runs async)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def fastest(steps: dict[Hashable, Callable[[], Any]], repeats: int, warmup: int = 3) -> dict[Hashable, float]:
    """The fastest of `repeats` runs of each step (the least disturbed), after `warmup` untimed runs.
    The steps run in turns, one run of each per round, so that a machine's drift reaches all alike."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict = {key: [] for key in steps}
    for _ in range(repeats):
        for key, step in steps.items():
            start = time.perf_counter()
            step()
            times[key].append(time.perf_counter() - start)
    return {key: min(t) for key, t in times.items()}
