"""`python -m lab train medusa`: Medusa-1 heads on the target's cached top features (the target
frozen; the regenerated answers are its own: self-distillation). At position t head k (1-based)
learns the target's distribution of token t+k+1 (its LM head on the true feature at t+k) over the
draft vocabulary: loss = sum over k of DECAY^k x that soft cross-entropy, on response tokens."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..artifacts import git_commit, repo_path, write_json
from ..data import RegenSet, load_regen, regen_files, training_items
from ..drafters.eagle_draft import draft_vocabulary
from ..drafters.heads import head_path, save_head
from ..drafters.medusa import MedusaHeads
from ..intervals import wilson
from ..options import recorded
from ..paths import CACHE_DIR
from ..target.load import load_target
from .batches import batches, budget_key
from .checkpoint import Checkpoint
from .evaluate import RANKS, heldout_indices
from .features import FeatureSet, target_features
from .loop import Recipe, fit, provenance, seeded, snapshot_path
from .options import MedusaOptions

MAX_LEN = 320     # tokens per training sequence, as the EAGLE heads' (the response and what fits of the prompt)
DECAY = 0.8       # head k's loss weight is DECAY ** k (the paper's lambda_k)


def _batch(items: list[tuple[np.ndarray, np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, features, prompt length) -> features [B, P, H], padding [B, P], and the position of
    the first response token [B] of each (cut) sequence."""
    rows = []
    for ids, feats, prompt_len in items:
        cut = max(0, len(ids) - MAX_LEN)
        rows.append((feats[cut:], max(prompt_len - cut, 1)))
    width, dim = max(len(f) for f, _ in rows), rows[0][0].shape[-1]
    feats = torch.zeros(len(rows), width, dim)
    pad = torch.zeros(len(rows), width, dtype=torch.bool)
    starts = torch.tensor([start for _, start in rows])
    for r, (f, _) in enumerate(rows):
        feats[r, : len(f)], pad[r, : len(f)] = torch.from_numpy(f.astype(np.float32)), True
    return feats, pad, starts


def medusa_loss(heads: MedusaHeads, batch) -> tuple[torch.Tensor, list[float]]:
    """(weighted loss, each head's mean soft cross-entropy) for one batch, as the module says."""
    feats, pad, starts = batch
    readout = heads.readout_weight().float()
    with torch.no_grad():  # the target's distribution of token u + 1, from its feature at u
        target_logp = torch.log_softmax(feats @ readout.T, -1)
    logp = torch.log_softmax(heads(feats).float(), -1)  # [B, P, K, V']
    positions = torch.arange(feats.shape[1])
    has_next = F.pad(pad[:, 1:], (0, 1))  # token u + 1 is in the sequence
    total, per_head = feats.new_zeros(()), []
    for k in range(1, len(heads.blocks) + 1):
        scored = has_next[:, k:] & (positions[None, k:] + 1 >= starts[:, None])
        ce = -(target_logp[:, k:].exp() * logp[:, :-k, k - 1]).sum(-1)[scored].mean()
        total = total + DECAY ** k * ce
        per_head.append(round(float(ce.detach()), 4))
    return total, per_head


@torch.inference_mode()
def heldout_accuracy(heads: MedusaHeads, data: RegenSet, feats: FeatureSet) -> dict:
    """Each head's agreement with the target's greedy token on the unique held-out prompts: top-1 and
    top-5 with Wilson intervals, and the accuracy of ranks 0..RANKS-1 (out of vocabulary: a miss)."""
    column = {int(t): i for i, t in enumerate(heads.vocab.tolist())}
    hits1 = [0] * len(heads.blocks)
    hits5 = [0] * len(heads.blocks)
    rank_hits = np.zeros((len(heads.blocks), RANKS), dtype=np.int64)
    scored = [0] * len(heads.blocks)
    prompts = heldout_indices(data)
    for i in prompts:
        ids, prompt_len = data.ids(i), int(data.prompt_lens[i])
        top = torch.topk(heads(torch.from_numpy(feats[i].astype(np.float32))), RANKS, -1).indices  # [L, K, RANKS]
        for k in range(1, len(heads.blocks) + 1):
            for t in range(max(0, prompt_len - k - 1), len(ids) - k - 1):
                truth = column.get(int(ids[t + k + 1]), -1)
                ranks = top[t, k - 1].tolist()
                scored[k - 1] += 1
                if truth in ranks:
                    r = ranks.index(truth)
                    rank_hits[k - 1, r] += 1
                    hits1[k - 1] += int(r == 0)
                    hits5[k - 1] += int(r < 5)

    def rate(hits: int, n: int) -> dict:
        low, high = wilson(hits, n) or (None, None)
        return {"rate": round(hits / n, 4) if n else None, "hits": hits, "positions": n,
                "interval": [round(low, 4), round(high, 4)] if n else None}
    return {"prompts": len(prompts),
            "top1_by_head": [rate(h, n) for h, n in zip(hits1, scored)],
            "top5_by_head": [rate(h, n) for h, n in zip(hits5, scored)],
            "rank_accuracy_by_head": [[round(int(h) / n, 4) for h in row] for row, n in zip(rank_hits, scored)]}


