"""The checks of notebook 08 (lab/check/speed.py) and notebook 09 (lab/check/kernels.py): each
passes a correct function and fails the classic wrong one with a message that names the mistake."""
import math

import numpy as np
import pytest
import torch

from lab.check import ExerciseError
from lab.check.kernels import check_ancestor_words, check_blocked_race, check_chain_bytes
from lab.check.speed import check_batch_speedup, check_speedup_per_tau


# ---- 08 (a): speed-up / τ -------------------------------------------------------------------------

def share(rows):
    return {m: r["speedup"] / r["tau"] for m, r in rows.items() if r["lossless"] and r["speedup"] is not None}


def test_speedup_per_tau_passes_a_correct_function(capsys):
    check_speedup_per_tau(share)
    assert "speedup_per_tau: right" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,match", [
    (lambda rows: {m: r["tau"] / r["speedup"] for m, r in rows.items() if r["lossless"] and r["speedup"]},
     "you gave τ / speed-up"),
    (lambda rows: {m: r["speedup"] / (r["tau"] - 1) for m, r in rows.items() if r["lossless"] and r["speedup"]},
     r"accepted drafts per cycle, τ - 1"),
    (lambda rows: {m: r["speedup"] / r["tau"] for m, r in rows.items() if r["speedup"] is not None},
     "`judge` is lossy"),
    (lambda rows: {m: r["speedup"] / r["tau"] for m, r in rows.items() if r["lossless"]}, "speedup is None"),
])
def test_speedup_per_tau_fails_the_classic_bugs(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_speedup_per_tau(wrong)


# ---- 08 (b): the batch cost model ---------------------------------------------------------------

def batch_speedup(tau, latency, n, draft_seconds, scaling, *, grow_by=None, with_draft=True, numerator_b1=False):
    if scaling not in ("batched", "serial"):
        raise ValueError(scaling)
    out = {}
    for b in sorted({b for b, _ in latency}):
        grow = (grow_by or scaling) == "batched" and latency[(b, 1)] / latency[(1, 1)] or b
        step = latency[(1, 1)] if numerator_b1 else latency[(b, 1)]
        out[b] = tau * step / (latency[(b, n)] + (draft_seconds * grow if with_draft else 0.0))
    return out


def test_batch_speedup_passes_a_correct_function(capsys):
    check_batch_speedup(batch_speedup)
    assert "batch_speedup: right" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,match", [
    (lambda *a: batch_speedup(*a, with_draft=False), "drafting cost is left out"),
    (lambda *a: batch_speedup(*a, grow_by="serial"), "grew drafting as the other assumption does"),
    (lambda *a: batch_speedup(*a, numerator_b1=True), r"not T\(1, 1\)"),
    (lambda tau, *a: batch_speedup(tau - 1, *a), "use τ, not τ - 1"),
])
def test_batch_speedup_fails_the_classic_bugs(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_batch_speedup(wrong)


def test_batch_speedup_must_refuse_an_unknown_scaling():
    def lenient(tau, latency, n, draft_seconds, scaling):
        return batch_speedup(tau, latency, n, draft_seconds, "serial" if scaling == "serial" else "batched")
    with pytest.raises(ExerciseError, match="ValueError"):
        check_batch_speedup(lenient)


# ---- 09 (a): the blocked exponential race ---------------------------------------------------------

def race(weights, noise, block, *, later_wins=False, offset=True, last_block=True, dtype=None, last_in_block=False):
    best, best_i = -np.inf, -1
    stop = len(weights) if last_block else len(weights) // block * block
    for start in range(0, stop, block):
        w, e = weights[start:start + block], noise[start:start + block]
        r = w.astype(dtype) / e.astype(dtype) if dtype else w / e
        i = len(r) - 1 - int(np.argmax(r[::-1])) if last_in_block else int(np.argmax(r))
        if r[i] > best or (later_wins and r[i] == best):
            best, best_i = r[i], (start if offset else 0) + i
    return best_i


def test_blocked_race_passes_a_correct_function(capsys):
    check_blocked_race(race)
    assert "blocked_race: bit-equal" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,match", [
    (lambda w, e, b: race(w, e, b, offset=False), "add the block's first index"),
    (lambda w, e, b: race(w, e, b, last_block=False), "last block"),
    (lambda w, e, b: race(w, e, b, later_wins=True), "goes to the earlier block"),
    (lambda w, e, b: race(w, e, b, dtype=np.float64), "not in float64"),
    (lambda w, e, b: race(w, e, b, last_in_block=True), "within a block the first index wins"),
])
def test_blocked_race_fails_the_classic_bugs(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_blocked_race(wrong)


# ---- 09 (b): the packed ancestor bits --------------------------------------------------------------

def words(parents, *, self_bit=True, parent_only=False, signed=True):
    n = len(parents)
    rows = []
    for i in range(n):
        row = [0] * max(1, math.ceil(n / 64))
        chain = [i, parents[i]] if parent_only else []
        j = i
        while not parent_only and j >= 0:
            chain.append(j)
            j = parents[j]
        for j in chain:
            if j >= 0 and (self_bit or j != i):
                row[j // 64] |= 1 << (j % 64)
        rows.append([v - (1 << 64) if signed and v >> 63 else v for v in row])
    return torch.tensor(rows, dtype=torch.int64)


def test_ancestor_words_passes_a_correct_function(capsys):
    check_ancestor_words(words)
    assert "ancestor_words: equal" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,match", [
    (lambda parents: words(parents, self_bit=False), "a node must see itself"),
    (lambda parents: words(parents, parent_only=True), "follow the parents up to the root"),
    (lambda parents: words(parents, signed=False), "sign bit"),
    (lambda parents: torch.tensor([[sum(1 << j for j in range(i + 1))] for i in range(len(parents))]
                                  if len(parents) < 64 else words(parents)), "is not an ancestor"),
])
def test_ancestor_words_fails_the_classic_bugs(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_ancestor_words(wrong)


# ---- 09 (c): the bytes of chain verification -------------------------------------------------------

def chain_bytes(batch, gamma, vocab, itemsize, *, rows=3, outputs=True):
    return batch * (gamma * (8 + 3 * itemsize) + rows * vocab * itemsize + ((gamma + 1) * 8 + 4 if outputs else 0))


def test_chain_bytes_passes_a_correct_function(capsys):
    check_chain_bytes(chain_bytes)
    assert "chain_verify_bytes: right" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,match", [
    (lambda b, g, v, s: b * ((2 * g + 1) * v * 4 + g * 12 + (g + 1) * 8 + 4), "every row of p"),
    (lambda b, g, v, s: chain_bytes(b, g, v, s, rows=2), "noise row"),
    (lambda b, g, v, s: chain_bytes(b, g, v, s, outputs=False), "outputs are written too"),
    (lambda b, g, v, s: 8 * chain_bytes(b, g, v, s), "bits"),
    (lambda b, g, v, s: chain_bytes(1, g, v, s), "multiply by the batch"),
    (lambda b, g, v, s: chain_bytes(b, g, v, 4), "itemsize"),
])
def test_chain_bytes_fails_the_classic_bugs(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_chain_bytes(wrong)


def test_the_byte_count_is_the_kernel_benchmarks():
    from lab.kernels.bench import chain_bytes as bench_bytes
    assert all(chain_bytes(b, g, 49152, 4) == bench_bytes(b, g, 49152) for b in (1, 64, 1024) for g in (4, 8))
