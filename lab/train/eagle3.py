"""`python -m lab train eagle3`: an EAGLE-3 head trained with training-time test (`lab.train.ttt`) on
the target's cached states entering layers 2, N/2 and N-3 and its top feature (the label's source)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..artifacts import git_commit, repo_path, write_json
from ..data import REGEN_DIR, RegenSet, load_regen, sharegpt_replies, training_items
from ..drafters.eagle3 import Eagle3Head, feature_layers, tap_columns
from ..drafters.heads import head_path, load_head, save_head
from ..options import recorded
from ..paths import CACHE_DIR
from ..target.load import load_target
from .batches import batches, budget_key, resolve_device
from .checkpoint import Checkpoint
from .eagle import MAX_LEN
from .evaluate import heldout_evaluation, heldout_indices
from .features import FeatureSet, source_features
from .loop import Recipe, converged, fit, provenance, seeded, snapshot_path, started_from
from .options import Eagle3Options
from .ttt import STEP_DECAY, ttt_loss

VALIDATION_SEQUENCES = 16  # held-out sequences whose loss `--heldout-every` tracks


def cached_layers(target) -> tuple[int, ...]:
    """The cached layers: the head's three inputs, then the top feature (the label's source)."""
    return (*feature_layers(target.config.num_hidden_layers), target.config.num_hidden_layers)


def training_vocabulary(sources: list[RegenSet], size: int) -> torch.Tensor:
    """The `size` most frequent target tokens among the training responses (ties to the lower
    id), sorted by id: the head's draft vocabulary."""
    counts = np.zeros(65536, np.int64)
    for data in sources:
        for ids, prompt_len in data.sequences("train"):
            counts += np.bincount(ids[prompt_len:], minlength=65536)
    order = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(order)).long()


def make_batch(items: list[tuple[np.ndarray, np.ndarray, int]], hidden: int, taps: str = "fused"):
    """(ids, cached taps [L, 4H], prompt length) -> input features [B, T, 3H] ([B, T, H] for
    taps="top"), tokens [B, T] (tokens[:, t] = x_{t+1}), the top feature at t+1 [B, T, H], padding
    [B, T] and the first index whose step-0 prediction x_{t+2} is a response token [B]; T = L - 1."""
    rows = []
    for ids, feats, prompt_len in items:
        cut = max(0, len(ids) - MAX_LEN)
        rows.append((ids[cut:], feats[cut:], max(prompt_len - cut, 2)))
    width = max(len(ids) for ids, _, _ in rows) - 1
    b = len(rows)
    columns = tap_columns(taps, hidden)
    features = torch.zeros(b, width, columns.stop - columns.start)
    top = torch.zeros(b, width, hidden)
    tokens = torch.zeros(b, width, dtype=torch.long)
    pad = torch.zeros(b, width, dtype=torch.bool)
    start = torch.zeros(b, dtype=torch.long)
    for r, (ids, feats, prompt_len) in enumerate(rows):
        f = torch.from_numpy(np.asarray(feats, dtype=np.float32))
        p = len(ids) - 1
        features[r, :p], top[r, :p] = f[:-1, columns], f[1:, 3 * hidden:]
        tokens[r, :p], pad[r, :p], start[r] = torch.from_numpy(ids[1:]), True, prompt_len - 2
    return features, tokens, top, pad, start


# ---- training -----------------------------------------------------------------------------

