"""The cost side of the predicted speed-up (formula in lab/costmodel/__init__.py): the T(n) rounds
and curve, the verification pass a commit is timed after, the speed-up for one sequence or a batch."""
from __future__ import annotations

from typing import Callable

from ..errors import LabError
from ..measure import cropped_forwards


def verification_pass(target, prefix: int = 300, n: int = 4, seed: int = 0) -> Callable[[], None]:
    """One tree-masked forward over `n` positions after a cached `prefix`, cropped again, as a function:
    what decoding runs between two commits of the head."""
    return cropped_forwards(target, [(n, True)], prefix, seed)[(n, True)]


def monotone(latency: dict[int, float]) -> dict[int, float]:
    """The closest non-decreasing curve to measured T(n) (least squares, pool-adjacent-violators).
    A modelling choice: T(n) need not be monotone, but a dip from timing noise must not decide the tree."""
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for n in sorted(latency):
        blocks.append([latency[n], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(sorted(latency), values))


SPREAD_TOLERANCE = 0.25  # the two fastest rounds of T(n) may differ this much before tuning re-measures


def spread(rounds: list[dict[int, float]]) -> dict[int, float]:
    """Per size n, how far apart the two fastest rounds' T(n) are (second / first - 1)."""
    return {n: (lambda t: t[1] / t[0] - 1)(sorted(r[n] for r in rounds)) for n in rounds[0]}


class BusyMachine(LabError):
    """Timing rounds that never agreed: the machine was busy, and no tree may be chosen from them."""

    def __init__(self, message: str, rounds: int):
        super().__init__(message)
        self.rounds = rounds


def agreeing_rounds(rounds: list[dict[int, float]], measure: Callable[[], dict[int, float]], extra: int = 2,
                    tolerance: float = SPREAD_TOLERANCE) -> list[dict[int, float]]:
    """The rounds, once every n's fastest T(n) is reproduced by another within `tolerance` (a busy machine
    makes rounds disagree). Adds up to `extra` rounds from `measure`, then raises BusyMachine."""
    for attempt in range(extra + 1):
        n, worst = max(spread(rounds).items(), key=lambda kv: kv[1])
        if worst <= tolerance:
            return rounds
        if attempt < extra:
            rounds = rounds + [measure()]
    raise BusyMachine(f"the fastest two timings of T({n}) differ by {worst:.0%} after {len(rounds)} rounds "
                      f"(tolerance {tolerance:.0%}): the machine is busy; stop other jobs and rerun "
                      "`python -m lab tune tree`, or pass --eagle-tree", len(rounds))


def predicted_speedup(row: dict, latency: dict[int, float], commit: float, ar_forward: float, loop: float,
                      prefill: float) -> float:
    """t_AR / t_spec (lab/costmodel/__init__.py) for one tree `row` (its tau and drafting time)."""
    cycle = latency[row["total_tokens"]] + row["draft_seconds"] + commit + loop
    return (prefill + ar_forward + loop) / (prefill + cycle / row["tau"])


def batch_speedups(tau: float, latency: dict[tuple[int, int], float], n: int, draft_seconds: float,
                   draft_scaling: str = "batched") -> dict[int, float]:
    """Predicted speed-up over AR per batch size b: tau * T(b, 1) / (T(b, n) + draft(b)), T(b, k) from
    `lab.measure.exact_batch_latency`, tau assumed independent of b, loop overhead left out. Drafting
    grows as assumed: `batched` by T(b, 1) / T(1, 1), `serial` by b (else ValueError)."""
    if draft_scaling not in ("batched", "serial"):
        raise ValueError(f"draft_scaling must be 'batched' or 'serial', got {draft_scaling!r}")
    out = {}
    for b in sorted({b for b, _ in latency}):
        grow = latency[(b, 1)] / latency[(1, 1)] if draft_scaling == "batched" else b
        out[b] = tau * latency[(b, 1)] / (latency[(b, n)] + draft_seconds * grow)
    return out
