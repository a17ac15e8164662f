"""Training batches for the EAGLE trainers, on the CPU or an accelerator.

The sequences of each batch are drawn in the caller's order (so a seed fixes the run), padded
on the CPU from the memory-mapped feature cache, then moved to the training device. On a
GPU the padding would leave the accelerator idle most of each step, so there the next few
batches are padded by worker threads while the current one trains (numpy's copies release
the interpreter lock). On a CPU that would only take cores from the training step itself,
so batches are built one at a time, in the loop, exactly as before.

On a GPU the draws run ahead of training, so a checkpoint's random state is that of the last
batch drawn, not the last one trained: a resumed GPU run starts after the batches that were
waiting (at most AHEAD_ON_ACCELERATOR of them are never trained on; random draws, so no bias).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from ..errors import LabError

AHEAD_ON_ACCELERATOR = 6  # batches padded in advance on a GPU


def resolve_device(device: str | None) -> torch.device:
    """The training device: `cpu`, `cuda` (or `cuda:N`); one line if a GPU is asked for and absent."""
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
