"""The one decoding loop, propose -> score -> accept -> commit; every method is this loop with its own
drafter (AR proposes nothing). Prefill scores the prompt without its last token; each cycle feeds
[last token, drafts...] to the target in one forward, so every new token comes from a verification
forward and tau = new tokens / verification forwards (prefill excluded) is exactly 1 for AR.

The loop (`decode_steps`) hands each forward it needs, the target's and its drafter's, to its caller
as a `Request` and resumes with the scores (lab/steps.py): `decode` runs them one at a time, and
`lab.batched.decode_batch` runs those of several sequences together."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Generator

import numpy as np
import torch

from .errors import LabError
from .sampling import RandomStream, Sampling, probabilities
from .steps import run_alone
from .target.engine import Engine, Request, Scored
from .timing import Seconds
from .trees import DraftTree
from .verify.lossless import (
    ChainResult,
    TreeResult,
    argmax_rows,
    verify_chain,
    verify_chain_greedy,
    verify_tree,
    verify_tree_greedy,
)
from .verify.lossy import verify_chain_lossy

KERNELS = ("torch", "triton")


@dataclass
class DecodeResult:
    tokens: list[int] = field(default_factory=list)      # new tokens, up to and including EOS
    origins: list[str] = field(default_factory=list)     # per token: draft | corrected | bonus | target
    cycles: int = 0                                      # verification forwards of the target
    scored_positions: int = 0                            # positions those forwards scored
    accepted_per_cycle: list[int] = field(default_factory=list)
    attempted_by_position: list[int] = field(default_factory=list)  # cycles whose drafts 1..i-1 all passed
    accepted_by_position: list[int] = field(default_factory=list)
    top2_gaps: list[float] = field(default_factory=list)  # greedy only: target's top-2 logit gap per token
    seconds: float = 0.0
    draft_seconds: float = 0.0  # of `seconds`, the time inside the drafter (propose and commit)
    score_seconds: float = 0.0  # of `seconds`, the verification cycles: target forward, acceptance, cache update
    # of `seconds` by phase: prefill, propose, forward (the target's), verify (cycles' rest), commit
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def tau(self) -> float:
        return len(self.tokens) / self.cycles if self.cycles else 0.0


def _count_positions(result: DecodeResult, attempted: int, n: int) -> None:
    """Count one cycle: draft positions 1..attempted were tried, the first n of them accepted."""
    while len(result.attempted_by_position) < attempted:
        result.attempted_by_position.append(0)
        result.accepted_by_position.append(0)
    for i in range(attempted):
        result.attempted_by_position[i] += 1
        result.accepted_by_position[i] += int(i < n)


def resolve_kernel(kernel: str | None, device: torch.device) -> str:
    """`triton` (lab/kernels) by default on a GPU, the `torch` reference otherwise. Raises LabError
    for an unknown kernel, or for triton on a CPU without TRITON_INTERPRET=1."""
    if kernel is None:
        return "triton" if device.type == "cuda" else "torch"
    if kernel not in KERNELS:
        raise LabError(f"unknown kernel {kernel!r}: choose torch or triton")
    if kernel == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise LabError("the triton kernel needs a GPU; on a CPU set TRITON_INTERPRET=1 (slow, for checking only)")
    return kernel


def top2_gaps(logits: torch.Tensor) -> list[float]:
    """Each row's gap between its two largest logits (0 for a tie), as torch.topk(x, 2) gives it."""
    if logits.device.type != "cpu":
        top2 = torch.topk(logits, 2, dim=-1).values
        return (top2[:, 0] - top2[:, 1]).tolist()
    a = logits.detach().float().numpy()
    rows, best = np.arange(len(a)), a.argmax(-1)
    rest = a.copy()
    rest[rows, best] = -np.inf
    return (a[rows, best] - rest.max(-1)).tolist()


def _uniforms(n: int, sampling: Sampling, rng: RandomStream) -> torch.Tensor | None:
    """One verification's uniform draws (None when greedy), kept in its `Cycle` to explain it."""
    return None if sampling.greedy else rng.uniforms(n)


