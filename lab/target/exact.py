"""An exact, fast bfloat16 target forward with `Engine`'s interface. Speculative decoding is lossless
only if the target computes the same numbers for a position however many positions it scores at
once; transformers' bfloat16 path does not (library kernels pick their blocking by shape).
`ExactEngine` runs the Llama forward so that a row's arithmetic depends on that row alone: the
linears are `lab.target.products`' row-invariant products, the rest runs row by row in
csrc/exact_ops.c (float32 residual stream and RMSNorm, RoPE, SwiGLU, attention per (row, head) over
its allowed keys in cache order); a float32 KV cache grown by doubling. So AR, a chain and a tree
give bit-identical logits and hidden states for the same position (tests/test_exact.py checks it).
`forward_batch` takes its arithmetic from the weights object: `PackedLlama` here, `QuantLlama` (the
GGUF's own blocks, lab/target/quant.py) for `QuantEngine`."""
from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from ..errors import LabError
from . import products
from .engine import Request, Scored, allowed_keys
from .products import MIN_ROWS, pack


class _Layer:
    def __init__(self, layer: torch.nn.Module):
        a, m = layer.self_attn, layer.mlp
        self.qkv = pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        self.o = pack(a.o_proj.weight)
        self.gate_up = pack(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        self.down = pack(m.down_proj.weight)
        self.norm1 = layer.input_layernorm.weight.detach().float()
        self.norm2 = layer.post_attention_layernorm.weight.detach().float()


class PackedLlama:
    """A Llama's weights as the exact forward uses them, packed once per model (`of` shares one copy
    as `model._lab_packed`); the LM head is packed on first use (an EAGLE head's body never needs it).
    Raises LabError for a Llama variant the exact engine does not support."""

    def __init__(self, model: LlamaForCausalLM):
        cfg = model.config
        if getattr(cfg, "mlp_bias", False) or getattr(cfg, "attention_bias", False):
            raise LabError("the exact engine supports Llama layers without biases; use --dtype float32")
        rope = getattr(cfg, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise LabError(f"the exact engine supports default RoPE only (got {rope.get('rope_type')}); "
                           "use --dtype float32")
        self.model = model
        # oneDNN computes a row identically in calls of MIN_ROWS or more rows; the lab's kernel in any call
        self.min_rows = MIN_ROWS if products.bf16_support() is None else 1
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.hidden, self.inner = cfg.hidden_size, cfg.intermediate_size
        if self.head_dim % 16 or cfg.hidden_size % 16 or self.heads % self.kv_heads or self.heads > 8 * self.kv_heads:
            raise LabError("the exact engine needs head and hidden sizes that are multiples of 16 and at most 8 query "
                           "heads per KV head; use --dtype float32")
        inner = model.model
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.norm = None if isinstance(inner.norm, torch.nn.Identity) else inner.norm.weight.detach().float()
        self.embed = inner.embed_tokens.weight.detach()
        self.inv_freq = inner.rotary_emb.inv_freq.detach().float()
        self._lm_head: torch.Tensor | None = None

    @property
    def lm_head(self) -> torch.Tensor:
        if self._lm_head is None:
            self._lm_head = pack(self.model.lm_head.weight)
        return self._lm_head

    act_dtype = torch.bfloat16  # the linears' inputs (normed, attended, SwiGLU's output)

    def kernels(self) -> tuple:
        """The compiled per-row operations and the product, looked up per forward (`products.step_seconds`
        swaps in timed ones)."""
        return products.ops(), products.packed_linear

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of token ids [n] as float32 [n, hidden]."""
        return self.embed[ids].to(torch.float32)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of RoPE's angles for `positions` [n], each [n, head_dim] (the half-split pairing)."""
        angle = positions.reshape(-1, 1).float() * self.inv_freq
        return torch.cat([angle.cos()] * 2, -1).contiguous(), torch.cat([angle.sin()] * 2, -1).contiguous()

    @classmethod
    def of(cls, model: LlamaForCausalLM) -> "PackedLlama":
        packed = getattr(model, "_lab_packed", None)
        if packed is None:
            packed = cls(model)
            model._lab_packed = packed
        return packed


class ExactEngine:
    """`Engine`'s interface (forward, crop, keep, reset, length, forwards, model) over a bfloat16
    Llama, batch-invariant: a position's logits (float32) and hidden states (bfloat16) are the same
    bits whether it is scored alone, in a chain or in a tree."""

    def __init__(self, model: LlamaForCausalLM | None, capacity: int = 1024, weights=None):
        """`weights`: another arithmetic for the same forward (quant.py's `QuantLlama`); by default the
        model's `PackedLlama`."""
        self.model, self.w = model, weights if weights is not None else PackedLlama.of(model)
        self.scale = self.w.head_dim ** -0.5
        self.forwards = 0
        self._allocate(capacity)
        self.reset()

    def _allocate(self, capacity: int) -> None:
        # keys [layer, kv head, channel, position] (16 keys: one kernel vector), values [layer, kv
        # head, position, channel]; 16 spare positions keep the channel stride off multiples of 4 KB
        capacity += 16
        layers, heads, d = len(self.w.layers), self.w.kv_heads, self.w.head_dim
        keys, values = torch.zeros(layers, heads, d, capacity), torch.zeros(layers, heads, capacity, d)
        if hasattr(self, "keys"):
            keys[..., : self.length] = self.keys[..., : self.length]
            values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values, self.capacity = keys, values, capacity
        # each layer's slice of the cache as a pointer, so that a forward does not index per layer
        self._cache_ptrs = [(k.data_ptr(), v.data_ptr()) for k, v in zip(keys, values)]

    def reset(self) -> None:
        self.length = 0

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def keep(self, start: int, indices: list[int]) -> None:
        """Keep positions [0, start) plus start + indices, in that order. The indices must increase (a
        tree path, parents first; ValueError otherwise), so copying only the positions that move never
        overwrites a later copy's source; a prefix costs nothing."""
        if any(b <= a for a, b in zip(indices, indices[1:])):
            raise ValueError(f"keep takes increasing positions (a tree path), got {indices}")
        for offset, node in enumerate(indices):
            if node != offset:
                self.keys[..., start + offset] = self.keys[..., start + node]
                self.values[:, :, start + offset] = self.values[:, :, start + node]
        self.length = start + len(indices)

    def forward(self, tokens: list[int] | torch.Tensor | None, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, hidden_layers: tuple[int, ...] = (),
                last_only: bool = False, embeds: torch.Tensor | None = None, logits: bool = True) -> Scored:
        """As `Engine.forward`."""
        return forward_batch([Request(self, tokens, mask, positions, hidden_layers, last_only, embeds, logits)])[0]


@torch.inference_mode()
def forward_batch(requests: list[Request]) -> list[Scored]:
    """One forward of a model over several sequences, each request on its own engine (KV cache) of
    that model: the rows of all requests go through the linears, norms and SwiGLU together, and each
    sequence's rows attend over its own cache. Since every step computes a row on its own, each
    sequence gets the same bits as its own `forward` would give it. The requests ask for the same
    hidden layers and logits (one drafter kind per batch); `last_only` may differ (a prompt's
    prefill beside another sequence's cycle)."""
    engines = [r.engine for r in requests]
    if not engines or len({id(e) for e in engines}) != len(engines):
        raise ValueError("forward_batch takes one request for each of several distinct engines")
    if not all(isinstance(e, ExactEngine) for e in engines):
        raise ValueError("forward_batch runs on exact engines (lab.target.load.engine_for of a bfloat16 or q4_1 "
                         "model)")
    w, threads = engines[0].w, torch.get_num_threads()
    if any(e.w is not w for e in engines):
        raise ValueError("forward_batch takes engines of one model")
    hidden_layers, logits = requests[0].hidden_layers, requests[0].logits
    lib, linear = w.kernels()
    if any((r.hidden_layers, r.logits) != (hidden_layers, logits) for r in requests):
        raise ValueError("forward_batch takes requests for the same hidden layers and logits")
    xs, allowed, positions, spans = [], [], [], []
    for engine, r in zip(engines, requests):
        if r.embeds is None:
            xs.append(w.embed_rows(torch.as_tensor(r.tokens, dtype=torch.long).reshape(-1)))
        else:
            xs.append(r.embeds.reshape(-1, w.hidden).to(torch.float32))
        n, start = xs[-1].shape[0], engine.length
        allowed.append(allowed_keys(r.mask, n, start).to(torch.uint8).contiguous())
        positions.append(torch.arange(start, start + n) if r.positions is None else r.positions.reshape(-1))
        if start + n > engine.capacity:
            engine._allocate(max(2 * engine.capacity, start + n))
        first = spans[-1][1] if spans else 0
        spans.append((first, first + n))
    x = torch.cat(xs).contiguous()  # the residual stream, updated in place
    n, width = x.shape
    cos, sin = w.rotary(torch.cat(positions))
    hq, hkv, d = w.heads, w.kv_heads, w.head_dim
    # the linears' inputs have at least w.min_rows rows, the rows past n zero (packed_linear
    # would pad each call otherwise); the C operations read and write the first n rows only
    rows = max(n, w.min_rows)
    normed = torch.zeros(rows, width, dtype=w.act_dtype)
    q = torch.empty(n, hq, d)
    attended = torch.zeros(rows, hq * d, dtype=torch.bfloat16)
    act = torch.zeros(rows, w.inner, dtype=w.act_dtype)
    hidden, delta = {}, None
    x_ptr, normed_ptr, act_ptr = x.data_ptr(), normed.data_ptr(), act.data_ptr()
    # each sequence's rows of q, cos, sin, the qkv rows and the attention output, as pointers
    row_ptrs = [(q[a].data_ptr(), cos[a].data_ptr(), sin[a].data_ptr(), attended[a].data_ptr(), a, b - a, m.data_ptr())
                for (a, b), m in zip(spans, allowed)]
    for i, layer in enumerate(w.layers):
        lib.add_norm(x_ptr, _ptr(delta), layer.norm1.data_ptr(), w.eps, normed_ptr, n, width, threads)
        if i in hidden_layers:
            hidden[i] = x.to(torch.bfloat16)
        qkv = linear(normed, layer.qkv)
        qkv_ptr, qkv_row = qkv.data_ptr(), qkv.stride(0) * qkv.element_size()  # bfloat16 or float32 products
        for engine, (q_ptr, cos_ptr, sin_ptr, out_ptr, a, rows_a, allowed_ptr) in zip(engines, row_ptrs):
            keys, values = engine._cache_ptrs[i]
            start = engine.length
            lib.rope_into_cache(qkv_ptr + a * qkv_row, cos_ptr, sin_ptr, q_ptr, keys, values, rows_a,
                                hq, hkv, d, engine.capacity, start, threads)
            lib.tree_attention(q_ptr, keys, values, allowed_ptr, out_ptr, rows_a, hq, hkv, d, engine.capacity,
                               start + rows_a, engine.scale, threads)
        out = linear(attended, layer.o)
        lib.add_norm(x_ptr, out.data_ptr(), layer.norm2.data_ptr(), w.eps, normed_ptr, n, width, threads)
        gate_up = linear(normed, layer.gate_up)
        lib.swiglu(gate_up.data_ptr(), act_ptr, n, w.inner, threads)
        delta = linear(act, layer.down)
    lib.add_norm(x_ptr, _ptr(delta), _ptr(w.norm), w.eps, normed_ptr, n, width, threads)
    if len(w.layers) in hidden_layers:
        hidden[len(w.layers)] = normed[:n].to(torch.bfloat16)
    for engine, (a, b) in zip(engines, spans):
        engine.length += b - a
        engine.forwards += 1
    if not logits:
        scores = [None] * len(spans)
    else:  # the rows each request wants (its last one, or all), in one block of at least w.min_rows rows
        wanted = [range(b - 1, b) if r.last_only else range(a, b) for r, (a, b) in zip(requests, spans)]
        picked = [row for span in wanted for row in span]
        every = linear(normed[picked + picked[-1:] * (w.min_rows - len(picked))], w.lm_head).float()
        ends = torch.tensor([len(span) for span in wanted]).cumsum(0).tolist()
        scores = [every[end - len(span): end] for span, end in zip(wanted, ends)]
    return [Scored(score, {i: h[a:b] for i, h in hidden.items()}) for score, (a, b) in zip(scores, spans)]


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()
