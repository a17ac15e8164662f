"""Training batches for the loop trainers, drawn in the caller's order (a seed fixes the run) and
padded on the CPU. On a GPU worker threads pad the next batches while one trains (numpy's copies
release the GIL), so a GPU checkpoint's random state is the last batch drawn: a resumed GPU run
skips up to AHEAD_ON_ACCELERATOR batches (random draws: no bias). A CPU builds them one at a time."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from ..errors import LabError

AHEAD_ON_ACCELERATOR = 6  # batches padded in advance on a GPU


def resolve_device(device: str | None) -> torch.device:
    """The training device: `cpu`, `cuda` (or `cuda:N`); LabError if a GPU is asked for and absent."""
    chosen = torch.device(device or "cpu")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise LabError("--device cuda was given but torch sees no GPU: train with --device cpu")
    return chosen


def budget_key(device: torch.device) -> str:
    """The manifest key of a training budget: CPU-minutes and GPU-minutes are not comparable."""
    return ("gpu" if device.type == "cuda" else "cpu") + "_budget_minutes"


def to_device(batch: tuple, device: torch.device) -> tuple:
    return tuple(t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in batch)


def batches(draw: Callable[[], list], build: Callable[[list], tuple], device: torch.device) -> Iterator[tuple]:
    """Endless batches: `draw()` picks a batch's items, `build(items)` pads them into tensors on
    the CPU; each batch arrives on `device`. Close the iterator when training ends."""
    if device.type == "cpu":
        while True:
            yield build(draw())
    with ThreadPoolExecutor(AHEAD_ON_ACCELERATOR) as pool:
        pending = deque(pool.submit(build, draw()) for _ in range(AHEAD_ON_ACCELERATOR))
        while True:
            ready = pending.popleft().result()
            pending.append(pool.submit(build, draw()))
            yield to_device(ready, device)
