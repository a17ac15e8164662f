"""`python -m lab train eagle1`: an EAGLE head on the target's cached features (`lab.train.features`).
Pair t = (f_t + noise, x_{t+1}) predicts f_{t+1}; loss = smooth-L1 to the true feature (weight 1; 0
for the token-only head) + CE_WEIGHT x the soft cross-entropy of the draft distribution against the
target's (the frozen LM head on the predicted and on the true feature), on response positions."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..artifacts import git_commit, repo_path, write_json
from ..data import HELDOUT_PROMPTS, RegenSet, load_regen, regen_files, sharegpt_replies, training_items
from ..drafters.eagle1 import EagleHead
from ..drafters.heads import head_path, load_head, save_head
from ..options import recorded
from ..paths import CACHE_DIR
from ..target.load import load_target
from .batches import batches, budget_key, resolve_device
from .checkpoint import Checkpoint
from .evaluate import heldout_evaluation
from .features import source_features
from .loop import Recipe, fit, provenance, seeded, snapshot_path, started_from
from .options import Eagle1Options

MAX_LEN = 320          # tokens per training sequence: the response (<= 160) and as much prompt as fits
NOISE = 0.1            # uniform noise U(-NOISE, NOISE) added to input features during training
CE_WEIGHT = 0.1


# ---- training -------------------------------------------------------------------------

def _batch(items: list[tuple[np.ndarray, np.ndarray, int]]):
    """(ids, features, prompt length) -> padded pairs: input features [B, P, F], next tokens [B, P],
    true next features [B, P, H], padding mask [B, P], loss mask [B, P]. Pair i predicts f_{i+1}
    (and through it token i+2) and is scored where token i+2 is a response token."""
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


def train_head(opts: Eagle1Options, target=None, data: RegenSet | None = None, out: Path | None = None) -> Path:
    """Train an EAGLE head as `opts` (`Eagle1Options`) say for `opts.minutes` or `opts.max_steps` steps
    and write it (fp16) with its manifest to `out` (default data/eagle/NAME.safetensors, NAME
    `opts.name` or the variant). Reply features may be bfloat16; the regenerated set, and so every
    held-out evaluation, stays float32. The head is evaluated (unless `eval_prompts=0`) on the CPU."""
    commit = git_commit()  # the code that trains, not whatever is checked out when it ends
    variant, replies, dtype, sampled = opts.variant, opts.replies, opts.reply_feature_dtype, opts.sampled
    device = resolve_device(opts.device)
    rng, generator = seeded(opts.seed, device)
    target = (target if target is not None else load_target()).to(device)
    target.requires_grad_(False)
    data = data if data is not None else load_regen(sampled)
    init = head_path(opts.init) if opts.init else None
    head = (load_head(target, path=init) if init is not None else EagleHead(target, variant)).to(device)
    init_record = started_from(init)  # read now: `out` may be `init` and is overwritten
    texts = [data] + ([sharegpt_replies(replies)] if replies else [])
    sources = list(zip(texts, source_features(target, texts, head.feature_layers, dtype)))
    feats = sources[0][1]
    train = training_items([d for d, _ in sources], opts.train_prompts)
    heldout = [i for i in range(len(data.split)) if data.split[i] == 0][:opts.eval_prompts]
    feature_weight = 0.0 if variant == "token-only" else 1.0
    out = out or head_path(opts.name or variant)
    shape = {"variant": variant, "hidden": target.config.hidden_size, "vocab": target.config.vocab_size,
             "replies": replies, "reply_feature_dtype": dtype if replies else None,
             "init": None if init is None else repo_path(init), "sampled": sampled,
             "train_prompts": opts.train_prompts}  # what a resume must match
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"), shape)
    recipe = Recipe(opts.lr, warmup=50, grad_clip=0.5, minutes=opts.minutes, max_steps=opts.max_steps)

    def loss_of_batch(batch):
        loss, feature, ce = head_loss(head, batch, feature_weight, opts.ce_fraction, generator)
        return loss, (round(feature, 4), round(ce, 4))

    def postfix(history: list) -> dict:
        recent = np.nanmean(history[-20:], axis=0)
        return {"feature": f"{recent[0]:.3f}", "ce": f"{recent[1]:.3f}"}

    stream = batches(lambda: [(sources[s][0].ids(i), sources[s][1][i], p)
                              for s, i, p in rng.sample(train, min(opts.batch, len(train)))], _batch, device)
    step, spent, history, _ = fit(head, loss_of_batch, stream, recipe, ckpt, rng, head.own_state, resume=opts.resume,
                               desc=f"train {variant}", postfix=postfix,
                               snapshot=lambda n: save_head(head, snapshot_path(out, n)),
                               snapshot_every=opts.snapshot_every)
    head.cpu()  # the evaluation below, and every user of the head, run on the CPU
    target.cpu()
    save_head(head, out)
    report = {"evaluation": heldout_evaluation(head, data, feats, opts.eval_prompts or HELDOUT_PROMPTS)} \
        if heldout else {}
    regen_manifest = regen_files(sampled)[1]
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    first, last = np.nanmean(history[:20], axis=0), np.nanmean(history[-20:], axis=0)
    write_json(out.with_suffix(".json"), {
        **provenance(out, commit),
        "variant": variant, "inputs": list(head.inputs), "feature_layers": list(head.feature_layers),
        "architecture": "fc (k*H -> H, bias) + one Llama decoder layer, no final norm; the target's embedding and "
                        "LM head shared and frozen; stored in fp16",
        "objective": {"feature_smooth_l1_weight": feature_weight, "soft_ce_weight": CE_WEIGHT,
                      "ce_fraction_of_positions": opts.ce_fraction, "input_noise": f"uniform(-{NOISE}, {NOISE})"},
        "data": {"file": regen.get("artifact"), "answers": "sampled at T = 1" if sampled else "greedy",
                 "train_sequences": len(train), "train_prompts_limit": opts.train_prompts,
                 "train_response_tokens": sum(int(data.offsets[i + 1] - data.offsets[i]) - p
                                              for s, i, p in train if s == 0),
                 "sharegpt_reply_sequences": len(sources[1][0].split) if replies else 0,
                 "sharegpt_reply_tokens": _response_tokens(sources[1][0]) if replies else 0,
                 "sharegpt_reply_feature_dtype": dtype if replies else None,
                 "heldout_prompts_evaluated": len(heldout)},
        "init": init_record,
        "optimiser": recipe.recorded(batch_sequences=opts.batch, max_len=MAX_LEN),
        budget_key(device): round(spent / 60, 2) if opts.max_steps else opts.minutes,
        "device": str(device), "steps": step, "wall_seconds": round(spent, 1), "max_steps": opts.max_steps,
        "loss_first_20": {"feature": round(float(first[0]), 4), "ce": round(float(first[1]), 4)},
        "loss_last_20": {"feature": round(float(last[0]), 4), "ce": round(float(last[1]), 4)},
        **report,
        "options": recorded(opts),
    })
    ckpt.finish()
    return out


def _response_tokens(data: RegenSet) -> int:
    return int(data.offsets[-1] - data.prompt_lens.sum())