def train_eagle3(opts: Eagle3Options, target=None, data: RegenSet | None = None, out: Path | None = None,
                 progress: bool = True) -> Path:
    """Train an EAGLE-3 head as `opts` (`Eagle3Options`) say for `opts.minutes` or `opts.max_steps`
    steps and write it (fp16) with its manifest to `out` (default data/eagle/NAME.safetensors, NAME
    `opts.name` or eagle3)."""
    commit = git_commit()
    device = resolve_device(opts.device)
    rng = seeded(opts.seed)[0]
    target = (target if target is not None else load_target()).to(device)
    target.requires_grad_(False)
    data = data if data is not None else load_regen()
    extract_seconds = time.perf_counter()
    sources = [data] + ([sharegpt_replies(opts.replies)] if opts.replies else [])
    feature_sets = source_features(target, sources, cached_layers(target), opts.reply_feature_dtype, progress)
    extract_seconds = time.perf_counter() - extract_seconds
    init = head_path(opts.init) if opts.init else None
    head = (load_head(target, path=init) if init is not None
            else Eagle3Head(target, training_vocabulary(sources, opts.draft_vocab), opts.taps)).to(device)
    init_record = started_from(init)
    train = training_items(sources, opts.train_prompts)
    heldout = [i for i in range(len(data.split)) if data.split[i] == 0][:opts.eval_prompts]
    out = out or head_path(opts.name or "eagle3")
    steps = opts.ttt_steps
    shape = {"hidden": target.config.hidden_size, "draft_vocab": len(head.vocab), "steps": steps, "taps": head.taps,
             "replies": opts.replies, "reply_feature_dtype": opts.reply_feature_dtype if opts.replies else None,
             "train_prompts": opts.train_prompts, "init": None if init is None else repo_path(init),
             **({"feature_weight": opts.feature_loss} if opts.feature_loss else {})}
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"), shape)
    recipe = Recipe(opts.lr, warmup=50, grad_clip=0.5, minutes=opts.minutes, max_steps=opts.max_steps)
    target_head = target.lm_head.weight.detach().float()
    argmax_memo: dict = {}

    def loss_of_batch(batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not opts.fp32):
            loss, ces, hits, feats = ttt_loss(head, batch, target_head, steps, opts.feature_loss,
                                              argmax_memo)
        return loss, [round(x, 4) for x in ces + hits + feats]

    def postfix(history: list) -> dict:
        recent = np.nanmean(np.array(history[-20:], dtype=float), axis=0)
        return {"ce0": f"{recent[0]:.2f}", "ce_last": f"{recent[steps - 1]:.2f}", "acc0": f"{recent[steps]:.2f}",
                "acc_last": f"{recent[2 * steps - 1]:.2f}"}

    validation_batch = make_batch([(data.ids(i), feature_sets[0][i], int(data.prompt_lens[i]))
                                   for i in heldout_indices(data)[:VALIDATION_SEQUENCES]],
                                  target.config.hidden_size, head.taps) if opts.heldout_every else None

    def validate() -> float:
        batch = tuple(x.to(device) for x in validation_batch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not opts.fp32):
            return float(ttt_loss(head, batch, target_head, steps, opts.feature_loss, argmax_memo)[0])

    stream = batches(lambda: [(sources[s].ids(i), feature_sets[s][i], p)
                              for s, i, p in rng.sample(train, min(opts.batch, len(train)))],
                     lambda items: make_batch(items, target.config.hidden_size, head.taps), device)
    step, spent, history, validation = fit(
        head, loss_of_batch, stream, recipe, ckpt, rng, head.own_state, resume=opts.resume, desc="train eagle3",
        postfix=postfix, show=progress, validate=validate if opts.heldout_every else None,
        validate_every=opts.heldout_every, snapshot=lambda n: save_head(head, snapshot_path(out, n)),
        snapshot_every=opts.snapshot_every)
    head.cpu()  # the evaluation below, and every user of the head, run on the CPU
    target.cpu()
    save_head(head, out)
    run = {"commit": commit, "device": str(device), "extract_seconds": extract_seconds,
           "steps": step, "spent": spent, "history": history, "validation": validation}
    write_json(out.with_suffix(".json"), _manifest(head, out, opts, recipe, data, sources, feature_sets, train,
                                                   heldout, init_record, run))
    ckpt.finish()
    return out


