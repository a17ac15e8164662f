"""`python -m lab train eagle1`: train an EAGLE head on the target's features.

Three steps, each resumable:
1. Features: the target runs once over every regenerated sequence and its top feature at
   every position is cached in fp16 under .cache/features/ (chunked, so an interrupted run
   resumes). Training then never runs the 30-layer target, only the one-layer head.
2. Training: pair t = (f_t + noise, x_{t+1}) -> predicted f_{t+1}. Loss = smooth-L1 between
   predicted and true feature (weight 1; 0 for the token-only head) + 0.1 x cross-entropy of
   the draft distribution (frozen LM head on the predicted feature) against the target's
   distribution (LM head on the true feature), on response positions. AdamW, gradient
   clipping, wall-clock budget, periodic checkpoints.
3. Evaluation on the held-out prompts: top-1 agreement with the target at draft depth 1..6,
   where depth d means the head has consumed d-1 of its own predicted features
   (`unrolled_predictions`), plus feature drift (cosine, relative L2) against the truth.
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaForCausalLM

from ..artifacts import atomic_write, command_line, git_commit, machine, repo_path, write_json
from ..eagle import EagleHead, head_path, load_head, save_head
from ..errors import LabError
from ..models import load_target
from ..paths import CACHE_DIR
from .batches import batches, budget_key, resolve_device
from .checkpoint import Checkpoint
from .distill import set_lr
from .regen import RegenSet, load_regen, regen_files, sharegpt_replies, training_items, unique_heldout

MAX_LEN = 320          # tokens per training sequence: the response (<= 160) and as much prompt as fits
CHUNK = 64             # sequences per feature-cache file
NOISE = 0.1            # uniform noise U(-NOISE, NOISE) added to input features during training
CE_WEIGHT = 0.1
EVAL_DEPTHS = 6


# ---- 1. the target's features, cached --------------------------------------------------

@dataclass
class FeatureSet:
    """fp16 features [positions, F] of every sequence of a RegenSet, in the same order, read
    from memory-mapped cache files (CHUNK sequences each), so a cache larger than memory works
    and a training process touches only the sequences it samples."""
    chunks: list[np.ndarray]
    offsets: np.ndarray
    folder: Path | None = None
    compute_seconds: float = 0.0   # what computing the cached chunks cost (as recorded)
    untimed_chunks: int = 0        # chunks written before the cache recorded its timing

    def __getitem__(self, i: int) -> np.ndarray:
        base = self.offsets[i // CHUNK * CHUNK]
        return self.chunks[i // CHUNK][self.offsets[i] - base: self.offsets[i + 1] - base]


def _key(target, data: RegenSet, layers: tuple[int, ...]) -> str:
    """Cache folder name: which data, which target (a fingerprint of its weights), which layers."""
    weights = target.model.layers[-1].mlp.down_proj.weight[:4].detach().float().cpu().numpy().tobytes()
    digest = hashlib.sha1(data.tokens.tobytes() + data.offsets.tobytes() + weights).hexdigest()[:12]
    return f"{digest}_layers{'-'.join(map(str, layers))}"


@torch.inference_mode()
def target_features(target, data: RegenSet, layers: tuple[int, ...], batch: int = 8,
                    progress: bool = True) -> FeatureSet:
    """The target's hidden states (transformers' indexing: N = the normed top feature) at
    every position of every sequence, computed once and cached."""
    folder = CACHE_DIR / "features" / _key(target, data, layers)
    n = len(data.offsets) - 1
    need = int(data.offsets[-1]) * len(layers) * target.config.hidden_size * 2  # fp16 bytes
    missing = need - sum(p.stat().st_size for p in folder.glob("chunk_*.npy")) if folder.exists() else need
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if missing > free:
        raise LabError(f"the feature cache needs {missing / 1e9:.1f} GB more at {folder}, only {free / 1e9:.1f} GB "
                       "are free: free disk space or set LAB_CACHE to a bigger disk")
    if progress:
        print(f"[lab] target features of layers {layers}: {need / 1e9:.2f} GB in {repo_path(folder)}", file=sys.stderr)
    chunks = []
    timing_path = folder / "seconds.json"  # compute seconds per chunk, for the manifests' budgets
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    for c, start in enumerate(tqdm(range(0, n, CHUNK), desc="target features", unit="chunk", disable=not progress)):
        path = folder / f"chunk_{c:05d}.npy"
        if not path.exists():
            began = time.perf_counter()
            members = sorted(range(start, min(start + CHUNK, n)), key=lambda i: data.offsets[i + 1] - data.offsets[i])
            rows = {}
            for b in range(0, len(members), batch):  # similar lengths batched together: little padding
                seqs = [data.ids(i) for i in members[b: b + batch]]
                width = max(len(s) for s in seqs)
                ids = torch.zeros(len(seqs), width, dtype=torch.long)
                mask = torch.zeros(len(seqs), width, dtype=torch.long)
                for r, s in enumerate(seqs):  # right padding: causal attention leaves real positions exact
                    ids[r, : len(s)], mask[r, : len(s)] = torch.from_numpy(s), 1
                out = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                   output_hidden_states=True)
                h = torch.cat([out.hidden_states[layer] for layer in layers], -1).half().cpu().numpy()
                rows.update({i: h[r, : len(s)] for r, (i, s) in enumerate(zip(members[b: b + batch], seqs))})
            rows = [rows[i] for i in sorted(rows)]
            atomic_write(path, lambda tmp, rows=rows: np.save(open(tmp, "wb"), np.concatenate(rows)))
            timing[path.name] = round(time.perf_counter() - began, 2)
            write_json(timing_path, timing)
        chunks.append(np.load(path, mmap_mode="r"))
    return FeatureSet(chunks, data.offsets.astype(np.int64), folder, sum(timing.values()), len(chunks) - len(timing))


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
    head = (load_head(target, variant, init) if init is not None else EagleHead(target, variant)).to(device)
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
             "init": None if init is None else repo_path(init), "sampled": sampled, "train_prompts": train_prompts}  # what a resume must match
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
    report = heldout_report(head, data, feats, heldout)
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
                 "train_response_tokens": sum(int(data.offsets[i + 1] - data.offsets[i]) - p for s, i, p in train if s == 0),
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


# ---- 3. evaluation: drafting deeper on the head's own predictions -------------------------

def unroll_mask(pairs: int, steps: int) -> torch.Tensor:
    """bool [steps*P, steps*P] over blocks 0..steps-1 of P pairs. Block 0 is teacher-forced
    (causal). Block s at position i is the s-th self-fed step of a chain that started after
    true pair i-s: it sees true pairs <= i-s and, in each block 1..s, the one chain member
    on its diagonal (position i-s+r in block r)."""
    n = steps * pairs
    mask = torch.zeros(n, n, dtype=torch.bool)
    idx = torch.arange(pairs)
    mask[:pairs, :pairs] = idx[:, None] >= idx[None, :]
    for s in range(1, steps):
        rows = s * pairs + idx
        mask[rows] = torch.cat([idx[None, :] <= (idx[:, None] - s), torch.zeros(pairs, n - pairs, dtype=torch.bool)], 1)
        for r in range(1, s + 1):
            cols = r * pairs + idx - s + r
            ok = idx - s + r >= 0
            mask[rows[ok], cols[ok]] = True
    return mask


@torch.no_grad()
def unrolled_predictions(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor,
                         steps: int) -> list[torch.Tensor]:
    """For one sequence (features [T, F], tokens [T]): predictions [P, H] (P = T-1 pairs) for
    draft depth 1..steps. At depth s+1, row i predicts f_{i+1} after the head consumed its own
    predictions for features i-s+1 .. i (true tokens throughout: the drafts before it were
    accepted). Rows i < s have no such chain and are meaningless."""
    pairs = len(tokens) - 1
    inputs = [features[:-1]]
    preds: list[torch.Tensor] = []
    for s in range(steps):
        n = s + 1
        mask = unroll_mask(pairs, n)
        float_mask = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
        out = head(torch.cat(inputs)[None], tokens[1:].repeat(n)[None], attention_mask=float_mask[None, None],
                   position_ids=torch.arange(pairs).repeat(n)[None])[0]
        preds.append(out[s * pairs:])
        # the next block's feature at position i is this step's prediction of f_i (from row i-1)
        inputs.append(torch.cat([torch.zeros(1, out.shape[-1]), preds[-1][:-1]]))
    return preds


def heldout_report(head, data: RegenSet, feats: FeatureSet, heldout: list[int], evaluate=None) -> dict:
    """`evaluate` (default `evaluate_head`; `evaluate_eagle3` for EAGLE-3 heads) on the held-out
    prompts, and again on those of them whose prompt ShareGPT holds only once
    (`unique_heldout`), which no training stage can have seen."""
    if not heldout:
        return {}
    evaluate = evaluate or evaluate_head
    unique = sorted(set(unique_heldout(data)) & set(heldout))
    report = evaluate(head, data, feats, heldout)
    report["heldout_unique_prompts"] = {"prompts": len(unique), **({k: v for k, v in evaluate(
        head, data, feats, unique).items() if k != "rank_accuracy"} if unique else {})}
    return report


def evaluate_saved_head(path: Path, target: LlamaForCausalLM | None = None, data: RegenSet | None = None,
                        prompts: int | None = None, split: str = "heldout") -> dict:
    """`python -m lab evaluate NAME`: re-score a saved EAGLE-1 or EAGLE-3 head on the held-out
    prompts its training evaluated and write the figures, with the command and commit that
    produced them, into its manifest under "evaluation" (the training figures stay as they
    were). Only the scored sequences' features are computed (cached), so this takes a minute
    or two on a CPU. `prompts` overrides how many prompts (a head trained with `--eval-prompts
    0` evaluated none). `split="train"` scores the same figures on the first training prompts
    instead, under "evaluation_train": set beside the held-out ones they show how much of a
    head's accuracy is memorised."""
    if split not in ("heldout", "train"):
        raise LabError(f"unknown split {split!r}: choose heldout or train")
    manifest_path = path.with_suffix(".json")
    if not path.exists() or not manifest_path.exists():
        raise LabError(f"no head or manifest at {path}: train it first with `python -m lab train eagle1|eagle3 --name {path.stem}`")
    manifest = json.loads(manifest_path.read_text())
    target = target if target is not None else load_target()
    count = prompts if prompts is not None else manifest["data"]["heldout_prompts_evaluated"]
    if not count:
        raise LabError(f"{path.stem} was trained without a held-out evaluation: give --prompts N (64 is the usual)")
    sampled = manifest["data"].get("answers") == "sampled at T = 1"
    scored = (data if data is not None else load_regen(sampled)).subset(split, count)
    indices = list(range(len(scored.split)))
    if manifest["variant"] == "eagle3":
        from ..eagle3 import load_head as load_eagle3
        from .eagle3 import cached_layers, evaluate_eagle3  # local: train.eagle3 builds on this module
        head, layers, evaluate = load_eagle3(target, path=path), cached_layers(target), evaluate_eagle3
    else:
        head = load_head(target, manifest["variant"], path)
        layers, evaluate = head.feature_layers, evaluate_head
    feats = target_features(target, scored, layers)
    if split == "heldout":
        figures = heldout_report(head, scored, feats, indices, evaluate)
    else:  # the evaluators name their figures for the held-out set; these are not
        figures = {key.removeprefix("heldout_"): value for key, value in evaluate(head, scored, feats, indices).items()}
    report = {"command": command_line(), "commit": git_commit(), "prompts": len(indices), **figures}
    write_json(manifest_path, {**manifest, "evaluation" if split == "heldout" else "evaluation_train": report})
    return report


