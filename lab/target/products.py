"""The exact engine's arithmetic: its row-invariant products and its compiled per-row operations.
A product's row must not depend on how many rows share the call. Where oneDNN has bfloat16 kernels
(AVX-512 BF16 or AMX), weights are packed once for it and each call gets MIN_ROWS..BLOCK_ROWS rows;
elsewhere csrc/exact_ops.c's `linear_bf16` computes each output as one chain of multiply-adds. The same
C file holds the per-row operations (RMSNorm with the residual add, RoPE into the cache, attention over
a row's allowed keys, SwiGLU), compiled once per source, CPU and compiler."""
from __future__ import annotations

import ctypes
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..artifacts import cpu_flags
from ..errors import LabError
from ..timing import Seconds
from .build import compile_library


# Rows per packed-linear call: oneDNN may take another kernel for one row, 2..32 rows gave identical
# rows on every shape checked (tests/test_exact.py checks), and fewer than 4 rows are no faster.
MIN_ROWS, BLOCK_ROWS = 4, 32
SOURCE = Path(__file__).resolve().parent / "csrc" / "exact_ops.c"


def bf16_support() -> str | None:
    """Why oneDNN's bfloat16 matrix kernels cannot compute the exact engine's products on this CPU,
    or None if they can. Where they cannot, the engine computes its products in its own C kernel
    (`linear_bf16`: as fast as oneDNN for one row, several times slower for blocks of 16 or more)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the exact bfloat16 engine needs an x86-64 CPU (this is {platform.machine()})"
    flags = cpu_flags()
    if not flags & {"avx512_bf16", "amx_bf16"}:
        return "this CPU has no bfloat16 matrix instructions (avx512_bf16 or amx_bf16)"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    return None


_I64, _PTR, _F32, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
SIGNATURES = {"add_norm": [_PTR, _PTR, _PTR, _F32, _PTR, _I64, _I64, _I32],
              "rope_into_cache": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I32],
              "tree_attention": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _I32],
              "swiglu": [_PTR, _PTR, _I64, _I64, _I32],
              "linear_bf16": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _I32]}


def _compile() -> ctypes.CDLL:
    """lab/target/csrc/exact_ops.c built with the lab's portable build command (lab/target/build.py)."""
    return compile_library(SOURCE, SIGNATURES)


_LIB: ctypes.CDLL | None = None
_OPS: ctypes.CDLL | _TimedOps | None = None  # the library, or within step_seconds its timed view


def _library() -> ctypes.CDLL:
    """lab/target/csrc/exact_ops.c, compiled on first use."""
    global _LIB
    if _LIB is None:
        _LIB = _compile()
    return _LIB


def ops() -> ctypes.CDLL:
    """The compiled per-row operations (lab/target/csrc/exact_ops.c)."""
    return _OPS if _OPS is not None else _library()


class _TimedOps:
    """The compiled operations, each call's seconds added to `seconds` under its name."""

    def __init__(self, lib: ctypes.CDLL, seconds: Seconds):
        self.lib, self.seconds = lib, seconds

    def __getattr__(self, name: str) -> Callable:
        return self.seconds.wrap(name, getattr(self.lib, name))


@contextmanager
def step_seconds() -> Iterator[Seconds]:
    """Within it, every `ExactEngine` forward adds its steps' seconds to the yielded dict: "products"
    (the packed linears, the LM head included) and each C operation by name."""
    global _OPS, packed_linear
    seconds = Seconds()
    untimed_linear = packed_linear
    _OPS, packed_linear = _TimedOps(_library(), seconds), seconds.wrap("products", untimed_linear)
    try:
        yield seconds
    finally:
        _OPS, packed_linear = None, untimed_linear


class KernelWeight:
    """A bfloat16 weight [out, in] as csrc/exact_ops.c's `linear_bf16` reads it: panels of 16
    outputs, [ceil(out / 16), in, 16], the outputs past `out` zero."""

    def __init__(self, weight: torch.Tensor):
        self.out = weight.shape[0]
        padded = torch.nn.functional.pad(weight.detach().to(torch.bfloat16), (0, 0, 0, -self.out % 16))
        self.panels = padded.reshape(-1, 16, weight.shape[1]).transpose(1, 2).contiguous()


def pack(weight: torch.Tensor) -> torch.Tensor | KernelWeight:
    """A weight ready for `packed_linear`: reordered for oneDNN where it has bfloat16 kernels."""
    if bf16_support() is None:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16).contiguous(), None)
    return KernelWeight(weight)


_LINEAR = torch.ops.mkldnn._linear_pointwise.default  # the overload resolved once, not per call


def packed_linear(x: torch.Tensor, packed: torch.Tensor | KernelWeight) -> torch.Tensor:
    """x [n, in] bfloat16 -> [n, out] bfloat16. oneDNN gets calls of MIN_ROWS..BLOCK_ROWS rows
    (fewer rows are padded with copies of the first), so that every row goes through the same
    kernel; the lab's kernel computes each row on its own whatever the count."""
    if isinstance(packed, KernelWeight):
        x = x.to(torch.bfloat16).contiguous()
        out = torch.empty(x.shape[0], packed.out, dtype=torch.bfloat16)
        _library().linear_bf16(x.data_ptr(), packed.panels.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                         packed.out, torch.get_num_threads())
        return out
    if MIN_ROWS <= x.shape[0] <= BLOCK_ROWS and x.is_contiguous():  # one call (ExactEngine's buffers)
        return _LINEAR(x, packed, None, "none", [], "")
    outs = []
    for start in range(0, x.shape[0], BLOCK_ROWS):
        block = x[start: start + BLOCK_ROWS]
        rows = block.shape[0]
        if rows < MIN_ROWS:
            block = torch.cat([block, block[:1].expand(MIN_ROWS - rows, -1)])
        outs.append(_LINEAR(block.contiguous(), packed, None, "none", [], "")[:rows])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def fast_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ weight.T (+ bias) for drafters: a bfloat16 weight on a CPU packed once for
    `packed_linear` (torch's own bfloat16 products are slow without AMX), else `F.linear`."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return lambda x: torch.nn.functional.linear(x, weight, bias)
    packed, bias = pack(weight), None if bias is None else bias.detach()

    def linear(x: torch.Tensor) -> torch.Tensor:
        out = packed_linear(x.to(torch.bfloat16).reshape(-1, x.shape[-1]), packed).reshape(*x.shape[:-1], -1)
        return out if bias is None else out + bias
    return linear
