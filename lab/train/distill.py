"""`python -m lab train draft --layers N`: distil a small draft LM from the target.

The draft starts as the target's first N layers plus its final norm, sharing (and freezing)
the target's embedding and LM head. It is trained with cross-entropy on the response tokens
of the regenerated ShareGPT set: those tokens are the target's own greedy choices, so this is
top-1 distillation without running the target during training. Training is bounded by wall
time (a CPU budget), checkpoints periodically and can resume.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from ..artifacts import atomic_write, command_line, git_commit, machine, repo_path, write_json
from ..models import draft_own_state, draft_path, load_target, make_draft
from ..paths import CACHE_DIR
from .checkpoint import Checkpoint
from ..data import REGEN_DIR, load_regen

MAX_LEN = 384  # tokens per training sequence: the response and as much prompt as fits


def set_lr(optim: torch.optim.Optimizer, lr: float, step: int, spent: float, budget: float, warmup: int) -> None:
    """Linear warm-up over `warmup` steps, then cosine decay over the wall-clock budget."""
    scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(spent / budget, 1.0)))
    for group in optim.param_groups:
        group["lr"] = lr * scale


def _batch(seqs: list[tuple[np.ndarray, int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and labels (-100 except on response tokens)."""
    rows = []
    for ids, prompt_len in seqs:
        cut = max(0, len(ids) - MAX_LEN)
        rows.append((ids[cut:], max(prompt_len - cut, 1)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (ids, start) in enumerate(rows):
        t = torch.from_numpy(ids)
        input_ids[r, : len(t)] = t
        mask[r, : len(t)] = 1
        labels[r, start - 1: len(t) - 1] = t[start:]  # position i predicts token i+1
    return input_ids, mask, labels


def _loss(model, input_ids, mask, labels, fraction: float = 1.0,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """Cross-entropy on (a random `fraction` of) the labelled positions. The frozen 49k-way
    LM head dominates the cost of a small draft's step, so scoring a quarter of the positions
    buys about three times as many optimiser steps per CPU-minute."""
    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    keep = labels != -100
    if fraction < 1.0:
        keep &= torch.rand(keep.shape, generator=generator) < fraction
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), labels[keep])


@torch.inference_mode()
def top1_agreement(model, seqs: list[tuple[np.ndarray, int]], pad: int, batch: int = 8) -> float:
    """Fraction of held-out response positions where the model's argmax is the target's
    greedy token (the next token of the regenerated response)."""
    hits = total = 0
    for start in range(0, len(seqs), batch):
        input_ids, mask, labels = _batch(seqs[start: start + batch], pad)
        hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        keep = labels != -100
        hits += int((model.lm_head(hidden[keep]).argmax(-1) == labels[keep]).sum())
        total += int(keep.sum())
    return hits / max(total, 1)


def train_draft(n_layers: int, minutes: float, batch: int = 8, lr: float = 2e-3, seed: int = 0,
                label_fraction: float = 0.25,
                resume: bool = False, out: Path | None = None, target=None, data=None,
                max_steps: int | None = None) -> Path:
    """Distil an `n_layers` draft for `minutes` of wall time (or `max_steps`), write it in fp16
    with its manifest to `out` (default data/drafts/). `target` and `data` default to the real
    target and the shipped regenerated set (tests pass small ones)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    target = target if target is not None else load_target()
    for param in target.parameters():
        param.requires_grad_(False)
    data = data if data is not None else load_regen()
    train, heldout = data.sequences("train"), data.sequences("heldout")
    pad = target.config.eos_token_id
    draft = make_draft(target, n_layers)
    params = [p for p in draft.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    out = out or draft_path(n_layers)
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"),
                      {"n_layers": n_layers, "hidden": target.config.hidden_size})
    progress = ckpt.resume(draft, optim, rng) if resume else None
    step, spent, losses = (progress["step"], progress["spent"], progress["history"]) if progress else (0, 0.0, [])
    agreement_before = top1_agreement(draft, heldout, pad) if step == 0 else None
    budget = minutes * 60
    draft.train()
    bar = tqdm(total=round(budget), initial=round(spent), desc=f"draft {n_layers}L", unit="s")
    while spent < budget and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        set_lr(optim, lr, step, spent, budget, warmup=20)
        loss = _loss(draft, *_batch(rng.sample(train, batch), pad), label_fraction, generator)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        step += 1
        losses.append(round(loss.item(), 4))
        spent += time.perf_counter() - t0
        bar.n = round(spent)
        bar.set_postfix(step=step, loss=f"{np.mean(losses[-20:]):.3f}")
        ckpt.save_if_due(lambda: draft_own_state(draft), optim, rng, {"step": step, "spent": spent, "history": losses})
    bar.close()
    draft.eval()
    atomic_write(out, lambda tmp: save_file({k: v.half().contiguous() for k, v in draft_own_state(draft).items()},
                                            str(tmp)))
    regen_manifest = REGEN_DIR / "manifest.json"
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    write_json(out.with_suffix(".json"), {
        "artifact": repo_path(out),
        "command": command_line(), "commit": git_commit(), "machine": machine(),
        "architecture": f"LlamaForCausalLM, {n_layers} decoder layer(s) initialised from the target's first "
                        f"{n_layers}; embedding and LM head shared with the target and frozen; stored in fp16",
        "objective": "cross-entropy on the target's greedy response tokens (top-1 distillation)",
        "data": {"file": regen.get("artifact"), "train_response_tokens": regen.get("train", {}).get("response_tokens"),
                 "heldout_prompts": len(heldout)},
        "optimiser": {"name": "AdamW", "lr": lr, "betas": [0.9, 0.95], "batch_sequences": batch,
                      "label_fraction": label_fraction,
                      "max_len": MAX_LEN, "grad_clip": 1.0, "schedule": "20-step warm-up, cosine over the budget"},
        "budget_minutes": minutes, "steps": step, "wall_seconds": round(spent, 1),
        "max_steps": max_steps,
        "loss_first_20": round(float(np.mean(losses[:20])), 4), "loss_last_20": round(float(np.mean(losses[-20:])), 4),
        "heldout_top1_agreement_before": agreement_before,
        "heldout_top1_agreement": top1_agreement(draft, heldout, pad),
    })
    ckpt.finish()
    return out
