"""Training-time test, the loss of `python -m lab train eagle3`: S draft steps unrolled at once, step s
fed the head's own output state of step s-1 and scored against the target's distribution restricted
to the draft vocabulary (renormalised); loss = sum over steps of STEP_DECAY^s x the step's mean soft
cross-entropy. `ttt_attention_mask` is the unrolled forward's attention as one explicit mask."""
from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from ..drafters.eagle3 import Eagle3Head
from .options import Eagle3Options

STEP_DECAY = 0.8


def step_positions(pad: torch.Tensor, start: torch.Tensor, s: int) -> torch.Tensor:
    """bool [B, T]: indices t whose step-s draft (token x_{t+2+s}) is scored: the token is a
    response token and the target's distribution for it is in the batch."""
    index = torch.arange(pad.shape[1], device=pad.device)
    lengths = pad.sum(1, keepdim=True)
    return (index + s < lengths) & (index + s >= start[:, None])


def chain_rows(pad: torch.Tensor, start: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, W]: the indices t whose chain has a scored step s < `steps`, left-aligned, -1 past a row's
    own; the other chains (most of the prompt) feed nothing scored, so `ttt_loss` does not run them."""
    lengths = pad.sum(1)
    first = (start - (steps - 1)).clamp(min=0)
    rows = first[:, None] + torch.arange(max(int((lengths - first).max()), 1), device=pad.device)
    return torch.where(rows < lengths[:, None], rows, -1)


def target_argmax(label_top: torch.Tensor, per_row: list[int], target_head: torch.Tensor,
                  memo: dict | None = None) -> torch.Tensor:
    """The target's argmax over its full vocabulary at each label position [N], from the top features
    `label_top` [N, H] (`per_row` per sequence). With `memo` (kept by the training loop) each distinct
    sequence's is computed once, keyed by its features' bytes: the full LM head's product is costly."""
    if memo is None:
        return F.linear(label_top, target_head).argmax(-1)
    parts = label_top.split(per_row)
    keys = [hashlib.blake2b(p.detach().float().cpu().numpy().tobytes(), digest_size=16).digest() for p in parts]
    missing = [i for i, key in enumerate(keys) if key not in memo]
    if missing:
        found = F.linear(torch.cat([parts[i] for i in missing]), target_head).argmax(-1)
        memo.update(zip([keys[i] for i in missing], found.split([per_row[i] for i in missing])))
    return torch.cat([memo[key] for key in keys])


def ttt_loss(head: Eagle3Head, batch, target_head: torch.Tensor, steps: int = Eagle3Options.ttt_steps,
             feature_weight: float = 0.0,
             argmax_memo: dict | None = None) -> tuple[torch.Tensor, list[float], list[float], list[float]]:
    """(loss, per-step soft cross-entropy, per-step top-1 agreement with the target's argmax, per-step
    feature smooth-L1: empty unless `feature_weight`, an ablation). `target_head` is the LM head weight
    [V, H]."""
    features, tokens, top, pad, start = batch
    with torch.no_grad():  # the target's distributions, at label positions only (the responses)
        labels = step_positions(pad, start, 0)                       # [B, T]
        slot = torch.full(labels.shape, -1, dtype=torch.long, device=pad.device)
        slot[labels] = torch.arange(int(labels.sum()), device=pad.device)  # label position -> its row below
        label_top = top[labels]                                      # [N, H]
        argmax = target_argmax(label_top, labels.sum(1).tolist(), target_head, argmax_memo)
        in_vocab = torch.isin(argmax, head.vocab)
        p_target = torch.softmax(F.linear(label_top, target_head[head.vocab]).float(), -1)  # restricted, renormalised
        argmax_draft = torch.searchsorted(head.vocab, argmax).clamp(max=len(head.vocab) - 1)
    rows = chain_rows(pad, start, steps)
    outs = head(features, tokens, pad, steps, rows)
    scored = []  # per step: which chains are scored, and the row of their label
    for s in range(steps):
        label = slot.gather(1, (rows + s).clamp(min=0, max=pad.shape[1] - 1))
        keep = (rows >= 0) & (rows + s < pad.shape[1]) & (label >= 0)
        keep &= in_vocab[label.clamp(min=0)]                          # scored only if its label is in vocabulary
        scored.append((keep, label[keep]))
    counts = torch.stack([k.sum() for k, _ in scored]).float()
    loss, ces, hits, feats = outs[0].sum() * 0.0, [], [], []  # zero, but part of the graph even if nothing is scored
    for s, (keep, label) in enumerate(scored):
        if not keep.any():
            ces.append(float("nan"))
            hits.append(float("nan"))
            feats += [float("nan")] if feature_weight else []
            continue
        logp = torch.log_softmax(head.logits(outs[s][keep]).float(), -1)
        ce = -(p_target[label] * logp).sum(-1)
        term = ce
        if feature_weight:
            feature = F.smooth_l1_loss(outs[s][keep].float(), label_top[label], reduction="none").mean(-1)
            term = ce + feature_weight * feature
            feats.append(float(feature.mean().detach()))
        loss = loss + STEP_DECAY ** s * term.sum() / counts[s].clamp(min=1)
        ces.append(float(ce.mean().detach()))
        hits.append(float((logp.argmax(-1) == argmax_draft[label]).float().mean()))
    return loss, ces, hits, feats


def ttt_attention_mask(positions: int, steps: int) -> torch.Tensor:
    """bool [steps*T, steps*T], keys ordered step by step: what `Eagle3Head.unrolled` lets (s, t)
    attend to: step 0's keys 0..t and its chain (r, t), r = 1..s. A test checks the forward keeps it."""
    n = steps * positions
    mask = torch.zeros(n, n, dtype=torch.bool)
    index = torch.arange(positions)
    for s in range(steps):
        rows = s * positions + index
        mask[rows, :positions] = index[:, None] >= index[None, :]
        for r in range(1, s + 1):
            mask[rows, r * positions + index] = True
    return mask
