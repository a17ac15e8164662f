"""Checks for notebook 08's exercises: the share of τ a method keeps as speed-up, the speed-up the
batch cost model predicts, and the batch size where speculation stops paying. Each compares the
student's values with a reference computed here independently, on seeded random cases and on the
edge cases the classic bugs live in, and raises `ExerciseError` saying what went wrong and where to
look."""
from __future__ import annotations

import copy
import math
from typing import Callable

import numpy as np

from . import ExerciseError


# ---- (a) speed-up / τ per method -------------------------------------------------------------

def _share_reference(rows: dict) -> dict:
    return {m: r["speedup"] / r["tau"] for m, r in rows.items() if r["lossless"] and r["speedup"] is not None}


def _random_rows(rng: np.random.Generator) -> dict:
    rows = {"ar": {"tau": 1.0, "speedup": 1.0, "lossless": True}}
    for i in range(int(rng.integers(1, 9))):
        tau = float(rng.uniform(1.0, 7.0))
        rows[f"m{i}"] = {"tau": tau, "speedup": None if rng.random() < 0.15 else float(tau * rng.uniform(0.2, 1.1)),
                         "lossless": bool(rng.random() > 0.2)}
    return rows


def check_speedup_per_tau(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(rows)`: rows maps a method to {"tau", "speedup", "lossless"} (speedup against the plain
    decoding of the method's own engine, None where not measured); returns {method: speedup / tau}
    for every lossless method with a speed-up, and nothing for the others."""
    def call(rows: dict) -> dict:
        try:
            out = fn(copy.deepcopy(rows))
        except ZeroDivisionError as error:
            raise ExerciseError("division by zero on `ar` (τ = 1, nothing accepted): you divided by the accepted "
                                "drafts per cycle, τ - 1; τ counts the bonus token too, so divide by τ") from error
        except TypeError as error:
            raise ExerciseError(f"TypeError ({error}): a row whose speedup is None (not measured) must be left out, "
                                "not divided") from error
        if not isinstance(out, dict):
            raise ExerciseError(f"return a dict {{method: speedup / tau}}, got {type(out).__name__}")
        return out

    edge = {"ar": {"tau": 1.0, "speedup": 1.0, "lossless": True},
            "eagle2": {"tau": 1.95, "speedup": 1.60, "lossless": True},
            "sd": {"tau": 1.30, "speedup": None, "lossless": True},
            "judge": {"tau": 3.24, "speedup": 1.60, "lossless": False}}
    got = call(edge)
    if "judge" in got:
        raise ExerciseError("`judge` is lossy (lossless False) and is in your result: its τ counts tokens the target "
                            "would not have written, so speed-up / τ compares nothing; leave lossy rows out")
    if "sd" in got:
        raise ExerciseError("`sd` has no speed-up (None) and is in your result: leave rows without a speed-up out")
    for method in ("ar", "eagle2"):
        if method not in got:
            raise ExerciseError(f"`{method}` is lossless with a speed-up, and is missing from your result")
    value = float(got["eagle2"])
    if math.isclose(value, 1.95 / 1.60, rel_tol=1e-9):
        raise ExerciseError("eagle2 (τ 1.95, speed-up 1.60x): you gave τ / speed-up; the share is speed-up / τ, "
                            "at most about 1 when a cycle costs at least one target step")
    if math.isclose(value, 1.60 / 0.95, rel_tol=1e-9):
        raise ExerciseError("eagle2 (τ 1.95, speed-up 1.60x): you divided by the accepted drafts per cycle (τ - 1); "
                            "τ counts the bonus token too, so divide by τ")
    if not math.isclose(float(got["ar"]), 1.0, rel_tol=1e-12):
        raise ExerciseError(f"ar (τ 1, speed-up 1x) must give 1.0, you gave {got['ar']}")
    if not math.isclose(value, 1.60 / 1.95, rel_tol=1e-12):
        raise ExerciseError(f"eagle2 (τ 1.95, speed-up 1.60x): the reference gives {1.60 / 1.95:.4f}, you gave "
                            f"{value:.4f}")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        rows = _random_rows(rng)
        want, got = _share_reference(rows), call(rows)
        if set(got) != set(want):
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            raise ExerciseError(f"case {case}: methods {extra} should not be in the result (lossy, or no speed-up)"
                                if extra else f"case {case}: lossless methods with a speed-up are missing: {missing}")
        for m, w in want.items():
            if not math.isclose(float(got[m]), w, rel_tol=1e-9):
                raise ExerciseError(f"case {case}, {m} (τ {rows[m]['tau']:.3f}, speed-up {rows[m]['speedup']:.3f}x): "
                                    f"the reference gives {w:.4f}, you gave {float(got[m]):.4f}")
    print(f"speedup_per_tau: right on {cases} random tables and the edge cases (ar, a lossy row, a row without a "
          f"speed-up); e.g. τ 1.95 at 1.60x keeps {1.60 / 1.95:.0%} of τ")


# ---- (b) the batch cost model ------------------------------------------------------------------

def _batch_reference(tau: float, latency: dict, n: int, draft: float, scaling: str) -> dict:
    out = {}
    for b in sorted({b for b, _ in latency}):
        grow = latency[(b, 1)] / latency[(1, 1)] if scaling == "batched" else b
        out[b] = tau * latency[(b, 1)] / (latency[(b, n)] + draft * grow)
    return out


def _latency_case(rng: np.random.Generator) -> tuple[dict, int]:
    """T(b, k) of a machine with a fixed cost per forward and a cost per row that grows past a knee."""
    n = int(rng.integers(2, 40))
    fixed, per_row, knee = rng.uniform(5e-3, 3e-2), rng.uniform(1e-5, 1e-3), rng.uniform(4, 200)
    batches = [1] + sorted({int(b) for b in rng.choice([2, 3, 4, 8, 16, 32, 64], size=int(rng.integers(1, 6)))})
    latency = {}
    for b in batches:
        for k in (1, n):
            rows = b * k
            latency[(b, k)] = float(fixed + per_row * max(rows, knee) * rng.uniform(0.95, 1.05))
    return latency, n


def check_batch_speedup(fn: Callable, cases: int = 200, seed: int = 0) -> None:
    """`fn(tau, latency, n, draft_seconds, scaling)` with latency {(b, k): seconds} for k in (1, n):
    returns {b: tau * T(b, 1) / (T(b, n) + draft(b))} for every batch size b of `latency`, draft(b)
    = draft_seconds * T(b, 1) / T(1, 1) ("batched") or draft_seconds * b ("serial"); ValueError for
    any other scaling."""
    def call(*args) -> dict:
        out = fn(*args)
        if not isinstance(out, dict):
            raise ExerciseError(f"return a dict {{batch size: speed-up}}, got {type(out).__name__}")
        return out

    # a machine where the forward's cost doubles from batch 1 to 8 and the tree costs 1.5 steps at batch 8
    latency = {(1, 1): 0.020, (1, 6): 0.022, (8, 1): 0.040, (8, 6): 0.060}
    tau, draft = 3.0, 0.004
    for scaling in ("batched", "serial"):
        want, got = _batch_reference(tau, latency, 6, draft, scaling), call(tau, latency, 6, draft, scaling)
        if sorted(got) != [1, 8]:
            raise ExerciseError(f"one speed-up per batch size in `latency` (1 and 8), got keys {sorted(got)}")
        value = float(got[8])
        if math.isclose(value, want[8], rel_tol=1e-9):
            continue
        other = _batch_reference(tau, latency, 6, draft, "serial" if scaling == "batched" else "batched")[8]
        guesses = [
            (tau * 0.040 / 0.060, "the drafting cost is left out: a cycle is the verification forward T(b, n) plus "
                                  "drafting, draft(b)"),
            (other, f"at batch 8 with scaling {scaling!r} you grew drafting as the other assumption does: 'batched' "
                    "grows it like the target's one-token step, T(b, 1) / T(1, 1); 'serial' grows it as b"),
            (tau * 0.020 / (0.060 + draft * (2 if scaling == "batched" else 8)),
             "the numerator is AR's step at the same batch size, T(b, 1), not T(1, 1)"),
            ((tau - 1) * 0.040 / (0.060 + draft * (2 if scaling == "batched" else 8)),
             "τ counts the bonus token: use τ, not τ - 1"),
        ]
        why = next((text for guess, text in guesses if math.isclose(value, guess, rel_tol=1e-9)),
                   "compare with τ · T(b, 1) / (T(b, n) + draft(b))")
        raise ExerciseError(f"τ 3, draft(1) 4 ms, T(8, 1) 40 ms, T(8, 6) 60 ms, scaling {scaling!r}: the reference "
                            f"gives {want[8]:.4f}x at batch 8, you gave {value:.4f}x; {why}")
    try:
        fn(tau, latency, 6, draft, "linear")
    except ValueError:
        pass
    else:
        raise ExerciseError("scaling 'linear' must raise ValueError: only 'batched' and 'serial' are defined")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        latency, n = _latency_case(rng)
        tau, draft = float(rng.uniform(1.0, 6.0)), float(rng.uniform(0.0, 0.02)) if case % 5 else 0.0
        for scaling in ("batched", "serial"):
            want, got = _batch_reference(tau, latency, n, draft, scaling), call(tau, latency, n, draft, scaling)
            if sorted(got) != sorted(want):
                raise ExerciseError(f"case {case}: one speed-up per batch size in `latency` ({sorted(want)}), "
                                    f"got {sorted(got)}")
            for b, w in want.items():
                if not math.isclose(float(got[b]), w, rel_tol=1e-9):
                    raise ExerciseError(f"case {case} (τ {tau:.3f}, n {n}, draft(1) {draft * 1e3:.2f} ms, {scaling}): "
                                        f"at batch {b} the reference gives {w:.4f}x, you gave {float(got[b]):.4f}x")
    print(f"predicted_batch_speedup: right at every batch size on {cases} random machines under both drafting "
          "assumptions, and the edge cases (no drafting cost, an unknown scaling)")


# ---- (c) the first batch size where speculation is slower than AR ---------------------------------

def _first_slower_reference(speedups: dict) -> int | None:
    return min((b for b, s in speedups.items() if s < 1.0), default=None)


def check_first_slower_batch(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(speedups)` with speedups {b: speed-up over AR at batch b}, in any order: the smallest b
    whose speed-up is below 1, or None."""
    edges = [
        ({4: 0.9, 1: 1.3, 2: 1.1, 8: 0.7}, "the dict is not sorted by b: the smallest b below 1 is 4, not the first "
                                             "one you met"),
        ({1: 1.2, 2: 1.0, 4: 0.8}, "a speed-up of exactly 1 is not slower than AR: compare with < 1, not <= 1"),
        ({1: 1.4, 2: 1.2, 4: 1.05}, "no batch size is slower here: return None"),
        ({1: 1.1, 2: 0.9, 4: 1.02, 8: 0.8}, "a curve may cross back above 1 (measurements are noisy): return the "
                                             "first b below 1, here 2"),
        ({1: 1.3, 2: 1.1, 4: 0.95}, "return the first batch size below 1 (4), not the last one at or above 1 (2) "
                                     "nor its speed-up"),
    ]
    rng = np.random.default_rng(seed)
    for case in range(cases):
        sizes = [int(b) for b in rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32], size=int(rng.integers(1, 8)),
                                            replace=False)]
        edges.append(({b: float(rng.uniform(0.5, 1.6)) for b in sizes}, "compare with the smallest b whose speed-up "
                                                                          "is below 1"))
    for speedups, why in edges:
        want, got = _first_slower_reference(speedups), fn(dict(speedups))
        if got != want:
            shown = ", ".join(f"{b}: {s:.2f}" for b, s in speedups.items())
            raise ExerciseError(f"for {{{shown}}} the answer is {want}, you gave {got!r}; {why}")
    print(f"first_slower_batch: right on {len(edges) - cases} edge cases (unordered sizes, a speed-up of exactly 1, "
          f"no crossing, a curve that crosses back) and {cases} random curves")
