"""Judge Decoding (Bachmann et al., ICLR 2025) at the lab's scale: token labels from planted
errors, linear probes on the target's hidden states, a judge head, and the lossy acceptance
rules (judge, and the Top-K baseline).

Standard verification rejects a draft token merely because the target would have said something
else. The paper's observation: the target's own embedding of a token says whether the token is
*wrong* in context, which is a different question. A linear head on that embedding ("correct in
context?") is OR-ed with standard verification; the output is no longer the target's, so quality
has to be measured (lab/sandbox.py, lab/tasks.py).

Labels come from correct answers with one error planted automatically (`label_tokens`): tokens
before the first changed token are correct, the changed token is wrong, what follows is ignored;
and from real draft mismatches whose effect on a checked answer was tried (lab/mining.py).
"""
from __future__ import annotations

import io
import json
import random
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .artifacts import repo_path, write_json
from .engine import Engine
from .errors import LabError
from .models import TARGET_NAME
from .paths import DATA_DIR

JUDGE_DIR = DATA_DIR / "judge"

# ---- planted errors ------------------------------------------------------------------------

FLIPS = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
SWAPS = {"+": "-", "-": "+", "*": "+", "//": "%", "%": "//", "and": "or", "or": "and"}
KEYWORDS = {"True", "False", "None", "return", "for", "in", "if", "else", "elif", "while", "def", "not", "and",
            "or", "is", "lambda", "import", "from", "break", "continue", "pass", "with", "as", "yield", "try",
            "except", "raise", "class", "global", "nonlocal", "assert", "del", "finally"}


@dataclass
class Mutation:
    text: str      # the answer with one error planted
    site: int      # character offset of the change in `text`
    kind: str      # flipped comparison | off-by-one | wrong operator | wrong variable | wrong number


def code_mutations(code: str) -> list[Mutation]:
    """Every single-token error this module plants in Python code: a flipped comparison, an
    integer off by one, a swapped operator, or a name replaced by another name the code uses."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    lines = code.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    names = sorted({t.string for t in tokens if t.type == tokenize.NAME and t.string not in KEYWORDS
                    and not t.string.startswith("__")})
    out = []
    for t in tokens:
        begin, end = starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]
        if t.type == tokenize.OP and t.string in FLIPS:
            options = [(FLIPS[t.string], "flipped comparison")]
        elif (t.type == tokenize.OP or t.string in ("and", "or")) and t.string in SWAPS:
            options = [(SWAPS[t.string], "wrong operator")]
        elif t.type == tokenize.NUMBER and t.string.isdigit():
            options = [(str(int(t.string) + 1), "off-by-one")]
        elif t.type == tokenize.NAME and t.string in names:
            others = [n for n in names if n != t.string]
            options = [(others[begin % len(others)], "wrong variable")] if others else []
        else:
            options = []
        out += [Mutation(code[:begin] + new + code[end:], begin, kind) for new, kind in options]
    return out


def number_mutations(text: str) -> list[Mutation]:
    """A number in prose (a math answer, an intermediate result) changed by one."""
    return [Mutation(text[: m.start()] + str(int(m.group()) + 1) + text[m.end():], m.start(), "wrong number")
            for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", text)]


# ---- token labels ----------------------------------------------------------------------------

@dataclass
class Labelled:
    """One labelled answer tokenised after its prompt: a planted error, or a mined draft token."""
    problem: str            # split key: every answer of a problem goes to the same split, whatever its source
    ids: list[int]          # prompt (chat template) + answer (mutated, or up to the mined draft token)
    answer_start: int       # index in ids of the answer's first token
    labels: list[int]       # per answer token: 1 correct, 0 wrong, -1 ignored
    kind: str = ""
    site_token: int = field(default=-1)  # index (in ids) of the planted error or the mined draft token
    source: str = ""        # where the label came from, for the manifest's per-source counts and AUCs


def label_tokens(tokenizer, prompt_ids: list[int], original: str, mutation: Mutation, problem: str,
                 source: str = "") -> Labelled | None:
    """Tokens of the mutated answer before the first token that differs from the original's
    tokens are correct; that token is the error; the rest is ignored. None if tokenisation hides
    the change (no differing token)."""
    a = tokenizer.encode(original, add_special_tokens=False)
    b = tokenizer.encode(mutation.text, add_special_tokens=False)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        return None
    labels = [1] * first + [0] + [-1] * (len(b) - first - 1)
    start = len(prompt_ids)
    return Labelled(problem, prompt_ids + b, start, labels, mutation.kind, start + first, source)


# ---- features and probes ---------------------------------------------------------------------

# what a judge can read besides the hidden state: the target's own verdict on the token
LOGIT_FEATURES = ("log_probability", "entropy")


def logit_features(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[n, 2]: each token's log-probability under the target's logits [n, V] at the position that
    predicts it, and the entropy of that distribution (the columns of LOGIT_FEATURES)."""
    logp = torch.log_softmax(logits.float(), -1)
    return torch.stack([logp.gather(1, tokens[:, None].to(logp.device))[:, 0], -(logp.exp() * logp).sum(-1)], 1)


