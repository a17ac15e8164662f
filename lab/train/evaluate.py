"""`python -m lab evaluate NAME`: the one held-out evaluator of every head kind, on the unique
prompts among the first HELDOUT_PROMPTS held-out sequences. A chain rooted at true pair t drafts
token t+1+d at depth d, scored where that is a response token of the uncut sequence, over the
vocabulary the head drafts over. Per depth, with chain counts and Wilson 95% intervals: top-1
agreement, chain acceptance P(depths 1..d right), and n-alpha, right at d among chains right at
1..d-1 (given at least MIN_CHAINS). Reports carry `EVALUATOR_VERSION` to tell evaluators apart."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..artifacts import command_line, git_commit, machine, read_results, repo_path, write_json
from ..data import HELDOUT_PROMPTS, RegenSet, load_regen, unique_heldout
from ..drafters.eagle1 import EagleHead
from ..drafters.eagle3 import Eagle3Head, feature_layers, tap_columns
from ..drafters.heads import load_head
from ..errors import LabError
from ..intervals import wilson
from ..target.load import load_target
from .features import FeatureSet, target_features

EVALUATOR_VERSION = 2
EVAL_DEPTHS = 6
RANKS = 10        # depth-1 accuracy of each of the top RANKS tokens (it shapes static trees)
MIN_CHAINS = 30   # n-alpha is "not measured" where fewer chains were right up to the depth before


def heldout_indices(data: RegenSet, first: int = HELDOUT_PROMPTS) -> list[int]:
    """The evaluation prompts: the unique ones among the first `first` held-out sequences."""
    heldout = [i for i in range(len(data.split)) if data.split[i] == 0][:first]
    return sorted(set(unique_heldout(data)) & set(heldout))


def evaluation_layers(head: EagleHead | Eagle3Head) -> tuple[int, ...]:
    """The target layers to cache for scoring `head`: an EAGLE-1 head's own; for an EAGLE-3 head
    the three fused taps and the top feature (a `taps="top"` head reads the last)."""
    if isinstance(head, Eagle3Head):
        layers = head.config.num_hidden_layers
        return (*feature_layers(layers), layers)
    return head.feature_layers


# ---- each head kind's drafts, by chain root ------------------------------------------------

def unroll_mask(pairs: int, steps: int) -> torch.Tensor:
    """bool [steps*P, steps*P] over blocks 0..steps-1 of P pairs. Block 0 is teacher-forced (causal);
    block s at position i is the s-th self-fed step of the chain rooted at true pair i-s: it sees true
    pairs <= i-s and, in each block 1..s, its one chain member (position i-s+r in block r)."""
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
    """An EAGLE-1 head's predicted features [P, H] (P = T-1 pairs) for one sequence (features [T, F],
    tokens [T]) at draft depth 1..steps: at depth s+1 row i predicts f_{i+1} from its own predictions of
    features i-s+1..i and the true tokens. Rows i < s have no such chain and are meaningless."""
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


@torch.no_grad()
def draft_states(head: EagleHead | Eagle3Head, ids: np.ndarray, feats: np.ndarray,
                 depths: int) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """(states, true features): for each depth s+1, the head's output states [R_s, H] of the
    chains rooted at pairs 0..R_s-1, whose logits draft token root+2+s; for an EAGLE-1 head
    also the target's true feature that each state predicts (its feature drift), else None."""
    tokens = torch.from_numpy(ids).long()
    f = torch.from_numpy(np.asarray(feats, dtype=np.float32))
    if isinstance(head, Eagle3Head):
        columns = tap_columns(head.taps, head.config.hidden_size)
        pairs = len(ids) - 1
        outs = head(f[:-1, columns][None], tokens[1:][None], torch.ones(1, pairs, dtype=torch.bool), depths)
        return [out[0] for out in outs], None
    preds = unrolled_predictions(head, f, tokens, depths)  # row i of depth s+1 belongs to the chain rooted at i-s
    truth = f[1:, -head.body.config.hidden_size:]
    return [p[s:] for s, p in enumerate(preds)], [truth[s:] for s in range(len(preds))]


# ---- the figures ---------------------------------------------------------------------------

class DepthTally:
    """Counts by depth of the module's figures over chains rooted at every position; chain acceptance
    and n-alpha at depth d count only chains that reach depth d (a true conditional frequency)."""

    def __init__(self, depths: int):
        self.top1, self.scored = np.zeros(depths, np.int64), np.zeros(depths, np.int64)
        self.chain, self.reach, self.given = (np.zeros(depths, np.int64) for _ in range(3))

    def add(self, right: torch.Tensor, valid: torch.Tensor) -> None:
        """right, valid: bool [depths, roots], indexed by the chain's root position."""
        self.top1 += (right & valid).sum(1).numpy()
        self.scored += valid.sum(1).numpy()
        for d in range(len(self.top1)):
            reach = valid[: d + 1].all(0)
            earlier = right[:d].all(0) & reach
            self.chain[d] += int((earlier & right[d]).sum())
            self.given[d] += int(earlier.sum())
            self.reach[d] += int(reach.sum())

    def report(self) -> dict:
        return {"top1_by_depth": _series(self.top1, self.scored),
                "chain_acceptance_by_depth": _series(self.chain, self.reach),
                "n_alpha_by_depth": _series(self.chain, self.given, MIN_CHAINS)}


