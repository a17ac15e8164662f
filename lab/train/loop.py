"""The one training loop of the draft and head trainers (`fit`: AdamW, warm-up and cosine over wall
time or steps, gradient clipping, progress, periodic checkpoints, resume), and what every trainer's
manifest records of its run. A trainer brings its own model, batches and loss."""
from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm import tqdm

from ..artifacts import command_line, machine, repo_path
from .checkpoint import Checkpoint

BETAS = (0.9, 0.95)


@dataclass(frozen=True)
class Recipe:
    """How a run trains: AdamW (BETAS, no weight decay) at `lr`, warm-up over `warmup` steps, cosine to
    zero over `minutes` of wall time or exactly `max_steps` steps; gradients clipped to `grad_clip`."""
    lr: float
    warmup: int
    grad_clip: float
    minutes: float
    max_steps: int | None = None

    def recorded(self, **own: Any) -> dict:
        """The manifest's "optimiser": the recipe, with the trainer's `own` fields after the betas."""
        over = "steps" if self.max_steps else "wall-clock budget"
        return {"name": "AdamW", "lr": self.lr, "betas": list(BETAS), **own, "grad_clip": self.grad_clip,
                "schedule": f"{self.warmup}-step warm-up, cosine over the {over}"}


def seeded(seed: int, device: torch.device | str = "cpu") -> tuple[random.Random, torch.Generator]:
    """Seed torch (so a model built next starts the same) and return the data order's `random.Random`
    (a checkpoint keeps its state) and a generator for the loss's own randomness on `device`."""
    torch.manual_seed(seed)
    return random.Random(seed), torch.Generator(device=device).manual_seed(seed)


def set_lr(optim: torch.optim.Optimizer, lr: float, step: int, spent: float, budget: float, warmup: int) -> None:
    """Set the rate to `lr` x linear warm-up over `warmup` steps x cosine over `budget` (s or steps)."""
    scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(spent / budget, 1.0)))
    for group in optim.param_groups:
        group["lr"] = lr * scale


class Fitted(NamedTuple):
    """What `fit` returns: steps, seconds, one record per step, validation [(step, loss), ...]."""
    steps: int
    spent: float
    history: list
    validation: list


def fit(model: torch.nn.Module, loss_of_batch: Callable[[Any], tuple[torch.Tensor, Any]], batches: Iterator,
        recipe: Recipe, checkpoint: Checkpoint, rng: random.Random, own_state: Callable[[], dict], *,
        resume: bool = False, desc: str = "train", postfix: Callable[[list], dict] = lambda history: {},
        show: bool = True, validate: Callable[[], float] | None = None,
        validate_every: int = 0, snapshot: Callable[[int], None] | None = None, snapshot_every: int = 0) -> Fitted:
    """Train `model`'s trainable parameters until the recipe's budget is spent, one step per
    `next(batches)`; `loss_of_batch(batch)` returns (loss, record), the record joining the history.
    `validate()` (no gradient, eval mode) is recorded every `validate_every` steps and after the last;
    `snapshot(step)` saves the model every `snapshot_every` steps (the schedule is the whole run's).
    `resume` goes on from `checkpoint`, written through `own_state()` once due. `batches` is closed,
    `model` left in eval mode."""
    if snapshot_every and snapshot is None:
        raise ValueError("fit: snapshot_every needs a snapshot function")
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=recipe.lr, betas=BETAS, weight_decay=0.0)
    progress = checkpoint.resume(model, optim, rng) if resume else None
    step, spent, history = (progress["step"], progress["spent"], progress["history"]) if progress else (0, 0.0, [])
    validation = list(progress.get("validation", [])) if progress else []

    def record_validation() -> None:
        if validate is not None and (not validation or validation[-1][0] != step):
            model.eval()
            with torch.no_grad():
                validation.append([step, round(float(validate()), 5)])
            model.train()

    budget, max_steps = recipe.minutes * 60, recipe.max_steps
    model.train()
    bar = tqdm(total=max_steps or round(budget), initial=step if max_steps else round(spent), desc=desc,
               unit="step" if max_steps else "s", disable=not show)
    while (step < max_steps) if max_steps else (spent < budget):
        t0 = time.perf_counter()
        set_lr(optim, recipe.lr, step, *((step, max_steps) if max_steps else (spent, budget)), recipe.warmup)
        loss, record = loss_of_batch(next(batches))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
        optim.step()
        step += 1
        history.append(record)
        spent += time.perf_counter() - t0
        bar.n = step if max_steps else round(spent)
        bar.set_postfix(step=step, **postfix(history))
        if validate_every and step % validate_every == 0:
            record_validation()
        if snapshot_every and step % snapshot_every == 0:
            snapshot(step)
        checkpoint.save_if_due(own_state, optim, rng, {"step": step, "spent": spent, "history": history,
                                                       "validation": validation})
    record_validation()
    bar.close()
    batches.close()
    model.eval()
    return Fitted(step, spent, history, validation)


def snapshot_path(out: Path, step: int) -> Path:
    """Where a run that writes `out` saves its model after `step` steps: data/eagle/NAME-stepN.safetensors."""
    return out.with_name(f"{out.stem}-step{step}{out.suffix}")


def converged(validation: list, tolerance: float = 0.01, tail: float = 0.2) -> dict:
    """The verdict on a validation curve [(step, loss), ...]: "trained enough" if the loss moved by less
    than `tolerance` (relative) over the last `tail` of the steps, else "capped"; None if too short."""
    if len(validation) < 2:
        return {"verdict": None, "why": "fewer than two validation points"}
    last_step, last_loss = validation[-1]
    start = last_step - tail * last_step
    earlier = [loss for s, loss in validation if s <= start]
    if not earlier:
        return {"verdict": None, "why": f"no validation point before the last {tail:.0%} of the steps"}
    change = abs(last_loss - earlier[-1]) / abs(earlier[-1])
    return {"verdict": "trained enough" if change < tolerance else "capped",
            "relative_change": round(change, 4), "over_last": tail, "tolerance": tolerance}


def provenance(out: Path, commit: str) -> dict:
    """A manifest's first fields: the file made, the command and code that made it, the machine."""
    return {"artifact": repo_path(out), "command": command_line(), "commit": commit, "machine": machine()}


def started_from(init: Path | None) -> dict | None:
    """A manifest's "init": the trained head a run continues (None: a new head), with its manifest."""
    if init is None:
        return None
    manifest = init.with_suffix(".json")
    return {"path": repo_path(init), "manifest": json.loads(manifest.read_text()) if manifest.exists() else None}
