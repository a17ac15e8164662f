"""Resumable training: one checkpoint file per run, rewritten atomically once a minute."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import torch

from ..artifacts import atomic_write
from ..errors import LabError

CHECKPOINT_SECONDS = 60


class Checkpoint:
    """What a training run needs to go on after an interruption: the tensors it trains, the
    optimiser, the random state that orders its data, and its progress (step, seconds spent,
    loss history). `shape` records what the run is (target size, variant, data); a resume
    with another shape is refused, since loading it would quietly train something else."""

    def __init__(self, path: Path, shape: dict) -> None:
        self.path, self.shape, self.last_save = path, shape, time.perf_counter()

    def resume(self, model: torch.nn.Module, optim: torch.optim.Optimizer, rng: random.Random) -> dict | None:
        """Load the checkpoint into `model`, `optim` and `rng`; return its progress, or None
        when there is no checkpoint."""
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False, map_location="cpu")  # a GPU run resumes anywhere
        if not {"shape", "model", "optim", "rng", "progress"} <= set(state):
            raise LabError(f"{self.path} was written by an older version of lab: delete it or drop --resume")
        if state["shape"] != self.shape:
            raise LabError(f"{self.path} is for {state['shape']}, not {self.shape}: delete it or drop --resume")
        model.load_state_dict(state["model"], strict=False)
        optim.load_state_dict(state["optim"])
        rng.setstate(state["rng"])
        return state["progress"]

    def save_if_due(self, own_state: Callable[[], dict], optim: torch.optim.Optimizer, rng: random.Random,
                    progress: dict) -> None:
        """Write the checkpoint if CHECKPOINT_SECONDS have passed since the last one."""
        if time.perf_counter() - self.last_save < CHECKPOINT_SECONDS:
            return
        atomic_write(self.path, lambda tmp: torch.save({"shape": self.shape, "model": own_state(),
                                                        "optim": optim.state_dict(), "rng": rng.getstate(),
                                                        "progress": progress}, tmp))
        self.last_save = time.perf_counter()

    def finish(self) -> None:
        """A finished run's checkpoint is no longer needed: its result is written."""
        self.path.unlink(missing_ok=True)