@torch.inference_mode()
def token_features(target, examples: list[Labelled], layers: list[int]) -> dict:
    """For every labelled answer token: the target's hidden state at that token's position at each
    of `layers` (transformers' convention: 0 the embeddings, N the final normed state), and
    `logit_features` from the target's logits at the previous position (also split out as the two
    baselines: the token's probability and the entropy there). `groups` (the split key) and
    `sources` name each token's answer."""
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


@dataclass
class Probe:
    """A logistic-regression judge on one layer: P(correct) = sigmoid(w . (x - mean) / std + b),
    where x is the hidden state, followed by the token's `logit_features` if `reads_logits`."""
    layer: int
    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor
    bias: float
    reads_logits: bool = False

    def score(self, hidden: torch.Tensor, from_logits: torch.Tensor | None = None) -> torch.Tensor:
        """P(correct) for hidden states [n, H] (and, for a head that reads them, logit features [n, 2])."""
        if self.reads_logits != (from_logits is not None):
            raise LabError("this judge head reads the token's log-probability and entropy too: pass `logit_features`"
                           if self.reads_logits
                           else "this judge head reads the hidden state only: pass no logit features")
        x = hidden.float() if from_logits is None else torch.cat([hidden.float(), from_logits.float()], 1)
        return torch.sigmoid((x - self.mean) / self.std @ self.weight + self.bias)


def fit_probe(x, y, layer: int, c: float = 0.1, reads_logits: bool = False) -> Probe:
    """Logistic regression with the wrong (rare) class up-weighted (scikit-learn, balanced). `x`
    is [n, H], or [n, H + 2] with the logit features last if `reads_logits`."""
    import numpy as np
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
    """The head (577 numbers for SmolLM2's 576-wide states) and its threshold, with the manifest."""
    write_json(path, {**manifest, "artifact": repo_path(path), "layer": probe.layer,
                      "reads_logits": probe.reads_logits, "delta": delta, "bias": probe.bias,
                      "weight": probe.weight.tolist(), "mean": probe.mean.tolist(), "std": probe.std.tolist()})
    return path


def load_judge(target, path: Path = JUDGE_DIR / "judge.json") -> tuple[Probe, float]:
    """The shipped judge head and its threshold, checked against `target`."""
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


# ---- lossy acceptance rules ------------------------------------------------------------------

class TopKRule:
    """Accept a draft token if it is among the target's top K there (the paper's baseline)."""
    layers: tuple[int, ...] = ()

    def __init__(self, k: int):
        if k < 1:
            raise LabError(f"--verify-top-k must be at least 1, got {k}")
        self.k, self.name = k, f"topk{k}"

    def accepts(self, drafts: list[int], logits: torch.Tensor, hidden: dict) -> list[bool]:
        top = torch.topk(logits[: len(drafts)], self.k, dim=-1).indices
        return [bool((top[i] == d).any()) for i, d in enumerate(drafts)]


class JudgeRule:
    """Accept a draft token if the judge says it is correct in context: P(correct) > delta, from
    the target's hidden state at the token's own position (scored in the same forward) and, for a
    head that reads them, the token's log-probability and the entropy under the target's logits."""

    def __init__(self, probe: Probe, delta: float):
        self.probe, self.delta, self.layers, self.name = probe, delta, (probe.layer,), "judge"

    def scores(self, drafts: list[int], logits: torch.Tensor, hidden: dict) -> torch.Tensor:
        n = len(drafts)
        from_logits = logit_features(logits[:n].cpu(), torch.tensor(drafts)) if self.probe.reads_logits else None
        return self.probe.score(hidden[self.probe.layer][1: n + 1].cpu(), from_logits)

    def accepts(self, drafts: list[int], logits: torch.Tensor, hidden: dict) -> list[bool]:
        return (self.scores(drafts, logits, hidden) > self.delta).tolist()
