"""Batched chain verification in Triton, one program per row (sequence), bit for bit the rules of
lab/verify/lossless.py. Stochastic (`verify_chain`): the test u*q(x) < p(x) is a multiply (Triton's
fp32 division is approximate on GPUs); only p and q at the drafted tokens are read up to the deciding
position, where one exponential race runs over the vocabulary block by block, unnormalised, dividing
round-to-nearest (div_rn) as torch does, ties to the lowest id. Greedy (`verify_chain_greedy`): each
target row's argmax, computed only while the drafts keep matching."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _race_block(w, noise_ptr, v0, offs, mask, best, best_idx):
    """Fold one vocabulary block into the running (best score, best index) of a race."""
    e = tl.load(noise_ptr + offs, mask=mask, other=1.0)
    score = tl.where(mask, tl.math.div_rn(w, e), -1.0)
    block_best = tl.max(score, 0)
    block_idx = tl.argmax(score, 0, tie_break_left=True).to(tl.int64) + v0
    take = block_best > best  # strict: an earlier block keeps a tie (lowest id)
    return tl.where(take, block_best, best), tl.where(take, block_idx, best_idx)


@triton.jit
def _race_row(row_ptr, noise_row, V, BLOCK_V: tl.constexpr):
    """Exponential race over a whole row of weights; returns the winning index."""
    arange = tl.arange(0, BLOCK_V)
    best = -1.0
    best_idx = tl.zeros((), dtype=tl.int64)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + arange
        mask = offs < V
        w = tl.load(row_ptr + offs, mask=mask, other=0.0)
        best, best_idx = _race_block(w, noise_row, v0, offs, mask, best, best_idx)
    return best_idx


@triton.jit
def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
    """Index of the largest entry of a row (the first one on ties), block by block."""
    arange = tl.arange(0, BLOCK_V)
    best = -float("inf")
    best_idx = tl.zeros((), dtype=tl.int64)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + arange
        lv = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf"))
        block_best = tl.max(lv, 0)
        block_idx = tl.argmax(lv, 0, tie_break_left=True).to(tl.int64) + v0
        take = block_best > best  # strict: an earlier block keeps a tie
        best = tl.where(take, block_best, best)
        best_idx = tl.where(take, block_idx, best_idx)
    return best_idx


@triton.jit
def _chain_kernel(draft_ptr, q_ptr, p_ptr, u_ptr, noise_ptr, n_out_ptr, tok_out_ptr, K: tl.constexpr, V: tl.constexpr,
                  HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    arange = tl.arange(0, BLOCK_V)
    alive = 1
    n = 0
    for i in range(0, K):
        x = tl.load(draft_ptr + b * K + i).to(tl.int64)
        px = tl.load(p_ptr + (b * (K + 1) + i) * V + x)
        if HAS_Q:
            qx = tl.load(q_ptr + (b * K + i) * V + x)
        else:
            qx = 1.0
        u = tl.load(u_ptr + b * K + i)
        ok = (qx > 0.0) & (u * qx < px)
        alive = alive * ok.to(tl.int32)
        n += alive
        tl.store(tok_out_ptr + b * (K + 1) + i, x, mask=alive == 1)
    rejected = n < K
    x_rej = tl.load(draft_ptr + b * K + n, mask=rejected, other=-1).to(tl.int64)
    p_row = p_ptr + (b * (K + 1) + n) * V
    q_row = q_ptr + (b * K + n) * V
    noise_row = noise_ptr + b * V
    best = -1.0
    best_idx = tl.zeros((), dtype=tl.int64)
    any_positive = 0
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + arange
        mask = offs < V
        pv = tl.load(p_row + offs, mask=mask, other=0.0)
        if HAS_Q:
            qv = tl.load(q_row + offs, mask=mask & rejected, other=0.0)
            w = tl.maximum(pv - qv, 0.0)
        else:
            w = tl.where(offs == x_rej, 0.0, pv)
        any_positive = tl.maximum(any_positive, tl.max((w > 0.0).to(tl.int32), 0))
        best, best_idx = _race_block(w, noise_row, v0, offs, mask, best, best_idx)
    if any_positive == 0:  # p == q: the residual is empty, race over p itself
        best_idx = _race_row(p_row, noise_row, V, BLOCK_V)
    tl.store(tok_out_ptr + b * (K + 1) + n, best_idx)
    tl.store(n_out_ptr + b, n)


@triton.jit
def _chain_greedy_kernel(draft_ptr, logits_ptr, n_out_ptr, tok_out_ptr, K: tl.constexpr, V: tl.constexpr,
                         BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    alive = 1
    n = 0
    for i in range(0, K + 1):
        if alive == 1:
            best_idx = _row_argmax(logits_ptr + (b * (K + 1) + i) * V, V, BLOCK_V)
            tl.store(tok_out_ptr + b * (K + 1) + i, best_idx)
            if i < K:
                x = tl.load(draft_ptr + b * K + i).to(tl.int64)
                matched = (x == best_idx).to(tl.int32)
                alive = alive * matched
                n += alive
            else:
                alive = 0
    tl.store(n_out_ptr + b, n)


def _check(name: str, t: torch.Tensor, dims: int, dtype: torch.dtype | tuple) -> None:
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if not isinstance(t, torch.Tensor) or t.dim() != dims:
        raise ValueError(f"{name} must be a {dims}-d tensor, got {getattr(t, 'shape', type(t))}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous: call .contiguous() first")


def _check_tokens(draft: torch.Tensor, vocab: int) -> None:
    if vocab < 1:  # the kernels would emit token 0 of an empty vocabulary
        raise ValueError("the vocabulary is empty (V = 0): pass rows over at least one token")
    if draft.numel() and (int(draft.min()) < 0 or int(draft.max()) >= vocab):
        raise ValueError(f"draft tokens must lie in [0, {vocab}): "
                         f"got ids from {int(draft.min())} to {int(draft.max())}")


def _outputs(b: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.zeros(b, dtype=torch.int32, device=device),
            torch.full((b, k + 1), -1, dtype=torch.int64, device=device))


def verify_chain_batched(draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, uniforms: torch.Tensor,
                         noise: torch.Tensor, block_v: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """draft [B, K] int; q [B, K, V] fp32 or None (one-hot drafts); p [B, K+1, V] fp32; uniforms
    [B, K] fp32; noise [B, V] fp32 Exp(1); all contiguous on one device, else ValueError. Returns
    (n_accepted [B] int32, tokens [B, K+1] int64: accepted drafts, residual or bonus token, -1s)."""
    _check("draft", draft, 2, (torch.int64, torch.int32))
    _check("p", p, 3, torch.float32)
    _check("uniforms", uniforms, 2, torch.float32)
    _check("noise", noise, 2, torch.float32)
    b, k = draft.shape
    v = p.shape[-1]
    if q is not None:
        _check("q", q, 3, torch.float32)
        if q.shape != (b, k, v):
            raise ValueError(f"q must have shape {(b, k, v)}, got {tuple(q.shape)}")
    if p.shape != (b, k + 1, v) or uniforms.shape != (b, k) or noise.shape != (b, v):
        raise ValueError(f"shapes disagree: draft {tuple(draft.shape)} needs p {(b, k + 1, v)}, uniforms {(b, k)}, "
                         f"noise {(b, v)}; got {tuple(p.shape)}, {tuple(uniforms.shape)}, {tuple(noise.shape)}")
    devices = {t.device for t in (draft, p, uniforms, noise) + ((q,) if q is not None else ())}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    _check_tokens(draft, v)
    n_out, tokens = _outputs(b, k, p.device)
    _chain_kernel[(b,)](draft, q if q is not None else p, p, uniforms, noise, n_out, tokens, k, v,
                        HAS_Q=q is not None, BLOCK_V=block_v)
    return n_out, tokens


def verify_chain_greedy_batched(draft: torch.Tensor, logits: torch.Tensor,
                                block_v: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """draft [B, K] int; target logits (or probabilities) [B, K+1, V] fp32. Greedy
    verification; returns (n_accepted [B] int32, tokens [B, K+1] int64, -1 padded)."""
    _check("draft", draft, 2, (torch.int64, torch.int32))
    _check("logits", logits, 3, torch.float32)
    b, k = draft.shape
    v = logits.shape[-1]
    if logits.shape[:2] != (b, k + 1):
        raise ValueError(f"logits must have shape {(b, k + 1, v)}, got {tuple(logits.shape)}")
    if draft.device != logits.device:
        raise ValueError(f"draft and logits must be on one device, got {draft.device} and {logits.device}")
    _check_tokens(draft, v)
    n_out, tokens = _outputs(b, k, logits.device)
    _chain_greedy_kernel[(b,)](draft, logits, n_out, tokens, k, v, BLOCK_V=block_v)
    return n_out, tokens
