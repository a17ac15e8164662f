"""Checks for notebook 09's exercises, in NumPy and torch on the CPU: the blocked exponential race,
the packed ancestor bits of tree attention, and the bytes chain verification must move. Each
compares the student's values with a reference computed here independently, on seeded random
cases and on the edge cases the classic bugs live in, and raises `ExerciseError` saying what went
wrong and where to look."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from . import ExerciseError


# ---- (a) the blocked exponential race --------------------------------------------------------

def _race_case(rng: np.random.Generator, vocab: int, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """weights as verification produces them: a residual max(0, p - q) with many zeros, a plain p, or
    coarse values with many exact ties; noise Exp(1), or all ones (ties decided by the weights alone)."""
    p = rng.dirichlet(np.full(vocab, 0.3)).astype(np.float32)
    if kind == 0:
        weights = np.maximum(p - rng.dirichlet(np.full(vocab, 0.3)).astype(np.float32), 0).astype(np.float32)
    elif kind == 1:
        weights = p
    else:
        weights = (rng.integers(0, 4, vocab) / 4).astype(np.float32)
    noise = np.ones(vocab, np.float32) if kind == 2 else rng.exponential(size=vocab).astype(np.float32)
    return weights, noise


def _float32_tie(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two entries whose ratios tie in float32 while the second is larger in float64."""
    while True:
        w0 = np.float32(rng.uniform(0.1, 1))
        e = rng.exponential(size=2).astype(np.float32) + np.float32(0.5)
        aim = np.float32(float(w0) / float(e[0]) * float(e[1]))  # w1 near the tie, then a few floats either side
        for w1 in (np.nextafter(aim, np.float32(s * np.inf)) if s else aim for s in (0, 1, -1)):
            if w0 / e[0] == w1 / e[1] and float(w1) / float(e[1]) > float(w0) / float(e[0]):
                return np.array([w0, w1], np.float32), e


