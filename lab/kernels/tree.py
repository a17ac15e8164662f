"""Batched verification of EAGLE draft trees in Triton, one program per tree, bit for bit
`verify_tree` / `verify_tree_greedy` of lab/verify/lossless.py. Children are one-hot drafts with
distinct tokens, so the remaining mass is one fp32 number (1 minus the rejected siblings' p), and a
full row is read only when every child of a node fails, for one race with those siblings zeroed."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chain import _check, _check_tokens, _race_block, _race_row, _row_argmax


@triton.jit
def _tree_kernel(tok_ptr, par_ptr, p_ptr, u_ptr, noise_ptr, len_out_ptr, path_out_ptr, tok_out_ptr,
                 N: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    arange = tl.arange(0, BLOCK_V)
    node = tl.zeros((), dtype=tl.int64)
    count = 1
    done = 0
    rejected_all = 0
    tl.store(path_out_ptr + b * N, node)
    for _step in range(0, N):
        if done == 0:
            mass = 1.0
            moved = 0
            has_child = 0
            nxt = node
            for j in range(1, N):
                is_child = tl.load(par_ptr + b * N + j).to(tl.int64) == node
                has_child = tl.maximum(has_child, is_child.to(tl.int32))
                if is_child & (moved == 0):
                    x = tl.load(tok_ptr + b * N + j).to(tl.int64)
                    px = tl.load(p_ptr + (b * N + node) * V + x)
                    u = tl.load(u_ptr + b * N + j)
                    if (px > 0.0) & (u * mass < px):
                        moved = 1
                        nxt = tl.full((), j, tl.int64)
                    else:
                        mass = mass - px
            if moved == 1:
                tl.store(path_out_ptr + b * N + count, nxt)
                tl.store(tok_out_ptr + b * N + count - 1, tl.load(tok_ptr + b * N + nxt).to(tl.int64))
                node = nxt
                count += 1
            else:
                done = 1
                rejected_all = has_child
    p_row = p_ptr + (b * N + node) * V
    noise_row = noise_ptr + b * V
    best = -1.0
    best_idx = tl.zeros((), dtype=tl.int64)
    any_positive = 0
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + arange
        mask = offs < V
        w = tl.load(p_row + offs, mask=mask, other=0.0)
        if rejected_all == 1:  # zero every (rejected) child of this node
            for j in range(1, N):
                sibling = tl.load(par_ptr + b * N + j).to(tl.int64) == node
                x = tl.load(tok_ptr + b * N + j).to(tl.int64)
                w = tl.where(sibling & (offs == x), 0.0, w)
        any_positive = tl.maximum(any_positive, tl.max((w > 0.0).to(tl.int32), 0))
        best, best_idx = _race_block(w, noise_row, v0, offs, mask, best, best_idx)
    if any_positive == 0:  # nothing left: race over p itself
        best_idx = _race_row(p_row, noise_row, V, BLOCK_V)
    tl.store(tok_out_ptr + b * N + count - 1, best_idx)
    tl.store(len_out_ptr + b, count)


@triton.jit
def _tree_greedy_kernel(tok_ptr, par_ptr, logits_ptr, len_out_ptr, path_out_ptr, tok_out_ptr,
                        N: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    node = tl.zeros((), dtype=tl.int64)
    count = 1
    done = 0
    tl.store(path_out_ptr + b * N, node)
    for _step in range(0, N):
        if done == 0:
            best_idx = _row_argmax(logits_ptr + (b * N + node) * V, V, BLOCK_V)
            tl.store(tok_out_ptr + b * N + count - 1, best_idx)
            moved = 0
            nxt = node
            for j in range(1, N):
                is_child = tl.load(par_ptr + b * N + j).to(tl.int64) == node
                x = tl.load(tok_ptr + b * N + j).to(tl.int64)
                if is_child & (x == best_idx) & (moved == 0):
                    moved = 1
                    nxt = tl.full((), j, tl.int64)
            if moved == 1:
                tl.store(path_out_ptr + b * N + count, nxt)
                node = nxt
                count += 1
            else:
                done = 1
    tl.store(len_out_ptr + b, count)


def _check_tree(tokens: torch.Tensor, parents: torch.Tensor, rows: torch.Tensor, name: str) -> tuple[int, int, int]:
    _check("tokens", tokens, 2, (torch.int64, torch.int32))
    _check("parents", parents, 2, (torch.int64, torch.int32))
    _check(name, rows, 3, torch.float32)
    b, n = tokens.shape
    if n < 1:  # the kernels write the root's entry unconditionally
        raise ValueError("a tree needs its root: tokens and parents must have at least one node (N >= 1)")
    if parents.shape != (b, n) or rows.shape[:2] != (b, n):
        raise ValueError(f"tree shapes disagree: tokens {tuple(tokens.shape)}, parents {tuple(parents.shape)}, "
                         f"{name} {tuple(rows.shape)} (need [B, N] and [B, N, V])")
    v = rows.shape[-1]
    _check_tokens(tokens[:, 1:], v)
    if n > 1:
        nodes = torch.arange(1, n, device=parents.device)
        if bool(((parents[:, 1:] < 0) | (parents[:, 1:] >= nodes)).any()):
            raise ValueError("parents must come before children: need 0 <= parents[i] < i for every node i > 0")
        key = torch.sort(parents[:, 1:].long() * v + tokens[:, 1:].long(), dim=1).values
        if bool((key[:, 1:] == key[:, :-1]).any()):
            raise ValueError("siblings must carry distinct tokens (deterministic top-k children)")
    return b, n, v


def _outputs(b: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.zeros(b, dtype=torch.int32, device=device),
            torch.full((b, n), -1, dtype=torch.int64, device=device),
            torch.full((b, n), -1, dtype=torch.int64, device=device))


def verify_tree_batched(tokens: torch.Tensor, parents: torch.Tensor, p: torch.Tensor, uniforms: torch.Tensor,
                        noise: torch.Tensor, block_v: int = 1024):
    """tokens, parents [B, N] (node 0 the root, parents first, siblings' tokens distinct: ValueError
    otherwise); p [B, N, V] fp32; uniforms [B, N]; noise [B, V]. Returns (length [B] int32, path
    [B, N] node ids, tokens [B, N]): row i emits tokens[i, :length[i]] (accepted drafts, then the
    residual or bonus token) and accepts nodes path[i, :length[i]] (root first); the rest is -1."""
    b, n, v = _check_tree(tokens, parents, p, "p")
    _check("uniforms", uniforms, 2, torch.float32)
    _check("noise", noise, 2, torch.float32)
    if uniforms.shape != (b, n) or noise.shape != (b, v):
        raise ValueError(f"need uniforms {(b, n)} and noise {(b, v)}, "
                         f"got {tuple(uniforms.shape)}, {tuple(noise.shape)}")
    length, path, out = _outputs(b, n, p.device)
    _tree_kernel[(b,)](tokens, parents, p, uniforms, noise, length, path, out, N=n, V=v, BLOCK_V=block_v)
    return length, path, out


def verify_tree_greedy_batched(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor,
                               block_v: int = 1024):
    """Greedy tree verification; same layout and outputs as `verify_tree_batched`."""
    b, n, v = _check_tree(tokens, parents, logits, "logits")
    length, path, out = _outputs(b, n, logits.device)
    _tree_greedy_kernel[(b,)](tokens, parents, logits, length, path, out, N=n, V=v, BLOCK_V=block_v)
    return length, path, out
