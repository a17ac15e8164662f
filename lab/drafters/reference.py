"""Expert drafts: a known text (a reference answer, a canonical solution) fed as drafts. Judge
Decoding's clearest experiment: good drafts that are not what the target would have written word
for word, which standard verification stops at the first difference and a judge lets through."""
from __future__ import annotations

import torch

from ..sampling import RandomStream, Sampling


class ReferenceDraft:
    """Proposes the next k tokens of `reference` (token ids meant to follow a prompt of `prompt_len`
    tokens), aligned by count: after the target replaces a token, drafting resumes at the next one."""
    name = "reference"

    def __init__(self, prompt_len: int, reference: list[int]):
        self.prompt_len, self.reference = prompt_len, list(reference)

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        done = len(context) - self.prompt_len
        return self.reference[done: done + k], None

    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        pass