class ChainTally:
    """Chain acceptance over chains of drafts rooted at each position: P(depths 1..d all
    right), over chains whose every step drafts a response token, and n-alpha: the share of
    chains right at depth d among those right at depths 1..d-1, EAGLE's acceptance at depth d
    given that the earlier drafts were accepted. Both ratios at depth d count only chains
    that reach depth d, so n-alpha is a true conditional frequency (never above 1); dividing
    chain(d) by chain(d-1) instead mixes two sets of chains (those near a sequence's end reach
    only d-1)."""

    def __init__(self, depths: int):
        self.hits, self.count, self.given = np.zeros(depths), np.zeros(depths), np.zeros(depths)

    def add(self, right: torch.Tensor, valid: torch.Tensor) -> None:
        """right, valid: bool [depths, n], indexed by the chain's root position."""
        for d in range(len(self.hits)):
            reach = valid[: d + 1].all(0)
            earlier = right[:d].all(0) & reach
            self.hits[d] += int((earlier & right[d]).sum())
            self.given[d] += int(earlier.sum())
            self.count[d] += int(reach.sum())

    def report(self) -> dict:
        chain = self.hits / np.maximum(self.count, 1)
        return {"heldout_chain_acceptance_by_depth": [round(float(x), 4) for x in chain],
                "heldout_n_alpha": [round(float(h / g), 4) if g else None for h, g in zip(self.hits, self.given)]}