def _series(hits: np.ndarray, chains: np.ndarray, minimum: int = 1) -> dict:
    """Rates by depth with their counts and Wilson intervals; rate and interval None where
    fewer than `minimum` chains stand behind a depth (not measured)."""
    measured = [int(n) >= minimum for n in chains]
    return {"rate": [round(int(h) / int(n), 4) if ok else None for h, n, ok in zip(hits, chains, measured)],
            "hits": [int(h) for h in hits], "chains": [int(n) for n in chains],
            "ci95": [[round(x, 4) for x in wilson(int(h), int(n))] if ok else None
                     for h, n, ok in zip(hits, chains, measured)],
            "measured": measured}


@torch.no_grad()
def evaluate(head: EagleHead | Eagle3Head, data: RegenSet, feats: FeatureSet, indices: list[int],
             depths: int = EVAL_DEPTHS) -> dict:
    """Score `head` on the sequences `indices` of `data` (features from `evaluation_layers`)."""
    tally, rank_hits = DepthTally(depths), np.zeros(RANKS, np.int64)
    drift = np.zeros((2, depths))  # summed cosine and relative L2 of predicted against true features
    vocab = head.vocab if isinstance(head, Eagle3Head) else None
    for i in indices:
        ids, prompt_len = data.ids(i), int(data.prompt_lens[i])
        states, truth = draft_states(head, ids, feats[i], depths)
        roots = len(ids) - 1
        right = torch.zeros(depths, roots, dtype=torch.bool)
        valid = torch.zeros(depths, roots, dtype=torch.bool)
        for s in range(depths):
            root = torch.arange(len(states[s]))
            drafted = root + 2 + s                       # the token the chain's depth s+1 predicts
            ok = (drafted >= prompt_len) & (drafted < len(ids))
            logits = head.logits(states[s][ok]).float()
            guess = logits.argmax(-1) if vocab is None else vocab[logits.argmax(-1)]
            true_tokens = torch.from_numpy(ids[drafted[ok].numpy()]).long()
            right[s, root[ok]], valid[s, root[ok]] = guess == true_tokens, True
            if s == 0:
                top = torch.topk(logits, RANKS, dim=-1).indices
                top = top if vocab is None else vocab[top]
                rank_hits += (top == true_tokens[:, None]).sum(0).numpy()
            if truth is not None:
                predicted, target = states[s][ok].float(), truth[s][ok]
                drift[0, s] += float(F.cosine_similarity(predicted, target, dim=-1).sum())
                drift[1, s] += float(((predicted - target).norm(dim=-1) / target.norm(dim=-1)).sum())
        tally.add(right, valid)
    report = tally.report()
    positions = int(tally.scored[0])
    report = {"evaluator_version": EVALUATOR_VERSION, "sequences": len(indices), "positions": positions,
              "vocabulary": "the target's full vocabulary (its LM head)" if vocab is None else
              f"the head's draft vocabulary of {len(vocab)} tokens (a true token outside it is a miss)",
              **report, "rank_accuracy": [round(int(h) / max(positions, 1), 4) for h in rank_hits]}
    if isinstance(head, EagleHead):
        count = np.maximum(tally.scored, 1)
        report["feature_cosine_by_depth"] = [round(float(x), 4) for x in drift[0] / count]
        report["feature_relative_l2_by_depth"] = [round(float(x), 4) for x in drift[1] / count]
    return report


def heldout_evaluation(head: EagleHead | Eagle3Head, data: RegenSet, feats: FeatureSet,
                       first: int = HELDOUT_PROMPTS) -> dict:
    """`evaluate` on `heldout_indices(data, first)`; LabError if there is no such prompt."""
    began = time.perf_counter()
    indices = heldout_indices(data, first)
    if not indices:
        raise LabError(f"no unique held-out prompt among the first {first}: pass a larger --prompts")
    report = evaluate(head, data, feats, indices)
    return {**report, "prompt_set": f"the unique prompts among the first {first} held-out ones",
            "seconds": round(time.perf_counter() - began, 1)}


# ---- saved heads ---------------------------------------------------------------------------

def evaluate_saved_head(path: Path, target=None, data: RegenSet | None = None, prompts: int = HELDOUT_PROMPTS) -> dict:
    """Score the head saved at `path` on the held-out prompts (the sampled set's if it trained on
    it) and write the report, with command, commit and machine, into its manifest (LabError if none)."""
    manifest_path = path.with_suffix(".json")
    manifest = read_results(manifest_path)
    if manifest is None:
        raise LabError(f"no manifest at {repo_path(manifest_path)}: train the head first")
    target = target if target is not None else load_target()
    head = load_head(target, path=path)
    sampled = manifest["data"].get("answers") == "sampled at T = 1"
    data = data if data is not None else load_regen(sampled)
    scored = data.subset("heldout", prompts)
    feats = target_features(target, scored, evaluation_layers(head), progress=False)
    report = {**heldout_evaluation(head, scored, feats, prompts),
              "answers": "sampled at T = 1" if sampled else "greedy",
              "command": command_line(), "commit": git_commit(), "machine": machine()}
    write_json(manifest_path, {**manifest, "evaluation": report})
    return report
