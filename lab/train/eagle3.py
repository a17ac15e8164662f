"""`python -m lab train eagle3`: an EAGLE-3 head trained with training-time test.

1. Features: the target's hidden states entering layers 2, 15 and 27 (the head's input) and its
   top feature (whose LM head gives the target's distribution, the label) at every position,
   cached in fp16 by `target_features` (about 4.6 KB per position; the size and folder are
   printed, and a short disk fails before the first chunk).
2. Training-time test: `Eagle3Head.unrolled` runs S draft steps (default 7) at once over every
   chain that has a scored step (`chain_rows`: the response and the S - 1 positions before it;
   the rest of the prompt is only attended to); step s feeds the head's own output state of
   step s-1 and is scored against the target's distribution of token t+2+s restricted to the
   draft vocabulary (renormalised), where that token is a response token and the target's
   argmax lies inside the vocabulary (computed once per sequence: `target_argmax`).
   Loss = sum over steps of 0.8^s x the step's mean soft cross-entropy. AdamW (0.9, 0.95),
   gradient clipping 0.5, warm-up then cosine over the budget, checkpoints, `--resume`.
3. Evaluation on the held-out prompts by the one evaluator of every head kind
   (`lab.train.evaluate`), written into the manifest under "evaluation".

Under `torchrun --nproc_per_node N` the same command trains with DistributedDataParallel (gloo
on a CPU, NCCL on a GPU): every rank draws the same global batch and computes its own share of
it, reading only those sequences' features; the loss is normalised by the global position
counts, so N processes take the steps one process would with the same global batch.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from ..artifacts import command_line, git_commit, machine, repo_path, write_json
from ..eagle3 import Eagle3Head, feature_layers
from ..heads import head_path, load_head, save_head
from ..errors import LabError
from ..models import load_target
from ..paths import CACHE_DIR
from .batches import batches, budget_key, resolve_device
from .checkpoint import Checkpoint
from .distill import set_lr
from .eagle import MAX_LEN
from .evaluate import heldout_evaluation
from .features import FeatureSet, target_features
from ..data import REGEN_DIR, RegenSet, load_regen, sharegpt_replies, training_items

STEPS = 7
STEP_DECAY = 0.8
DRAFT_VOCAB = 8192


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
    """(ids, cached taps [L, 4H], prompt length) -> input features [B, T, 3H] (taps="top":
    the top feature [B, T, H]), tokens [B, T]
    (tokens[:, t] = x_{t+1}), the top feature at t+1 [B, T, H], padding [B, T] and the first
    index whose step-0 prediction (x_{t+2}) is a response token [B]. T = pairs = L - 1."""
    rows = []
    for ids, feats, prompt_len in items:
        cut = max(0, len(ids) - MAX_LEN)
        rows.append((ids[cut:], feats[cut:], max(prompt_len - cut, 2)))
    width = max(len(ids) for ids, _, _ in rows) - 1
    b = len(rows)
    columns = slice(0, 3 * hidden) if taps == "fused" else slice(3 * hidden, 4 * hidden)
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


def step_positions(pad: torch.Tensor, start: torch.Tensor, s: int) -> torch.Tensor:
    """bool [B, T]: indices t whose step-s draft (token x_{t+2+s}) is scored: the token is a
    response token and the target's distribution for it is in the batch."""
    index = torch.arange(pad.shape[1], device=pad.device)
    lengths = pad.sum(1, keepdim=True)
    return (index + s < lengths) & (index + s >= start[:, None])