def _by_step(row: np.ndarray, steps: int) -> dict:
    """A history row (cross-entropies, top-1s, then feature losses where trained with them), by name."""
    names = ("ce_by_step", "top1_by_step", "feature_by_step")
    return {names[i]: [round(float(x), 4) for x in row[i * steps:(i + 1) * steps]]
            for i in range(len(row) // steps)}


def _manifest(head: Eagle3Head, out: Path, opts: Eagle3Options, recipe: Recipe, data: RegenSet,
              sources: list[RegenSet], feature_sets: list[FeatureSet], train: list, heldout: list[int],
              init_record: dict | None, run: dict) -> dict:
    """What the run made, from what and how (the manifest beside the head)."""
    steps, history = opts.ttt_steps, run["history"]
    regen_manifest = REGEN_DIR / "manifest.json"
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    response_tokens = sum(len(sources[s].ids(i)) - p for s, i, p in train)
    heldout_tokens = np.concatenate([data.ids(i)[int(data.prompt_lens[i]):] for i in heldout]) if heldout else []
    first = np.nanmean(np.array(history[:20], dtype=float), axis=0)
    last = np.nanmean(np.array(history[-20:], dtype=float), axis=0)
    return {
        **provenance(out, run["commit"]),
        "variant": "eagle3", "taps": head.taps, "feature_layers": list(head.feature_layers),
        "architecture": "fc (3H -> H, no bias) over the states entering layers 2, N/2, N-3; one decoder layer on "
                        "[norm(token embedding), norm(state)] with the state on the residual; final norm; own LM "
                        "head over the draft vocabulary; the target's embedding shared and frozen; stored in fp16",
        "draft_vocab": {"size": len(head.vocab), "source": "most frequent tokens of the training responses",
                        "heldout_response_coverage": round(float(np.isin(heldout_tokens, head.vocab.numpy()).mean()), 4)
                        if len(heldout_tokens) else None},
        "objective": {"training_time_test_steps": steps, "step_weight": f"{STEP_DECAY}^s",
                      "loss": "soft cross-entropy against the target's distribution restricted to the draft "
                              "vocabulary (renormalised), masked where the target's argmax is outside it",
                      "feature_regression": {
                          "loss": "smooth-L1 between each step's output state and the target's top feature at its "
                                  "label's position (an ablation: EAGLE-3 has none)",
                          "weight_against_token_loss": opts.feature_loss}
                      if opts.feature_loss else None},
        "data": {"file": regen.get("artifact"), "train_sequences": len(train), "train_response_tokens": response_tokens,
                 "train_prompts_limit": opts.train_prompts,
                 "sharegpt_reply_sequences": len(sources[1].split) if len(sources) > 1 else 0,
                 "sharegpt_reply_feature_dtype": opts.reply_feature_dtype if len(sources) > 1 else None,
                 "heldout_prompts_evaluated": len(heldout)},
        "feature_cache": [{"folder": repo_path(f.folder) if f.folder else None,
                           "gigabytes": round(sum(c.nbytes for c in f.chunks) / 1e9, 2),
                           "compute_seconds_recorded": round(f.compute_seconds, 1), "untimed_chunks": f.untimed_chunks}
                          for f in feature_sets],
        "init": init_record,
        "optimiser": recipe.recorded(batch_sequences=opts.batch, max_len=MAX_LEN, bf16_autocast=not opts.fp32),
        "budget": {"device": run["device"], "feature_seconds_this_run": round(run["extract_seconds"], 1),
                   "train_wall_seconds": round(run["spent"], 1),
                   "requested_minutes": None if opts.max_steps else opts.minutes},
        budget_key(torch.device(run["device"])): round(run["spent"] / 60, 2),
        "steps": run["steps"], "max_steps": opts.max_steps,
        "loss_first_20": _by_step(first, steps), "loss_last_20": _by_step(last, steps),
        **({"validation_loss": {"sequences": VALIDATION_SEQUENCES, "every": opts.heldout_every,
                                "loss": "the training loss (this run's S and weights) on held-out sequences",
                                "curve": run["validation"], **converged(run["validation"])}}
           if run["validation"] else {}),
        **({"evaluation": heldout_evaluation(head, data, feature_sets[0], len(heldout))} if heldout else {}),
        "options": recorded(opts),
    }

