"""The judge head: the target's hidden state at each labelled token (`token_features`), a
logistic-regression probe per layer (`fit_probe`) scored by AUC, the threshold that rejects a
chosen share of wrong tokens, and the head's file under data/judge (`save_judge`, `load_judge`)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from ..artifacts import repo_path, write_json
from ..errors import LabError
from ..paths import DATA_DIR
from ..target.engine import Engine
from ..target.load import TARGET_NAME
from ..verify.lossy import LOGIT_FEATURES, Probe, logit_features
from .labels import Labelled

JUDGE_DIR = DATA_DIR / "judge"

# ---- features and probes ---------------------------------------------------------------------


@torch.inference_mode()
def token_features(target, examples: list[Labelled], layers: list[int]) -> dict:
    """Per labelled answer token: the target's hidden state at each of `layers` (0 the embeddings, N
    the final normed state), `logit_features` from the previous position's logits (and the baselines
    `token_probability` and `entropy`), and its answer's `groups` (the split key) and `sources`."""
    feats = {layer: [] for layer in layers}
    labels, groups, sources, from_logits = [], [], [], []
    for ex in examples:
        engine = Engine(target)
        scored = engine.forward(ex.ids, hidden_layers=tuple(layers))
        rows = [ex.answer_start + i for i, y in enumerate(ex.labels) if y >= 0]
        from_logits.append(logit_features(scored.logits[[r - 1 for r in rows]],
                                          torch.tensor([ex.ids[r] for r in rows])))
        for layer in layers:
            feats[layer].append(scored.hidden[layer][rows].float())
        labels += [y for y in ex.labels if y >= 0]
        groups += [ex.problem] * len(rows)
        sources += [ex.source] * len(rows)
    from_logits = torch.cat(from_logits).cpu()
    return {"features": {layer: torch.cat(f).numpy() for layer, f in feats.items()},
            "logit_features": from_logits.numpy(),
            "labels": labels, "groups": groups, "sources": sources,
            "token_probability": from_logits[:, 0].exp().tolist(), "entropy": from_logits[:, 1].tolist()}


def split_by_problem(groups: list[str], validation: float = 0.3, seed: int = 0) -> tuple[list[int], list[int]]:
    """Row indices of the training and validation problems (never a problem in both)."""
    problems = sorted(set(groups))
    random.Random(seed).shuffle(problems)
    held = set(problems[: max(1, round(validation * len(problems)))])
    train = [i for i, g in enumerate(groups) if g not in held]
    return train, [i for i, g in enumerate(groups) if g in held]


def fit_probe(x, y, layer: int, c: float = 0.1, reads_logits: bool = False) -> Probe:
    """Balanced logistic regression on `x` [n, H] (the logit features appended if `reads_logits`)."""
    from sklearn.linear_model import LogisticRegression
    mean, std = x.mean(0), x.std(0) + 1e-6
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
    model.fit((x - mean) / std, np.asarray(y))
    return Probe(layer, torch.tensor(mean), torch.tensor(std), torch.tensor(model.coef_[0], dtype=torch.float32),
                 float(model.intercept_[0]), reads_logits)


def auc(scores, labels) -> float:
    """ROC AUC of `scores` for telling correct (1) from wrong (0) tokens."""
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(labels, scores))


def threshold_for_recall(scores, labels, recall: float) -> float:
    """The δ at which `recall` of the wrong tokens score at or below it (so the judge rejects them)."""
    wrong = sorted(s for s, y in zip(scores, labels) if y == 0)
    if not wrong:
        raise LabError("no wrong tokens in the validation split: plant more errors")
    return float(wrong[min(len(wrong) - 1, int(recall * len(wrong)))])


# ---- the shipped judge head --------------------------------------------------------------------

def judge_path(name: str = "judge") -> Path:
    """data/judge/NAME.json (the shipped judge head is `judge`)."""
    return JUDGE_DIR / f"{name}.json"


def save_judge(probe: Probe, delta: float, manifest: dict, path: Path = JUDGE_DIR / "judge.json") -> Path:
    """Write the head and its threshold, with the manifest, to `path`; return `path`."""
    write_json(path, {**manifest, "artifact": repo_path(path), "layer": probe.layer,
                      "reads_logits": probe.reads_logits, "delta": delta, "bias": probe.bias,
                      "weight": probe.weight.tolist(), "mean": probe.mean.tolist(), "std": probe.std.tolist()})
    return path


def load_judge(target, path: Path = JUDGE_DIR / "judge.json") -> tuple[Probe, float]:
    """The judge head at `path` and its threshold; LabError if missing or made for another target."""
    if not path.exists():
        raise LabError(f"no judge head at {path}: run `python -m lab train judge`")
    head = json.loads(path.read_text())
    reads_logits = head.get("reads_logits", False)
    width = target.config.hidden_size + len(LOGIT_FEATURES) * reads_logits
    if head.get("target") != TARGET_NAME or len(head["weight"]) != width:
        raise LabError(f"{path} was trained for another target ({head.get('target')}, width {len(head['weight'])}): "
                       "retrain it with `python -m lab train judge`")
    probe = Probe(head["layer"], torch.tensor(head["mean"]), torch.tensor(head["std"]), torch.tensor(head["weight"]),
                  head["bias"], reads_logits)
    return probe, head["delta"]