def chain_rows(pad: torch.Tensor, start: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, W]: the indices t whose chain has at least one scored step, that is some step s < `steps`
    whose label t+s is a response position (t >= start - (steps - 1) and t < the row's length),
    left-aligned, -1 past a row's own. The other chains (most of the prompt) feed nothing that is
    scored, so `ttt_loss` does not run them."""
    lengths = pad.sum(1)
    first = (start - (steps - 1)).clamp(min=0)
    rows = first[:, None] + torch.arange(max(int((lengths - first).max()), 1), device=pad.device)
    return torch.where(rows < lengths[:, None], rows, -1)


def target_argmax(label_top: torch.Tensor, per_row: list[int], target_head: torch.Tensor,
                  memo: dict | None = None) -> torch.Tensor:
    """The target's argmax over its full vocabulary at each label position [N], from the top
    features `label_top` [N, H] (`per_row` of them per sequence). The product with the target's
    49k-row LM head is the largest single cost of a plain (S = 1) step, and a sequence's argmax
    never changes, so with `memo` (a dict the training loop keeps) each distinct sequence's is
    computed once, keyed by its features' bytes: the same features give the same argmax."""
    if memo is None:
        return F.linear(label_top, target_head).argmax(-1)
    parts = label_top.split(per_row)
    keys = [hashlib.blake2b(p.detach().float().cpu().numpy().tobytes(), digest_size=16).digest() for p in parts]
    missing = [i for i, key in enumerate(keys) if key not in memo]
    if missing:
        found = F.linear(torch.cat([parts[i] for i in missing]), target_head).argmax(-1)
        memo.update(zip([keys[i] for i in missing], found.split([per_row[i] for i in missing])))
    return torch.cat([memo[key] for key in keys])


def ttt_loss(head: Eagle3Head, batch, target_head: torch.Tensor, steps: int = STEPS, model=None,
             world: int = 1, feature_weight: float = 0.0,
             argmax_memo: dict | None = None) -> tuple[torch.Tensor, list[float], list[float], list[float]]:
    """(loss, per-step soft cross-entropy, per-step top-1 agreement with the target's argmax,
    per-step feature smooth-L1: empty unless `feature_weight`). `target_head` is the target's LM
    head weight [V, H]; `model` is what to call (the head or its DistributedDataParallel
    wrapper); with `world` > 1 the per-step position counts are summed over ranks, so every
    rank's loss is its share of the global mean. `feature_weight` > 0 adds EAGLE-1's feature
    regression back as an ablation: each step's output state is pulled (smooth-L1, that weight
    against the token loss's 1) towards the target's top feature at its label's position, the
    feature whose LM head gives the distribution the step is scored against. `argmax_memo`:
    see `target_argmax`."""
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
    outs = (head if model is None else model)(features, tokens, pad, steps, rows)
    scored = []  # per step: which chains are scored, and the row of their label
    for s in range(steps):
        label = slot.gather(1, (rows + s).clamp(min=0, max=pad.shape[1] - 1))
        keep = (rows >= 0) & (rows + s < pad.shape[1]) & (label >= 0)
        keep &= in_vocab[label.clamp(min=0)]                          # scored only if its label is in vocabulary
        scored.append((keep, label[keep]))
    counts = torch.stack([k.sum() for k, _ in scored]).float()
    if world > 1:
        dist.all_reduce(counts)
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
        loss = loss + STEP_DECAY ** s * term.sum() / counts[s].clamp(min=1) * world
        ces.append(float(ce.mean().detach()))
        hits.append(float((logp.argmax(-1) == argmax_draft[label]).float().mean()))
    return loss, ces, hits, feats


def ttt_attention_mask(positions: int, steps: int) -> torch.Tensor:
    """bool [steps*T, steps*T]: what `Eagle3Head.unrolled` lets each (step, index) attend to,
    as one explicit mask over all steps' keys (rows and columns ordered step by step). Row
    (s, t) sees step 0's keys 0..t (the true context) and (r, t) for r = 1..s (its own
    chain). Notebook 06 draws it; a test checks the unrolled forward computes exactly this."""
    n = steps * positions
    mask = torch.zeros(n, n, dtype=torch.bool)
    index = torch.arange(positions)
    for s in range(steps):
        rows = s * positions + index
        mask[rows, :positions] = index[:, None] >= index[None, :]
        for r in range(1, s + 1):
            mask[rows, r * positions + index] = True
    return mask


# ---- training -----------------------------------------------------------------------------

def _distributed(device: str | None) -> tuple[int, int, torch.device]:
    """(rank, world size, this process's device); joins the process group when launched by
    torchrun: NCCL for a GPU run, each rank on the GPU its LOCAL_RANK names, gloo on CPUs."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    gpu = (device or "cpu").startswith("cuda")
    chosen = resolve_device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if gpu and world > 1 else device)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)  # NCCL's collectives and barriers use the current device
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if gpu else "gloo")
    return (dist.get_rank(), world, chosen) if world > 1 else (0, 1, chosen)


def train_eagle3(minutes: float = 60.0, steps: int = STEPS, batch: int = 8, lr: float = 1e-3, seed: int = 0,
                 vocab_size: int = DRAFT_VOCAB, replies: int = 0, reply_feature_dtype: str = "float32",
                 init: Path | None = None, resume: bool = False, out: Path | None = None, target=None,
                 data: RegenSet | None = None, max_steps: int | None = None, eval_prompts: int | None = None,
                 train_prompts: int | None = None, taps: str = "fused", bf16_autocast: bool = True,
                 progress: bool = True, device: str | None = None, output_init: str = "random",
                 fc_init: str = "random", freeze_output: bool = False, feature_weight: float = 0.0) -> Path:
    """Train an EAGLE-3 head for `minutes` of wall time (or exactly `max_steps` steps, with the
    cosine schedule over steps) and write it (fp16) with its manifest to `out` (default
    data/eagle/eagle3.safetensors). `replies` and `reply_feature_dtype` add ShareGPT's own
    replies as in `train eagle1`; `train_prompts` trains on the first N regenerated training
    prompts only (the data-scaling runs); `taps="top"` feeds only the top feature (an ablation);
    `init` continues a trained head (same vocabulary and taps). `bf16_autocast` runs the
    matrix products in bfloat16 (fp32 weights and optimiser), faster on CPUs with bfloat16
    support. `device="cuda"` computes the features and trains on a GPU (each rank on its own
    under torchrun); the head is evaluated and saved from the CPU. `eval_prompts=0` skips the
    held-out evaluation (`python -m lab evaluate NAME --prompts 64` adds it later).
    `output_init="target"` starts a new head's final norm and LM head from the target's
    (`Eagle3Head.copy_target_output`); `fc_init="high"` starts its fc as the identity on the
    high tap (`Eagle3Head.pass_high_tap`). `freeze_output` keeps the final norm and LM head as
    they start (for a new head, the target's own: the readout EAGLE-1 shares with the target) and
    trains fc and the layer only. `feature_weight` > 0 adds EAGLE-1's feature regression to
    the token loss (see `ttt_loss`): an ablation, not EAGLE-3's objective."""
    if output_init not in ("random", "target") or fc_init not in ("random", "high"):
        raise LabError(f"unknown --output-init {output_init!r} or --fc-init {fc_init!r}: "
                       "choose random or target, and random or high")
    if init is not None and (output_init, fc_init) != ("random", "random"):
        raise LabError("--output-init and --fc-init start a new head; with --init the head continues "
                       "from its weights: drop one of them")
    if freeze_output and init is None and output_init != "target":
        raise LabError("--freeze-output keeps the readout a new head starts with: add --output-init target "
                       "(a frozen random readout would teach nothing)")
    if fc_init == "high" and taps != "fused":
        raise LabError("--fc-init high needs the fused taps (fc over the low, middle and high layers)")
    if feature_weight < 0:
        raise LabError(f"--feature-loss must be 0 (EAGLE-3's objective) or a positive weight, not {feature_weight}")
    commit = git_commit()
    rank, world, device = _distributed(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    target = (target if target is not None else load_target()).to(device)
    for param in target.parameters():
        param.requires_grad_(False)
    data = data if data is not None else load_regen()
    layers = cached_layers(target)
    extract_seconds = time.perf_counter()
    sources = [data] + ([sharegpt_replies(replies)] if replies else [])
    feature_sets = []
    for s, source in enumerate(sources):
        if rank and world > 1:
            dist.barrier()  # rank 0 builds each cache first; the others then read it
        model = target if s == 0 or reply_feature_dtype == "float32" else load_target(reply_feature_dtype).to(device)
        feature_sets.append(target_features(model, source, layers, progress=progress and rank == 0))
        if not rank and world > 1:
            dist.barrier()
    extract_seconds = time.perf_counter() - extract_seconds
    if init is not None:
        head = load_head(target, path=init)
    else:
        head = Eagle3Head(target, training_vocabulary(sources, vocab_size), taps)
        if output_init == "target":
            head.copy_target_output(target)
        if fc_init == "high":
            head.pass_high_tap()
    if freeze_output:
        for param in (head.norm.weight, head.lm_head.weight):
            param.requires_grad_(False)
    head.to(device)
    init_record = None if init is None else {
        "path": repo_path(init), "manifest": json.loads(init.with_suffix(".json").read_text())
        if init.with_suffix(".json").exists() else None}
    train = training_items(sources, train_prompts)
    heldout = [i for i in range(len(data.split)) if data.split[i] == 0][:eval_prompts]
    params = [p for p in head.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model = head if world == 1 else torch.nn.parallel.DistributedDataParallel(
        head, device_ids=[device] if device.type == "cuda" else None)
    out = out or head_path("eagle3")
    taps = head.taps
    shape = {"hidden": target.config.hidden_size, "draft_vocab": len(head.vocab), "steps": steps, "taps": taps,
             "replies": replies, "reply_feature_dtype": reply_feature_dtype if replies else None,
             "train_prompts": train_prompts, "init": None if init is None else repo_path(init), "world": world,
             "output_init": output_init,
             # only where it is not the default, so that checkpoints from before the option resume
             **({"fc_init": fc_init} if fc_init != "random" else {}),
             **({"freeze_output": True} if freeze_output else {}),
             **({"feature_weight": feature_weight} if feature_weight else {})}
    ckpt = Checkpoint(CACHE_DIR / "checkpoints" / (out.stem + ".pt"), shape)
    state = ckpt.resume(head, optim, rng) if resume else None
    step, spent, history = (state["step"], state["spent"], state["history"]) if state else (0, 0.0, [])
    budget = minutes * 60
    hidden = target.config.hidden_size
    target_head = target.lm_head.weight.detach().float()
    head.train()
    argmax_memo: dict = {}
    stream = batches(lambda: [(sources[s].ids(i), feature_sets[s][i], p)
                              for s, i, p in rng.sample(train, min(batch, len(train)))[rank::world]],
                     lambda items: make_batch(items, hidden, taps), device)
    bar = tqdm(total=max_steps or round(budget), initial=step if max_steps else round(spent), desc="train eagle3",
               unit="step" if max_steps else "s", disable=not progress or rank != 0)
    while (step < max_steps) if max_steps else (spent < budget):
        t0 = time.perf_counter()
        # a step-based schedule when the step count is fixed, so that runs are reproducible
        set_lr(optim, lr, step, *((step, max_steps) if max_steps else (spent, budget)), warmup=50)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
            loss, ces, hits, feats = ttt_loss(head, next(stream), target_head, steps, model, world, feature_weight,
                                              argmax_memo)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optim.step()
        step += 1
        elapsed = torch.tensor([time.perf_counter() - t0], device=device)
        if world > 1:  # every rank must agree on the schedule and on when to stop
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        spent += float(elapsed)
        history.append([round(x, 4) for x in ces + hits + feats])
        recent = np.nanmean(np.array(history[-20:], dtype=float), axis=0)
        bar.n = step if max_steps else round(spent)
        bar.set_postfix(step=step, ce0=f"{recent[0]:.2f}", ce_last=f"{recent[steps - 1]:.2f}",
                        acc0=f"{recent[steps]:.2f}", acc_last=f"{recent[2 * steps - 1]:.2f}")
        if rank == 0:
            ckpt.save_if_due(head.own_state, optim, rng, {"step": step, "spent": spent, "history": history})
    bar.close()
    stream.close()
    head.eval()
    head.cpu()  # the evaluation below, and every user of the head, run on the CPU
    target.cpu()
    if rank == 0:
        save_head(head, out)
        settings = {"steps": steps, "batch": batch, "lr": lr, "minutes": minutes, "max_steps": max_steps,
                    "bf16_autocast": bf16_autocast, "device": str(device), "output_init": output_init,
                    "fc_init": fc_init, "freeze_output": freeze_output, "feature_weight": feature_weight,
                    "train_prompts": train_prompts, "world": world, "reply_feature_dtype": reply_feature_dtype}
        write_json(out.with_suffix(".json"), _manifest(head, out, commit, data, sources, feature_sets, train, heldout,
                                                       init_record, extract_seconds, history, step, spent, settings))
        ckpt.finish()
    if world > 1:
        dist.barrier()
    return out


def _by_step(row: np.ndarray, steps: int) -> dict:
    """A history row (cross-entropies, top-1s, then feature losses where trained with them), by name."""
    names = ("ce_by_step", "top1_by_step", "feature_by_step")
    return {names[i]: [round(float(x), 4) for x in row[i * steps:(i + 1) * steps]]
            for i in range(len(row) // steps)}


def _manifest(head: Eagle3Head, out: Path, commit: str, data: RegenSet, sources: list[RegenSet],
              feature_sets: list[FeatureSet], train: list, heldout: list[int], init_record: dict | None,
              extract_seconds: float, history: list, step: int, spent: float, settings: dict) -> dict:
    steps, max_steps = settings["steps"], settings["max_steps"]
    regen_manifest = REGEN_DIR / "manifest.json"
    regen = json.loads(regen_manifest.read_text()) if regen_manifest.exists() else {}
    response_tokens = sum(len(sources[s].ids(i)) - p for s, i, p in train)
    heldout_tokens = np.concatenate([data.ids(i)[int(data.prompt_lens[i]):] for i in heldout]) if heldout else []
    first = np.nanmean(np.array(history[:20], dtype=float), axis=0)
    last = np.nanmean(np.array(history[-20:], dtype=float), axis=0)
    return {
        "artifact": repo_path(out), "command": command_line(), "commit": commit, "machine": machine(),
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
                          "weight_against_token_loss": settings["feature_weight"]}
                      if settings["feature_weight"] else None,
                      "output_init": "final norm and LM head from the target's" if settings["output_init"] == "target"
                      else "random" if init_record is None else "continued",
                      "output_trained": not settings["freeze_output"],
                      "fc_init": "the identity on the high tap" if settings["fc_init"] == "high"
                      else "random" if init_record is None else "continued"},
        "data": {"file": regen.get("artifact"), "train_sequences": len(train), "train_response_tokens": response_tokens,
                 "train_prompts_limit": settings["train_prompts"],
                 "sharegpt_reply_sequences": len(sources[1].split) if len(sources) > 1 else 0,
                 "sharegpt_reply_feature_dtype": settings["reply_feature_dtype"] if len(sources) > 1 else None,
                 "heldout_prompts_evaluated": len(heldout)},
        "feature_cache": [{"folder": repo_path(f.folder) if f.folder else None,
                           "gigabytes": round(sum(c.nbytes for c in f.chunks) / 1e9, 2),
                           "compute_seconds_recorded": round(f.compute_seconds, 1), "untimed_chunks": f.untimed_chunks}
                          for f in feature_sets],
        "init": init_record,
        "optimiser": {"name": "AdamW", "lr": settings["lr"], "betas": [0.9, 0.95],
                      "batch_sequences": settings["batch"], "max_len": MAX_LEN, "grad_clip": 0.5,
                      "processes": settings["world"], "bf16_autocast": settings["bf16_autocast"],
                      "schedule": f"50-step warm-up, cosine over the {'steps' if max_steps else 'wall-clock budget'}"},
        "budget": {"device": settings["device"], "feature_seconds_this_run": round(extract_seconds, 1),
                   "train_wall_seconds": round(spent, 1),
                   "requested_minutes": None if max_steps else settings["minutes"]},
        budget_key(torch.device(settings["device"])): round(spent / 60, 2),
        "steps": step, "max_steps": max_steps,
        "loss_first_20": _by_step(first, steps), "loss_last_20": _by_step(last, steps),
        **({"evaluation": heldout_evaluation(head, data, feature_sets[0], len(heldout))} if heldout else {}),
    }