def _verify(kernel: str, drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor, sampling: Sampling,
            uniforms: torch.Tensor | None, rng: RandomStream) -> ChainResult:
    """One chain verification by the reference or the Triton kernel: same inputs, same bits."""
    if kernel == "torch":
        logits = logits.cpu()
        if sampling.greedy:
            return verify_chain_greedy(drafts, argmax_rows(logits))
        p = probabilities(logits, sampling)
        return verify_chain(drafts, q, p, uniforms, rng.exponential(p.shape[-1]))
    from .kernels import verify_chain_batched, verify_chain_greedy_batched
    device = logits.device
    d = torch.tensor([drafts], dtype=torch.long, device=device).reshape(1, len(drafts))
    if sampling.greedy:
        n, tokens = verify_chain_greedy_batched(d, logits.float()[None].contiguous())
    else:
        p = probabilities(logits, sampling)
        u, noise = uniforms.to(device), rng.exponential(p.shape[-1]).to(device)
        n, tokens = verify_chain_batched(d, None if q is None else q[None].to(device).contiguous(),
                                         p[None].contiguous(), u[None], noise[None])
    n0 = int(n[0])
    return ChainResult(n0, tokens[0, : n0 + 1].tolist())


def _verify_tree(kernel: str, tree: DraftTree, logits: torch.Tensor, sampling: Sampling,
                 uniforms: torch.Tensor | None, rng: RandomStream) -> TreeResult:
    """One tree verification, by the reference or by the Triton kernel."""
    if kernel == "torch":
        logits = logits.cpu()
        if sampling.greedy:
            return verify_tree_greedy(tree.tokens, tree.parents, argmax_rows(logits))
        p = probabilities(logits, sampling)
        return verify_tree(tree.tokens, tree.parents, p, uniforms, rng.exponential(p.shape[-1]))
    from .kernels import verify_tree_batched, verify_tree_greedy_batched
    device = logits.device
    tokens = torch.tensor([tree.tokens], dtype=torch.long, device=device)
    parents = torch.tensor([tree.parents], dtype=torch.long, device=device)
    if sampling.greedy:
        length, path, out = verify_tree_greedy_batched(tokens, parents, logits.float()[None].contiguous())
    else:
        p = probabilities(logits, sampling)[None].contiguous()
        u, noise = uniforms.to(device), rng.exponential(p.shape[-1]).to(device)
        length, path, out = verify_tree_batched(tokens, parents, p, u[None], noise[None])
    m = int(length[0])
    return TreeResult(path[0, :m].tolist(), out[0, :m].tolist())


@dataclass
class Cycle:
    """What one verification cycle produced."""
    logits: torch.Tensor   # the target's logits at every scored position
    tokens: list[int]      # accepted drafts, then the corrected or bonus token
    n_accepted: int
    rows: list[int]        # scored positions the emitted tokens were predicted at
    attempted: int         # draft positions tried (each because the earlier ones passed)
    last: str              # origin of the final token: corrected | bonus | target
    features: torch.Tensor | None  # target features [len(rows), F] for an EAGLE drafter, else None
    uniforms: torch.Tensor | None  # the verification's uniform draws (None: greedy or a lossy rule)


def _features(scored, layers: tuple[int, ...], rows: list[int] | None = None) -> torch.Tensor | None:
    """The drafter's feature layers at the given scored rows, concatenated along the last dim."""
    if not layers:
        return None
    # one layer (EAGLE-1) needs no concatenation: indexing the rows copies them already
    out = scored.hidden[layers[0]] if len(layers) == 1 else torch.cat([scored.hidden[layer] for layer in layers], -1)
    return out.clone() if rows is None else out[rows]


Steps = Generator[Request, Scored, "Cycle | DecodeResult"]  # yields forwards, is sent their scores


def _scored(spent: Seconds, request: Request, phase: str = "forward") -> Generator[Request, Scored, Scored]:
    """Hand `request` to the caller and come back with its scores, the wait counted under `phase`."""
    start = time.perf_counter()
    scored = yield request
    spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - start
    return scored