def check_blocked_race(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(weights, noise, block)`: 1-D float32 arrays of one length V and a block size; returns the
    index v of the largest weights[v] / noise[v], found block by block (the ratio in float32, the
    first index on ties, the earlier block on ties between blocks): bit-equal to
    np.argmax(weights / noise)."""
    def call(weights, noise, block) -> int:
        out = fn(weights.copy(), noise.copy(), block)
        try:
            return int(out)
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"return one index (an int), got {type(out).__name__}") from error

    ones = np.ones(10, np.float32)

    def weights_with(values: dict) -> np.ndarray:
        w = np.zeros(10, np.float32)
        for i, v in values.items():
            w[i] = v
        return w

    got = call(weights_with({5: 1.0}), ones, 4)
    if got == 1:
        raise ExerciseError("V 10, block 4, the maximum at index 5: you returned 1, its index within block 1; add the "
                            "block's first index (4) to get the vocabulary index")
    if got != 5:
        raise ExerciseError(f"V 10, block 4, the maximum at index 5 (noise all ones): you returned {got}")
    got = call(weights_with({9: 1.0}), ones, 4)
    if got != 9:
        raise ExerciseError(f"V 10, block 4, the maximum at index 9: you returned {got}; the last block (indices 8 "
                            "and 9) is shorter than `block` and must be raced too")
    got = call(weights_with({2: 0.5, 9: 0.5}), ones, 4)
    if got != 2:
        raise ExerciseError(f"V 10, block 4, equal maxima at indices 2 (block 0) and 9 (block 2): you returned {got}; "
                            "a tie between blocks goes to the earlier block, so replace the running best only when a "
                            "block's maximum is strictly larger (argmax's first index, as the reference does)")
    got = call(weights_with({5: 0.5, 6: 0.5}), ones, 4)
    if got != 5:
        raise ExerciseError(f"V 10, block 4, equal maxima at indices 5 and 6 (both in block 1): you returned {got}; "
                            "within a block the first index wins too")
    got = call(np.zeros(10, np.float32), ones, 4)
    if got != 0:
        raise ExerciseError(f"all weights zero (a residual with no mass): every ratio is 0, a tie the first index "
                            f"wins; you returned {got}, expected 0")
    rng = np.random.default_rng(seed)
    w, e = _float32_tie(rng)
    got = call(w, e, 1)
    if got != 0:
        raise ExerciseError(f"weights {w.tolist()}, noise {e.tolist()}: the two ratios are equal in float32 (the "
                            f"kernel's precision), so index 0 wins; you returned {got}. Divide in the arrays' "
                            "dtype, float32, not in float64")
    for case in range(cases):
        vocab = int(rng.integers(1, 3000))
        block = int(rng.choice([1, 3, 64, 256, 1024, 4096]))
        weights, noise = _race_case(rng, vocab, case % 3)
        want, got = int(np.argmax(weights / noise)), call(weights, noise, block)
        if got != want:
            what = ("a tie: the first index wins" if weights[got] / noise[got] == weights[want] / noise[want] else
                    f"ratio {weights[want] / noise[want]:.6g} against your {weights[got] / noise[got]:.6g}")
            raise ExerciseError(f"case {case} (V {vocab}, block {block}): argmax is {want}, you returned {got} "
                                f"({what})")
    print(f"blocked_race: bit-equal to argmax on {cases} random rows (residuals, full rows, coarse weights with ties) "
          "and the edge cases (ties within and between blocks, a short last block, float32 ties)")


# ---- (b) the packed ancestor bits ---------------------------------------------------------------

def _words_reference(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    words = max(1, math.ceil(n / 64))
    rows = []
    for i in range(n):
        row, j = [0] * words, i
        while j >= 0:
            row[j // 64] |= 1 << (j % 64)
            j = parents[j]
        rows.append([v - (1 << 64) if v >> 63 else v for v in row])
    return torch.tensor(rows, dtype=torch.int64)


def _unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """bool [n, n] from [n, W] int64 words: entry [i, j] is bit j % 64 of word j // 64 of row i."""
    bits = (words[:, :, None] >> torch.arange(64)) & 1
    return bits.flatten(1)[:, :n].bool()


def check_ancestor_words(fn: Callable, trees: int = 200, seed: int = 0) -> None:
    """`fn(parents)` (parents[0] = -1, every parent before its child) returns int64 [N, ceil(N / 64)]:
    bit j % 64 of word j // 64 of row i is set iff node j is node i or one of its ancestors, each
    word as a two's-complement int64 (bit 63 set makes it negative)."""
    def call(parents: list[int]) -> torch.Tensor:
        try:
            out = torch.as_tensor(fn(list(parents)))
        except NotImplementedError:  # a stub (a RuntimeError too): not a wrong answer
            raise
        except (OverflowError, RuntimeError, ValueError) as error:
            raise ExerciseError(f"parents of {len(parents)} nodes: {error}. Bit 63 of a word is the sign bit of "
                                "an int64: a word v >= 2**63 is stored as v - 2**64") from error
        if out.dtype != torch.int64:
            raise ExerciseError(f"return int64 words, got {out.dtype}")
        return out

    for parents in ([-1], [-1, 0, 0, 1], list(range(-1, 63)), list(range(-1, 64)), list(range(-1, 69)),
                    [-1] + [0] * 129):
        n = len(parents)
        want, got = _words_reference(parents), call(parents)
        if tuple(got.shape) != tuple(want.shape):
            raise ExerciseError(f"{n} nodes: expected shape {tuple(want.shape)} (one int64 word per 64 nodes, at "
                                f"least one), got {tuple(got.shape)}")
        if not torch.equal(got, want):
            raise ExerciseError(_first_wrong(parents, got, want))
    rng = np.random.default_rng(seed)
    for _ in range(trees):
        n = int(rng.integers(1, 160))
        parents = [-1] + [int(rng.integers(max(0, i - 8) if rng.random() < 0.5 else 0, i)) for i in range(1, n)]
        want, got = _words_reference(parents), call(parents)
        if tuple(got.shape) != tuple(want.shape):
            raise ExerciseError(f"{n} nodes: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
        if not torch.equal(got, want):
            raise ExerciseError(_first_wrong(parents, got, want))
    print(f"ancestor_words: equal to the reference on {trees} random trees of up to 159 nodes and the edge cases "
          "(one node, 64 and 70 nodes in a chain, a root with 129 children)")


def _first_wrong(parents: list[int], got: torch.Tensor, want: torch.Tensor) -> str:
    n = len(parents)
    seen, should = _unpack(got, n), _unpack(want, n)
    shown = parents if n <= 12 else f"{parents[:12]}... ({n} nodes)"
    if torch.equal(seen, should):  # the bits agree within N but a word differs: bits past the last node
        return f"parents {shown}: bits past node {n - 1} are set; leave them 0"
    i, j = [int(v) for v in torch.nonzero(seen != should)[0]]
    if i == j:
        what = "a node must see itself: set its own bit"
    elif should[i, j]:
        what = (f"node {j} is an ancestor of node {i} (not only its parent: follow the parents up to the root)"
                if j != parents[i] else f"node {j} is node {i}'s parent")
    else:
        what = f"node {j} is not an ancestor of node {i}: clear it"
    where = f"bit {j % 64} of word {j // 64}"
    return f"parents {shown}: row {i}, {where} is {int(seen[i, j])}; {what}"


# ---- (c) the bytes chain verification must move ------------------------------------------------

def _bytes_reference(batch: int, gamma: int, vocab: int, itemsize: int) -> int:
    per_draft = 8 + 3 * itemsize          # the draft id (int64); p and q at the draft; its uniform
    rows = 3 * vocab * itemsize           # p, q and the noise over the vocabulary, at the deciding position
    out = (gamma + 1) * 8 + 4             # the tokens (int64) and the accepted count (int32)
    return batch * (gamma * per_draft + rows + out)


def check_chain_bytes(fn: Callable, cases: int = 200, seed: int = 0) -> None:
    """`fn(batch, gamma, vocab, itemsize)` returns the bytes chain verification must read and write
    in the worst case (a rejection): per sequence, each draft's id (int64), p and q at it and its
    uniform (itemsize each); one full row each of p, q and the exponential noise at the deciding
    position (vocab * itemsize each); the output tokens (gamma + 1, int64) and the accepted count
    (int32)."""
    def call(*args) -> int:
        out = fn(*args)
        try:
            return int(out)
        except (TypeError, ValueError) as error:
            raise ExerciseError(f"return one number of bytes, got {type(out).__name__}") from error

    batch, gamma, vocab = 1024, 8, 49152
    want, got = _bytes_reference(batch, gamma, vocab, 4), call(batch, gamma, vocab, 4)
    out = (gamma + 1) * 8 + 4
    guesses = [
        (batch * ((2 * gamma + 1) * vocab * 4 + gamma * 12 + out),
         "you read every row of p (γ + 1) and q (γ) over the vocabulary, as an unfused implementation does; the "
         "kernel reads only the drafted entries of p and q, and full rows at one position, the one that decides"),
        (batch * (gamma * 20 + 2 * vocab * 4 + out), "the exponential noise row is read too (one Exp(1) draw per "
                                                     "vocabulary entry)"),
        (batch * (gamma * 20 + 3 * vocab * 4), "the outputs are written too: γ + 1 tokens (int64) and the count "
                                               "(int32)"),
        (8 * want, "that is bits: count bytes"),
        (want // batch, "that is one sequence: multiply by the batch"),
    ]
    if got != want:
        why = next((text for guess, text in guesses if got == guess), "see the docstring's list")
        raise ExerciseError(f"B {batch}, γ {gamma}, V {vocab}, 4-byte floats: the reference counts {want:,} bytes, "
                            f"you counted {got:,}; {why}")
    got = call(1, 4, 1000, 2)
    if got != _bytes_reference(1, 4, 1000, 2):
        raise ExerciseError(f"B 1, γ 4, V 1000, 2-byte floats: the reference counts {_bytes_reference(1, 4, 1000, 2)} "
                            f"bytes, you counted {got}; p, q, the uniforms and the noise take `itemsize` bytes each, "
                            "the ids 8 and the count 4 whatever the float type")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        args = (int(rng.integers(1, 2049)), int(rng.integers(1, 17)), int(rng.integers(1, 200_000)),
                int(rng.choice([2, 4])))
        want, got = _bytes_reference(*args), call(*args)
        if got != want:
            raise ExerciseError(f"case {case} (B, γ, V, itemsize = {args}): the reference counts {want:,} bytes, you "
                                f"counted {got:,}")
    print(f"chain_verify_bytes: right on {cases} random shapes and the edge cases; B 1024, γ 8, V 49152 in float32 "
          f"move {_bytes_reference(1024, 8, 49152, 4) / 1e6:.1f} MB")