def train_medusa(opts: MedusaOptions, target=None, data: RegenSet | None = None, out: Path | None = None) -> Path:
    """Train `opts.heads` Medusa heads for `opts.minutes` (or exactly `opts.max_steps` steps) and
    write them (fp16) with their manifest to `out` (default data/eagle/NAME.safetensors)."""
    commit = git_commit()
    rng, _ = seeded(opts.seed)
    target = target if target is not None else load_target()
    target.requires_grad_(False)
    data = data if data is not None else load_regen()
    heads = MedusaHeads(target, draft_vocabulary(opts.draft_vocab), opts.heads)
    feats = target_features(target, data, heads.feature_layers)
    train = training_items([data])
    out = out or head_path(opts.name)
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"),
                      {"heads": opts.heads, "draft_vocab": opts.draft_vocab, "kind": "medusa"})
    recipe = Recipe(opts.lr, warmup=40, grad_clip=1.0, minutes=opts.minutes, max_steps=opts.max_steps)

    def loss_of_batch(batch):
        return medusa_loss(heads, batch)

    def postfix(history: list) -> dict:
        return {"ce": "/".join(f"{x:.2f}" for x in np.mean(history[-20:], axis=0))}

    stream = batches(lambda: [(data.ids(i), feats[i], p) for _, i, p in rng.sample(train, min(opts.batch, len(train)))],
                     _batch, torch.device("cpu"))
    step, spent, history, _ = fit(heads, loss_of_batch, stream, recipe, ckpt, rng, heads.own_state,
                                  resume=opts.resume, desc="train medusa", postfix=postfix,
                                  snapshot=lambda n: save_head(heads, snapshot_path(out, n)),
                                  snapshot_every=opts.snapshot_every)
    save_head(heads, out)
    regen_manifest = regen_files(False)[1]
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    write_json(out.with_suffix(".json"), {
        **provenance(out, commit),
        "variant": "medusa", "heads": opts.heads, "feature_layers": list(heads.feature_layers),
        "architecture": "per head: h + SiLU(W h + b), W started at zero, read out through the target's LM head rows "
                        f"of the {opts.draft_vocab} most frequent training tokens (shared, frozen); stored in fp16",
        "objective": {"soft_ce_weights": [DECAY ** k for k in range(1, opts.heads + 1)],
                      "labels": "the target's distribution of token t+k+1 over the draft vocabulary"},
        "data": {"file": regen.get("artifact"), "answers": "greedy (the target's own)", "train_sequences": len(train),
                 "train_response_tokens": sum(int(data.offsets[i + 1] - data.offsets[i]) - p for _, i, p in train),
                 "feature_cache": repo_path(feats.folder) if feats.folder else None},
        "optimiser": recipe.recorded(batch_sequences=opts.batch, max_len=MAX_LEN),
        budget_key(torch.device("cpu")): round(spent / 60, 2) if opts.max_steps else opts.minutes,
        "steps": step, "wall_seconds": round(spent, 1),
        "loss_first_20": np.mean(history[:20], axis=0).round(4).tolist(),
        "loss_last_20": np.mean(history[-20:], axis=0).round(4).tolist(),
        "evaluation": heldout_accuracy(heads, data, feats),
        "options": recorded(opts),
    })
    ckpt.finish()
    return out