def _drafting(spent: Seconds, phase: str, drafter, method: str, *args) -> Generator[Request, Scored, object]:
    """The drafter's `method` (propose or commit), its seconds counted under `phase`. A drafter that
    runs forwards of its own writes the method as steps (`propose_steps`, `commit_steps`), whose
    forwards are handed out like the target's, so that `decode_batch` batches them too."""
    start = time.perf_counter()
    try:
        steps = getattr(drafter, f"{method}_steps", None)
        return getattr(drafter, method)(*args) if steps is None else (yield from steps(*args))
    finally:
        spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - start


def _chain_cycle(target: Engine, spent: Seconds, context: list[int], drafts: list[int], q: torch.Tensor | None,
                 kernel: str, sampling: Sampling, rng: RandomStream, layers: tuple[int, ...], rule=None) -> Steps:
    scored = yield from _scored(spent, Request(target, [context[-1]] + drafts,
                                               hidden_layers=layers + (rule.layers if rule else ())))
    logits, uniforms = scored.logits, None
    if rule is not None:  # a lossy acceptance rule (lab/verify/lossy.py): greedy, OR-ed with the target's argmax
        verdict = verify_chain_lossy(drafts, argmax_rows(logits), rule.accepts(drafts, logits, scored.hidden))
    else:
        uniforms = _uniforms(len(drafts), sampling, rng)
        verdict = _verify(kernel, drafts, q, logits, sampling, uniforms, rng)
    n = verdict.n_accepted
    target.crop(len(context) + n)  # keep the last token and the accepted drafts
    last = "target" if not drafts else ("bonus" if n == len(drafts) else "corrected")
    return Cycle(logits, verdict.tokens, n, list(range(n + 1)), min(n + 1, len(drafts)), last,
                 _features(scored, layers, list(range(n + 1))), uniforms)


def _tree_cycle(target: Engine, spent: Seconds, context: list[int], tree: DraftTree, kernel: str,
                sampling: Sampling, rng: RandomStream, layers: tuple[int, ...]) -> Steps:
    scored = yield from _scored(spent, Request(target, tree.tokens, tree.ancestor_mask(),
                                               tree.positions(len(context) - 1), layers))
    # the candidates come first, so the verified tree is a prefix of the scored one, with the same indices
    m = len(tree) if tree.candidates is None else tree.candidates
    verified = tree if m == len(tree) else DraftTree(tree.tokens[:m], tree.parents[:m])
    logits, uniforms = scored.logits, _uniforms(m, sampling, rng)
    verdict = _verify_tree(kernel, verified, logits[:m], sampling, uniforms, rng)
    target.keep(len(context) - 1, verdict.path)  # the root and the accepted nodes
    n = len(verdict.path) - 1
    leaf = verdict.path[-1] not in verified.parents
    last = "target" if m == 1 else ("bonus" if leaf else "corrected")
    return Cycle(logits, verdict.tokens, n, verdict.path, n if leaf else n + 1, last,
                 _features(scored, layers, verdict.path), uniforms)


def decode(target: Engine, drafter, prompt: list[int], max_new_tokens: int, sampling: Sampling,
           draft_len: int, seed: int, eos_id: int | None,
           on_tokens: Callable[[list[int], list[str]], None] | None = None,
           kernel: str | None = None, rule=None,
           on_cycle: Callable[[list[int], DraftTree | tuple, Cycle, list[int], list[str]], None] | None = None
           ) -> DecodeResult:
    """Generate up to `max_new_tokens` after `prompt`, stopping after EOS: `drafter` proposes up to
    `draft_len` tokens a cycle, verified by `kernel` (`resolve_kernel`) or, given a lossy `rule`,
    greedily with it as a second way in (chains only). `on_tokens(tokens, origins)` sees each cycle's
    new tokens, `on_cycle(context, proposal, cycle, tokens, origins)` also how it was scored."""
    return run_alone(decode_steps(target, drafter, prompt, max_new_tokens, sampling, draft_len, seed, eos_id,
                                  on_tokens, kernel, rule, on_cycle))


