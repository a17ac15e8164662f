"""`python -m lab train draft --layers N`: distil a small draft LM from the target. The draft starts
as the target's first N layers and final norm, sharing (frozen) its embedding and LM head, and is
trained with cross-entropy on the regenerated set's response tokens, the target's own greedy
choices: top-1 distillation without running the target during training."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ..artifacts import atomic_write, git_commit, write_json
from ..data import REGEN_DIR, load_regen
from ..errors import LabError
from ..options import recorded
from ..paths import CACHE_DIR
from ..target.load import draft_own_state, draft_path, load_target, make_draft
from .batches import batches
from .checkpoint import Checkpoint
from .loop import Recipe, fit, provenance, seeded, snapshot_path
from .options import DraftOptions

MAX_LEN = 384  # tokens per training sequence: the response and as much prompt as fits


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
    """Cross-entropy on (a random `fraction` of) the labelled positions: the frozen LM head dominates
    a small draft's step, so scoring fewer positions buys more optimiser steps per minute."""
    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    keep = labels != -100
    if fraction < 1.0:
        keep &= torch.rand(keep.shape, generator=generator) < fraction
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), labels[keep])


@torch.inference_mode()
def top1_agreement(model, seqs: list[tuple[np.ndarray, int]], pad: int, batch: int = 8) -> float:
    """The share of response positions where the model's argmax is the target's greedy token."""
    hits = total = 0
    for start in range(0, len(seqs), batch):
        input_ids, mask, labels = _batch(seqs[start: start + batch], pad)
        hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        keep = labels != -100
        hits += int((model.lm_head(hidden[keep]).argmax(-1) == labels[keep]).sum())
        total += int(keep.sum())
    return hits / max(total, 1)


def train_draft(opts: DraftOptions, target=None, data=None, out: Path | None = None) -> Path:
    """Distil an `opts.layers` draft for `opts.minutes` or `opts.max_steps` steps and write it in fp16
    with its manifest to `out` (default data/drafts/); `target` and `data` default to the real ones.
    LabError without `opts.layers`."""
    if opts.layers is None:
        raise LabError("`train draft` needs --layers N (1, 2 or 4)")
    rng, generator = seeded(opts.seed)
    target = target if target is not None else load_target()
    target.requires_grad_(False)
    data = data if data is not None else load_regen()
    train, heldout = data.sequences("train"), data.sequences("heldout")
    pad = target.config.eos_token_id
    draft = make_draft(target, opts.layers)
    out = out or draft_path(opts.layers)
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"),
                      {"n_layers": opts.layers, "hidden": target.config.hidden_size})
    fresh = not (opts.resume and ckpt.path.exists())  # the untrained draft's agreement, on a fresh start only
    agreement_before = top1_agreement(draft, heldout, pad) if fresh else None
    recipe = Recipe(opts.lr, warmup=20, grad_clip=1.0, minutes=opts.minutes, max_steps=opts.max_steps)

    def loss_of_batch(batch):
        loss = _loss(draft, *batch, opts.label_fraction, generator)
        return loss, round(loss.item(), 4)

    stream = batches(lambda: rng.sample(train, opts.batch), lambda seqs: _batch(seqs, pad), torch.device("cpu"))

    def save(path: Path) -> None:
        atomic_write(path, lambda tmp: save_file({k: v.half().contiguous() for k, v in draft_own_state(draft).items()},
                                                 str(tmp)))

    step, spent, losses, _ = fit(draft, loss_of_batch, stream, recipe, ckpt, rng, lambda: draft_own_state(draft),
                              resume=opts.resume, desc=f"draft {opts.layers}L",
                              postfix=lambda history: {"loss": f"{np.mean(history[-20:]):.3f}"},
                              snapshot=lambda n: save(snapshot_path(out, n)), snapshot_every=opts.snapshot_every)
    save(out)
    regen_manifest = REGEN_DIR / "manifest.json"
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    write_json(out.with_suffix(".json"), {
        **provenance(out, git_commit()),
        "architecture": f"LlamaForCausalLM, {opts.layers} decoder layer(s) initialised from the target's "
                        f"first {opts.layers}; embedding and LM head shared with the target and frozen; stored in fp16",
        "objective": "cross-entropy on the target's greedy response tokens (top-1 distillation)",
        "data": {"file": regen.get("artifact"), "train_response_tokens": regen.get("train", {}).get("response_tokens"),
                 "heldout_prompts": len(heldout)},
        "optimiser": recipe.recorded(batch_sequences=opts.batch, label_fraction=opts.label_fraction, max_len=MAX_LEN),
        "budget_minutes": opts.minutes, "steps": step, "wall_seconds": round(spent, 1),
        "max_steps": opts.max_steps,
        "loss_first_20": round(float(np.mean(losses[:20])), 4), "loss_last_20": round(float(np.mean(losses[-20:])), 4),
        "heldout_top1_agreement_before": agreement_before,
        "heldout_top1_agreement": top1_agreement(draft, heldout, pad),
        "options": recorded(opts),
    })
    ckpt.finish()
    return out