def evaluate_head(head: EagleHead, data: RegenSet, feats: FeatureSet, indices: list[int],
                  depths: int = EVAL_DEPTHS, ranks: int = 10) -> dict:
    """Held-out top-1 agreement with the target's greedy token at depth 1..`depths`, the
    depth-1 accuracy of each rank (for EAGLE-1's static tree), feature drift, and chain
    acceptance (`ChainTally`)."""
    hits, cos, rel, count = np.zeros(depths), np.zeros(depths), np.zeros(depths), np.zeros(depths)
    rank_hits, chains = np.zeros(ranks), ChainTally(depths)
    hidden = head.body.config.hidden_size
    for i in indices:
        ids = torch.from_numpy(data.ids(i))
        f = torch.from_numpy(feats[i].astype(np.float32))
        prompt_len = int(data.prompt_lens[i])
        preds = unrolled_predictions(head, f, ids, depths)
        truth = f[1:, -hidden:]
        pairs = len(preds[0])
        right, valid = torch.zeros(depths, pairs, dtype=torch.bool), torch.zeros(depths, pairs, dtype=torch.bool)
        for s, pred in enumerate(preds):
            rows = torch.arange(len(pred))
            ok = (rows >= s) & (rows + 2 >= prompt_len) & (rows + 2 < len(ids))
            logits = head.logits(pred[ok])
            correct = logits.argmax(-1) == ids[rows[ok] + 2]
            hits[s] += int(correct.sum())
            by_row = torch.zeros(pairs, dtype=torch.bool)
            by_row[rows[ok]] = correct
            right[s, : pairs - s], valid[s, : pairs - s] = by_row[s:], ok[s:]  # row c+s is step s of the chain from c
            cos[s] += float(F.cosine_similarity(pred[ok], truth[ok], dim=-1).sum())
            rel[s] += float(((pred[ok] - truth[ok]).norm(dim=-1) / truth[ok].norm(dim=-1)).sum())
            count[s] += int(ok.sum())
            if s == 0:
                top = torch.topk(logits, ranks, dim=-1).indices
                rank_hits += (top == ids[rows[ok] + 2][:, None]).sum(0).numpy()
        chains.add(right, valid)
    count = np.maximum(count, 1)
    return {"heldout_top1_agreement_by_depth": [round(float(x), 4) for x in hits / count],
            "heldout_feature_cosine_by_depth": [round(float(x), 4) for x in cos / count],
            "heldout_feature_relative_l2_by_depth": [round(float(x), 4) for x in rel / count],
            "heldout_positions": int(count[0]),
            "rank_accuracy": [round(float(x), 4) for x in rank_hits / count[0]], **chains.report()}