def decode_steps(target: Engine, drafter, prompt: list[int], max_new_tokens: int, sampling: Sampling,
                 draft_len: int, seed: int, eos_id: int | None,
                 on_tokens: Callable[[list[int], list[str]], None] | None = None,
                 kernel: str | None = None, rule=None,
                 on_cycle: Callable[[list[int], DraftTree | tuple, Cycle, list[int], list[str]], None] | None = None
                 ) -> Steps:
    """`decode` as steps: yields each target forward as a `Request`, is sent its `Scored`, and
    returns the `DecodeResult`; the drafter's own forwards are handed out the same way (`_drafting`).
    The requests name `target`, which the loop also crops and compacts."""
    if not prompt:
        raise ValueError("empty prompt: give at least one token")
    if rule is not None and not sampling.greedy:
        raise LabError(f"{rule.name} verification is defined for greedy decoding: use --temperature 0")
    kernel = resolve_kernel(kernel, target.model.device)
    rng = RandomStream(seed)
    result = DecodeResult()
    start = time.perf_counter()
    target.reset()
    layers = getattr(drafter, "feature_layers", ())  # EAGLE drafters read the target's features
    drafter.begin(prompt)

    spent = Seconds()  # by phase
    if len(prompt) > 1:
        scored = yield from _scored(spent, Request(target, prompt[:-1], hidden_layers=layers, last_only=True),
                                    "prefill")
        yield from _drafting(spent, "commit", drafter, "commit", prompt, _features(scored, layers))
    context = list(prompt)
    while len(result.tokens) < max_new_tokens:
        # the verification forward also yields one token itself, so never draft past the limit
        k = min(draft_len, max_new_tokens - len(result.tokens) - 1)
        proposal = yield from _drafting(spent, "propose", drafter, "propose", context, k, sampling, rng)
        scoring = time.perf_counter()
        if isinstance(proposal, DraftTree):
            if rule is not None:
                raise LabError(f"{rule.name} verification takes chains of drafts, not trees: use a chain drafter")
            cycle = yield from _tree_cycle(target, spent, context, proposal, kernel, sampling, rng, layers)
        else:
            cycle = yield from _chain_cycle(target, spent, context, *proposal, kernel, sampling, rng, layers, rule)
        spent["score"] = spent.get("score", 0.0) + time.perf_counter() - scoring
        n = cycle.n_accepted
        gaps = []
        if sampling.greedy:  # kept to tell numerical ties from bugs when outputs differ
            gaps = top2_gaps(cycle.logits[cycle.rows])
        if hasattr(drafter, "observe"):  # a drafter that learns from the target's outputs at its own nodes
            spent.call("commit", drafter.observe, proposal, cycle.logits)
        yield from _drafting(spent, "commit", drafter, "commit", context + cycle.tokens, cycle.features)
        emitted, origins = cycle.tokens, ["draft"] * n + [cycle.last]
        if eos_id is not None and eos_id in emitted:
            emitted = emitted[: emitted.index(eos_id) + 1]
        emitted = emitted[: max_new_tokens - len(result.tokens)]
        origins = origins[: len(emitted)]
        result.tokens += emitted
        result.origins += origins
        result.top2_gaps += gaps[: len(emitted)]
        result.cycles += 1
        result.scored_positions += len(cycle.logits)
        # drafts accepted after EOS (or past max_new_tokens) are not text: count only emitted ones
        kept = origins.count("draft")
        result.accepted_per_cycle.append(kept)
        _count_positions(result, min(cycle.attempted, len(emitted)), kept)
        if on_cycle:
            on_cycle(context, proposal, cycle, emitted, origins)
        context += emitted
        if on_tokens:
            on_tokens(emitted, origins)
        if eos_id is not None and emitted and emitted[-1] == eos_id:
            break
    result.seconds = time.perf_counter() - start
    score, forward = spent.get("score", 0.0), spent.get("forward", 0.0)
    result.phase_seconds = {"prefill": spent.get("prefill", 0.0), "propose": spent.get("propose", 0.0),
                            "forward": forward, "verify": score - forward, "commit": spent.get("commit", 0.0)}
    result.draft_seconds = result.phase_seconds["propose"] + result.phase_seconds["commit"]
    result.score_seconds = score
    return result
