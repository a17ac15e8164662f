"""Reference verification rules: the readable definition every kernel must match bit for bit. All
randomness comes in as explicit tensors. `uniforms[i]` decides draft i: accept x iff q(x) > 0 and
u*q(x) < p(x), min(1, p/q) without a division, strict so that u = 0 never accepts a token the target
gives zero probability. `noise` (Exp(1), one per vocabulary entry) drives the one extra draw per
cycle (a residual token after a rejection, a bonus after full acceptance) by an exponential race:
argmax_v w(v)/E(v) picks v with probability w(v)/sum(w), so the residual is never normalised."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ChainResult:
    n_accepted: int        # drafts accepted, 0..K
    tokens: list[int]      # accepted drafts followed by one corrected or bonus token


def argmax_rows(x: torch.Tensor) -> list[int]:
    """The index of each row's first maximum (x [n, V]), torch.argmax's rule; on the CPU numpy's
    argmax, which keeps the rule and is faster there."""
    if x.device.type != "cpu":
        return x.argmax(-1).tolist()
    return np.argmax(x.detach().float().numpy(), axis=-1).tolist()


def race(weights: torch.Tensor, noise: torch.Tensor) -> int:
    """A sample of weights/sum(weights) given Exp(1) noise: argmax of weights/noise, first on ties."""
    return argmax_rows((weights / noise)[None])[0]


def _check_rows(name: str, t: torch.Tensor) -> None:
    if torch.isnan(t).any():
        raise ValueError(f"NaN in {name}: a probability row is invalid; check the logits that produced it")


def verify_chain_greedy(draft: list[int], target_argmax: list[int]) -> ChainResult:
    """Temperature 0: accept drafts while they equal the target's argmax; then emit the
    target's own token (a correction, or the bonus when all K drafts matched)."""
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(f"need K+1 = {len(draft) + 1} target tokens, got {len(target_argmax)}")
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return ChainResult(n, list(draft[:n]) + [int(target_argmax[n])])


def verify_chain(draft: list[int], q: torch.Tensor | None, p: torch.Tensor,
                 uniforms: torch.Tensor, noise: torch.Tensor) -> ChainResult:
    """Stochastic chain verification (Leviathan et al.; Chen et al.). draft [K] token ids; q [K, V]
    the probabilities the drafts were sampled from, or None for one-hot drafts (q(x) = 1); p [K+1, V]
    the target's (row K: the bonus distribution); uniforms [K]; noise [V] Exp(1). Raises ValueError
    for shapes that disagree or a NaN."""
    k = len(draft)
    if p.shape[0] != k + 1 or uniforms.shape[0] < k or noise.shape[-1] != p.shape[-1]:
        raise ValueError(f"shapes disagree: K={k}, p {tuple(p.shape)}, uniforms {tuple(uniforms.shape)}, "
                         f"noise {tuple(noise.shape)}")
    _check_rows("p", p)
    if q is not None:
        _check_rows("q", q)
    for i, x in enumerate(draft):
        qx = 1.0 if q is None else q[i, x]
        if qx > 0 and uniforms[i] * qx < p[i, x]:
            continue
        # rejected: draw from the residual max(0, p - q), never normalised
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = torch.clamp(p[i] - q[i], min=0.0)
        if not bool((residual > 0).any()):  # p == q (or p concentrated on x): fall back to p
            residual = p[i]
        return ChainResult(i, list(draft[:i]) + [race(residual, noise)])
    return ChainResult(k, list(draft) + [race(p[k], noise)])


@dataclass(frozen=True)
class TreeResult:
    path: list[int]        # accepted node indices, root (node 0) first
    tokens: list[int]      # tokens of the accepted non-root nodes, then one residual or bonus token


def children_of(parents: list[int]) -> list[list[int]]:
    """Children of every node in node order (the drafter's top-k order)."""
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    return children


def verify_tree_greedy(tokens: list[int], parents: list[int], target_argmax: list[int]) -> TreeResult:
    """Temperature 0 on a draft tree: from the root, follow the child whose token is the
    target's argmax at the current node; emit the target's argmax at the last node reached."""
    children, node, path = children_of(parents), 0, [0]
    while True:
        nxt = next((c for c in children[node] if tokens[c] == target_argmax[node]), None)
        if nxt is None:
            return TreeResult(path, [tokens[i] for i in path[1:]] + [int(target_argmax[node])])
        node = nxt
        path.append(node)


def verify_tree(tokens: list[int], parents: list[int], p: torch.Tensor, uniforms: torch.Tensor,
                noise: torch.Tensor) -> TreeResult:
    """Stochastic verification of a tree of deterministic (top-k, one-hot) drafts, EAGLE's rule.
    Node 0 is the root (the last committed token), siblings carry distinct tokens; p [N, V] is the
    target's distribution after each node, uniforms [N] one per node (used when it is tried), noise
    [V] Exp(1). A node's children are tried in order: x is accepted iff p'(x) > 0 and u * mass <
    p'(x), p' being p with the rejected siblings zeroed and mass 1 minus their probability. If all
    fail, the token is raced from p' (p if p' is all zero); after an accepted leaf, from p. Raises
    ValueError as `verify_chain` does."""
    if p.shape[0] != len(tokens) or len(parents) != len(tokens) or uniforms.shape[0] < len(tokens):
        raise ValueError(f"tree of {len(tokens)} nodes needs p [N, V], parents [N], uniforms [N]; got "
                         f"p {tuple(p.shape)}, {len(parents)} parents, uniforms {tuple(uniforms.shape)}")
    _check_rows("p", p)
    children, node, path = children_of(parents), 0, [0]
    while children[node]:
        remaining, mass = p[node].clone(), torch.tensor(1.0)
        for child in children[node]:
            x = tokens[child]
            # remaining[x] > 0 first: after float subtractions the mass can end a hair below
            # zero, and u * mass < 0 would then accept a token the target never emits
            if remaining[x] > 0 and uniforms[child] * mass < remaining[x]:
                node = child
                path.append(node)
                break
            mass = mass - remaining[x]
            remaining[x] = 0.0
        else:  # every child rejected: draw from what is left
            weights = remaining if bool((remaining > 0).any()) else p[node]
            return TreeResult(path, [tokens[i] for i in path[1:]] + [race(weights, noise)])
    return TreeResult(path, [tokens[i] for i in path[1:]] + [race(p[node], noise)])
