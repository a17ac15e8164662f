"""Lossy acceptance rules: a draft the target would not have produced may still be accepted. Judge
Decoding ORs greedy verification with a judge head's verdict on each draft token (`JudgeRule`, a
linear `Probe` on the target's hidden state there); the Top-K baseline accepts any draft among the
target's K most likely tokens (`TopKRule`). The output is no longer the target's, so its quality has
to be measured (lab/judge/sweep.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import LabError
from .lossless import ChainResult


def verify_chain_lossy(draft: list[int], target_argmax: list[int], also_accepted: list[bool]) -> ChainResult:
    """Temperature 0 with a second, lossy way in: a draft is accepted if it equals the target's argmax
    or `also_accepted` says so; at the first draft both reject, the target's own token is emitted."""
    if len(target_argmax) != len(draft) + 1 or len(also_accepted) != len(draft):
        raise ValueError(f"need K+1 = {len(draft) + 1} target tokens and K verdicts, got "
                         f"{len(target_argmax)} and {len(also_accepted)}")
    n = 0
    while n < len(draft) and (draft[n] == target_argmax[n] or also_accepted[n]):
        n += 1
    return ChainResult(n, list(draft[:n]) + [int(target_argmax[n])])


# what a judge can read besides the hidden state: the target's own verdict on the token
LOGIT_FEATURES = ("log_probability", "entropy")


def logit_features(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[n, 2]: each token's log-probability under the target's logits [n, V] at the position that
    predicts it, and the entropy of that distribution (the columns of LOGIT_FEATURES)."""
    logp = torch.log_softmax(logits.float(), -1)
    return torch.stack([logp.gather(1, tokens[:, None].to(logp.device))[:, 0], -(logp.exp() * logp).sum(-1)], 1)


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
    """Accept a draft token if the judge's P(correct) > delta, read at the token's own position in the
    same forward: the target's hidden state and, for a head that reads them, its `logit_features`."""

    seen: list[torch.Tensor] | None = None  # a list: each chain's scores are kept (the inspector)

    def __init__(self, probe: Probe, delta: float):
        self.probe, self.delta, self.layers, self.name = probe, delta, (probe.layer,), "judge"

    def scores(self, drafts: list[int], logits: torch.Tensor, hidden: dict) -> torch.Tensor:
        n = len(drafts)
        from_logits = logit_features(logits[:n].cpu(), torch.tensor(drafts)) if self.probe.reads_logits else None
        return self.probe.score(hidden[self.probe.layer][1: n + 1].cpu(), from_logits)

    def accepts(self, drafts: list[int], logits: torch.Tensor, hidden: dict) -> list[bool]:
        scores = self.scores(drafts, logits, hidden)
        if self.seen is not None:
            self.seen.append(scores)
        return (scores > self.delta).tolist()
