"""Several sequences decoded at once (`decode_batch`): the one loop of lab/decode.py for each
sequence, as steps, with the forwards they wait for run together, one batched forward of the exact
engine per model and round. Each sequence keeps its own caches, drafter, accepted length, random
stream and stopping point, so its tokens are the ones it gets alone."""
from __future__ import annotations

import time

from .decode import DecodeResult, decode_steps
from .errors import LabError
from .sampling import Sampling
from .target.engine import Request, Scored
from .target.exact import ExactEngine, forward_batch


def decode_batch(targets: list, drafters: list, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 draft_len: int, seeds: list[int], eos_id: int | None, kernel: str | None = None
                 ) -> list[DecodeResult]:
    """`decode` of several prompts at once on the exact engine: each prompt has its own engine
    (`targets`, one model), drafter and random stream (its seed in `seeds`). Each round runs the
    forwards the unfinished sequences wait for, one batched forward (`lab.target.exact.forward_batch`)
    per model: the drafters' first, and the target's once every sequence waits for it, so that one
    target forward scores the whole batch each cycle and a sequence leaves the batch when it stops.
    A drafter forward that is not on an exact engine (an EAGLE-3 head computes its own) runs alone.
    Each result's `seconds` runs from the batch's start to that sequence's last token; its phase
    seconds count the batch's shared forwards whole."""
    if not all(isinstance(t, ExactEngine) for t in targets):
        raise LabError("batched decoding runs on an exact engine: use --dtype bfloat16 or q4_1")
    if not (len(targets) == len(drafters) == len(prompts) == len(seeds)):
        raise ValueError("decode_batch takes one engine, one drafter and one seed per prompt")
    if len({id(d) for d in drafters}) != len(drafters) or len({id(t) for t in targets}) != len(targets):
        raise ValueError("decode_batch takes a drafter and an engine of its own for each prompt")
    start = time.perf_counter()
    steps = [decode_steps(t, d, p, max_new_tokens, sampling, draft_len, seed, eos_id, kernel=kernel)
             for t, d, p, seed in zip(targets, drafters, prompts, seeds)]
    results: dict[int, DecodeResult] = {}
    pending: dict[int, Request] = {}

    def resume(i: int, scored: Scored | None) -> None:
        try:
            pending[i] = next(steps[i]) if scored is None else steps[i].send(scored)
        except StopIteration as done:
            pending.pop(i, None)
            results[i] = done.value
            results[i].seconds = time.perf_counter() - start

    for i in range(len(steps)):
        resume(i, None)
    while pending:
        drafting = [i for i, r in pending.items() if r.engine is not targets[i]]
        groups: dict[tuple, list[int]] = {}
        for i in drafting or list(pending):
            r = pending[i]
            model = r.engine.w if isinstance(r.engine, ExactEngine) else ("alone", i)
            groups.setdefault((model, r.hidden_layers, r.logits), []).append(i)
        for (model, _, _), group in groups.items():
            requests = [pending[i] for i in group]
            scores = [requests[0].run()] if isinstance(model, tuple) else forward_batch(requests)
            for i, scored in zip(group, scores):
                resume(i, scored)
    return [results[i] for i in range(len(steps))]
