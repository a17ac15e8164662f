"""`python -m lab train eagle1`: train an EAGLE head on the target's features.

Three steps, each resumable:
1. Features: the target runs once over every regenerated sequence and its top feature at
   every position is cached (`lab.train.features`). Training then never runs the 30-layer
   target, only the one-layer head.
2. Training: pair t = (f_t + noise, x_{t+1}) -> predicted f_{t+1}. Loss = smooth-L1 between
   predicted and true feature (weight 1; 0 for the token-only head) + 0.1 x cross-entropy of
   the draft distribution (frozen LM head on the predicted feature) against the target's
   distribution (LM head on the true feature), on response positions. AdamW, gradient
   clipping, wall-clock budget, periodic checkpoints.
3. Evaluation on the held-out prompts by the one evaluator of every head kind
   (`lab.train.evaluate`), written into the manifest under "evaluation".
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..artifacts import command_line, git_commit, machine, repo_path, write_json
from ..eagle import EagleHead
from ..heads import head_path, load_head, save_head
from ..models import load_target
from ..paths import CACHE_DIR
from .batches import batches, budget_key, resolve_device
from .checkpoint import Checkpoint
from .distill import set_lr
from .evaluate import heldout_evaluation
from .features import target_features
from ..data import HELDOUT_PROMPTS, RegenSet, load_regen, regen_files, sharegpt_replies, training_items

MAX_LEN = 320          # tokens per training sequence: the response (<= 160) and as much prompt as fits
NOISE = 0.1            # uniform noise U(-NOISE, NOISE) added to input features during training
CE_WEIGHT = 0.1


# ---- 2. training ----------------------------------------------------------------------

def _batch(items: list[tuple[np.ndarray, np.ndarray, int]]):
    """(ids, features, prompt length) -> padded pairs: input features [B, P, F], next tokens
    [B, P], true next features [B, P, H], padding mask [B, P], loss mask [B, P].
    Pair i predicts f_{i+1} (and through it token i+2); it is scored when token i+2 would be
    a response token."""
    rows = []
    for ids, feats, prompt_len in items:
        cut = max(0, len(ids) - MAX_LEN)
        rows.append((ids[cut:], feats[cut:], max(prompt_len - cut, 2)))
    width = max(len(ids) for ids, _, _ in rows) - 1
    b, dim = len(rows), rows[0][1].shape[-1]
    f_in = torch.zeros(b, width, dim)
    tokens = torch.zeros(b, width, dtype=torch.long)
    pad = torch.zeros(b, width, dtype=torch.long)
    scored = torch.zeros(b, width, dtype=torch.bool)
    for r, (ids, feats, start) in enumerate(rows):
        f = torch.from_numpy(feats.astype(np.float32))
        p = len(ids) - 1
        f_in[r, :p], tokens[r, :p] = f[:-1], torch.from_numpy(ids[1:])
        pad[r, :p] = 1
        scored[r, start - 2: p] = True
    f_next = torch.cat([f_in[:, 1:], torch.zeros(b, 1, dim)], 1)
    for r, (_, feats, _) in enumerate(rows):  # the last pair's target is the final feature
        f_next[r, len(feats) - 2] = torch.from_numpy(feats[-1].astype(np.float32))
    return f_in, tokens, f_next, pad, scored


def head_loss(head: EagleHead, batch, feature_weight: float, ce_fraction: float = 1.0,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, float, float]:
    """(total loss, feature smooth-L1, cross-entropy) for one batch."""
    f_in, tokens, f_next, pad, scored = batch
    noisy = f_in + (torch.rand(f_in.shape, generator=generator, device=f_in.device) * 2 - 1) * NOISE
    pred = head(noisy, tokens, attention_mask=pad)
    feature = F.smooth_l1_loss(pred[scored], f_next[scored])
    keep = scored & (torch.rand(scored.shape, generator=generator, device=scored.device) < ce_fraction) \
        if ce_fraction < 1 else scored
    if not keep.any():  # a small batch can draw no CE positions
        return feature_weight * feature, float(feature.detach()), float("nan")
    with torch.no_grad():
        p_target = torch.softmax(head.logits(f_next[keep]).float(), -1)
    ce = -(p_target * torch.log_softmax(head.logits(pred[keep]).float(), -1)).sum(-1).mean()
    return feature_weight * feature + CE_WEIGHT * ce, float(feature.detach()), float(ce.detach())


def train_head(variant: str = "eagle1", minutes: float = 30.0, batch: int = 8, lr: float = 1e-3, seed: int = 0,
               ce_fraction: float = 0.5, resume: bool = False, out: Path | None = None, target=None,
               data: RegenSet | None = None, max_steps: int | None = None, eval_prompts: int | None = None,
               replies: int = 0, init: Path | None = None, reply_feature_dtype: str = "float32",
               device: str | None = None, sampled: bool = False, train_prompts: int | None = None) -> Path:
    """Train an EAGLE head for `minutes` of wall time (or exactly `max_steps` steps, with the
    cosine over steps: heads compared at equal steps) and write it (fp16) with its manifest to
    `out` (default data/eagle/<variant>.safetensors).

    `sampled`: train and evaluate on the answers sampled at T = 1 (`lab data build --sampled`)
    instead of the greedy ones. `train_prompts`: only the first N training prompts of that set
    (notebook 04 trains on the same prompts with greedy and with sampled answers).
    `replies`: also train on at least this many tokens of ShareGPT's original replies
    (`sharegpt_replies`: more data without generating it); `reply_feature_dtype="bfloat16"`
    computes their features with a bfloat16 copy of the target, much faster on a CPU with
    matrix units and close to float32 next to the NOISE added to every input feature in
    training. The regenerated set, and so every held-out evaluation, stays float32.
    `init`: start from this trained head's weights (its manifest is kept inside the new one).
    `device="cuda"`: features and training on a GPU; the head is evaluated and saved from the
    CPU. `eval_prompts=0` skips the held-out evaluation (`python -m lab evaluate` adds it)."""
    commit = git_commit()  # the code that trains, not whatever is checked out when it ends
    device = resolve_device(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    target = (target if target is not None else load_target()).to(device)
    for param in target.parameters():
        param.requires_grad_(False)
    data = data if data is not None else load_regen(sampled)
    head = (load_head(target, path=init) if init is not None else EagleHead(target, variant)).to(device)
    init_record = None if init is None else {  # read now: `out` may be `init` and is overwritten
        "path": repo_path(init), "manifest": json.loads(init.with_suffix(".json").read_text())
        if init.with_suffix(".json").exists() else None}
    feats = target_features(target, data, head.feature_layers)
    sources = [(data, feats)]
    if replies:
        extra = sharegpt_replies(replies)  # prompts after the full regenerated set, whatever `data` is
        feature_target = target if reply_feature_dtype == "float32" else load_target(reply_feature_dtype).to(device)
        sources.append((extra, target_features(feature_target, extra, head.feature_layers)))
        del feature_target
    # every training sequence as (source, index, prompt length)
    train = training_items([d for d, _ in sources], train_prompts)
    heldout = [i for i in range(len(data.split)) if data.split[i] == 0][:eval_prompts]
    feature_weight = 0.0 if variant == "token-only" else 1.0
    params = [p for p in head.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    out = out or head_path(variant)
    shape = {"variant": variant, "hidden": target.config.hidden_size, "vocab": target.config.vocab_size,
             "replies": replies, "reply_feature_dtype": reply_feature_dtype if replies else None,
             "init": None if init is None else repo_path(init), "sampled": sampled,
             "train_prompts": train_prompts}  # what a resume must match
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"), shape)
    progress = ckpt.resume(head, optim, rng) if resume else None
    step, spent, history = (progress["step"], progress["spent"], progress["history"]) if progress else (0, 0.0, [])
    budget = minutes * 60
    head.train()
    stream = batches(lambda: [(sources[s][0].ids(i), sources[s][1][i], p)
                              for s, i, p in rng.sample(train, min(batch, len(train)))], _batch, device)
    bar = tqdm(total=max_steps or round(budget), initial=step if max_steps else round(spent),
               desc=f"train {variant}", unit="step" if max_steps else "s")
    while (step < max_steps) if max_steps else (spent < budget):
        t0 = time.perf_counter()
        set_lr(optim, lr, step, *((step, max_steps) if max_steps else (spent, budget)), warmup=50)
        loss, feature, ce = head_loss(head, next(stream), feature_weight, ce_fraction, generator)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optim.step()
        step += 1
        history.append((round(feature, 4), round(ce, 4)))
        spent += time.perf_counter() - t0
        recent = np.nanmean(history[-20:], axis=0)
        bar.n = step if max_steps else round(spent)
        bar.set_postfix(step=step, feature=f"{recent[0]:.3f}", ce=f"{recent[1]:.3f}")
        ckpt.save_if_due(head.own_state, optim, rng, {"step": step, "spent": spent, "history": history})
    bar.close()
    stream.close()
    head.eval()
    head.cpu()  # the evaluation below, and every user of the head, run on the CPU
    target.cpu()
    save_head(head, out)
    report = {"evaluation": heldout_evaluation(head, data, feats, eval_prompts or HELDOUT_PROMPTS)} if heldout else {}
    regen_manifest = regen_files(sampled)[1]
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    first, last = np.nanmean(history[:20], axis=0), np.nanmean(history[-20:], axis=0)
    write_json(out.with_suffix(".json"), {
        "artifact": repo_path(out),
        "command": command_line(), "commit": commit, "machine": machine(),
        "variant": variant, "inputs": list(head.inputs), "feature_layers": list(head.feature_layers),
        "architecture": "fc (k*H -> H, bias) + one Llama decoder layer, no final norm; the target's embedding and "
                        "LM head shared and frozen; stored in fp16",
        "objective": {"feature_smooth_l1_weight": feature_weight, "soft_ce_weight": CE_WEIGHT,
                      "ce_fraction_of_positions": ce_fraction, "input_noise": f"uniform(-{NOISE}, {NOISE})"},
        "data": {"file": regen.get("artifact"), "answers": "sampled at T = 1" if sampled else "greedy",
                 "train_sequences": len(train), "train_prompts_limit": train_prompts,
                 "train_response_tokens": sum(int(data.offsets[i + 1] - data.offsets[i]) - p
                                              for s, i, p in train if s == 0),
                 "sharegpt_reply_sequences": len(sources[1][0].split) if replies else 0,
                 "sharegpt_reply_tokens": _response_tokens(sources[1][0]) if replies else 0,
                 "sharegpt_reply_feature_dtype": reply_feature_dtype if replies else None,
                 "heldout_prompts_evaluated": len(heldout)},
        "init": init_record,
        "optimiser": {"name": "AdamW", "lr": lr, "betas": [0.9, 0.95], "batch_sequences": batch, "max_len": MAX_LEN,
                      "grad_clip": 0.5,
                      "schedule": f"50-step warm-up, cosine over the {'steps' if max_steps else 'wall-clock budget'}"},
        budget_key(device): round(spent / 60, 2) if max_steps else minutes,
        "device": str(device), "steps": step, "wall_seconds": round(spent, 1), "max_steps": max_steps,
        "loss_first_20": {"feature": round(float(first[0]), 4), "ce": round(float(first[1]), 4)},
        "loss_last_20": {"feature": round(float(last[0]), 4), "ce": round(float(last[1]), 4)},
        **report,
    })
    ckpt.finish()
    return out


def _response_tokens(data: RegenSet) -> int:
    return int(data.offsets[-1] - data.prompt_lens.sum())
