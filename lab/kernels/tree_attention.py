"""Tree-masked attention for the verification forward, in Triton. Queries are the N tree nodes; keys
and values the cached prefix (P positions, all visible) followed by the N nodes, of which node i sees
only itself and its ancestors, given as an ancestor bitmask (`ancestor_bits`), not a dense mask.
Grouped-query attention (query head h reads KV head h // (H / H_kv)); online softmax by key block."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .chain import _check


def ancestor_bits(parents: list[int]) -> torch.Tensor:
    """[N, ceil(N/64)] int64 words: bit j of node i is set iff j is i or an ancestor of i."""
    n = len(parents)
    words = max(1, math.ceil(n / 64))
    bits = [[0] * words for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            bits[i][j // 64] |= 1 << (j % 64)
            j = parents[j]
    # store as two's-complement int64 (bit 63 set means negative)
    return torch.tensor([[b - (1 << 64) if b >= 1 << 63 else b for b in row] for row in bits], dtype=torch.int64)


@triton.jit
def _tree_attention_kernel(q_ptr, k_ptr, v_ptr, bits_ptr, o_ptr, P, N, scale,
                           GROUP: tl.constexpr, WORDS: tl.constexpr, D: tl.constexpr,
                           BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    h = tl.program_id(0).to(tl.int64)
    qi = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    d = tl.arange(0, D)
    kv = h // GROUP
    total = P + N
    q_mask = qi < N
    q = tl.load(q_ptr + (h * N + qi[:, None]) * D + d[None, :], mask=q_mask[:, None], other=0.0)
    m = tl.full((BLOCK_Q,), -float("inf"), tl.float32)
    l = tl.zeros((BLOCK_Q,), tl.float32)
    acc = tl.zeros((BLOCK_Q, D), tl.float32)
    for k0 in range(0, total, BLOCK_K):
        kj = k0 + tl.arange(0, BLOCK_K)
        k_mask = kj < total
        k = tl.load(k_ptr + (kv * total + kj[:, None]) * D + d[None, :], mask=k_mask[:, None], other=0.0)
        v = tl.load(v_ptr + (kv * total + kj[:, None]) * D + d[None, :], mask=k_mask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        node = kj - P  # index of the key among the tree nodes (negative: prefix)
        in_tree = node >= 0
        word_idx = tl.where(in_tree, node // 64, 0)
        word = tl.load(bits_ptr + qi[:, None] * WORDS + word_idx[None, :],
                       mask=q_mask[:, None] & in_tree[None, :] & k_mask[None, :], other=0)
        bit = (word >> tl.where(in_tree, node % 64, 0)[None, :].to(tl.int64)) & 1
        visible = k_mask[None, :] & ((~in_tree)[None, :] | (bit == 1))
        s = tl.where(visible, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.dot(w, v, input_precision="ieee")
        m = m_new
    out = acc / l[:, None]
    tl.store(o_ptr + (h * N + qi[:, None]) * D + d[None, :], out, mask=q_mask[:, None])


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bits: torch.Tensor,
                   scale: float | None = None, block_q: int = 16, block_k: int = 32) -> torch.Tensor:
    """q [H, N, D] (tree nodes), k and v [H_kv, P + N, D] (prefix then tree), bits [N, W] int64
    from `ancestor_bits`. fp32. Returns [H, N, D]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check(name, t, 3, torch.float32)
    _check("bits", bits, 2, torch.int64)
    h, n, dim = q.shape
    h_kv, total, _ = k.shape
    if v.shape != k.shape or k.shape[-1] != dim or total < n:
        raise ValueError(f"need k, v [H_kv, P + N, D] with N = {n}, D = {dim}; "
                         f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if h % h_kv:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({h_kv})")
    if bits.shape[0] != n or bits.shape[1] * 64 < n:
        raise ValueError(f"bits must be [N, ceil(N/64)] = [{n}, {math.ceil(n / 64)}], got {tuple(bits.shape)}")
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"head dimension must be a power of two >= 16, got {dim}")
    out = torch.empty_like(q)
    grid = (h, triton.cdiv(n, block_q))
    _tree_attention_kernel[grid](q, k, v, bits, out, total - n, n, scale or 1.0 / math.sqrt(dim),
                                 GROUP=h // h_kv, WORDS=bits.shape[1], D=dim, BLOCK_Q=block_q, BLOCK_K=block_k)
    return out
