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
    """What a run needs to go on after an interruption: trained tensors, optimiser, data-order random
    state, progress. Resuming with another `shape` is refused: it would quietly train something else."""

    def __init__(self, path: Path, shape: dict) -> None:
        self.path, self.shape, self.last_save = path, shape, time.perf_counter()

    def resume(self, model: torch.nn.Module, optim: torch.optim.Optimizer, rng: random.Random) -> dict | None:
        """Load the checkpoint into `model`, `optim` and `rng` and return its progress; None without a
        checkpoint, LabError for one of another shape or format."""
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
        """Delete the checkpoint of a run whose result is written."""
        self.path.unlink(missing_ok=True)
