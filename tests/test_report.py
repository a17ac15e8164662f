"""Two methods compared over interleaved bench runs (lab.bench.report.compare_pair)."""
import pytest

from lab.bench.report import compare_pair


def _run(seconds_b: float, speedup_b: float, identical: bool = True) -> dict:
    def method(tau: float, seconds: float, speedup: float) -> dict:
        prompts = [{"token_ids": [0] * 10, "tau": tau, "seconds": seconds} for _ in range(3)]
        return {"tau": tau, "speedup": speedup, "identical_to_ar": identical, "per_prompt": prompts}
    return {"methods": {"eagle2": method(2.0, 1.0, 1.2), "eagle3": method(2.5, seconds_b, speedup_b)}}


def test_the_pair_reads_tau_from_forwards_and_speed_from_the_median_run():
    runs = [_run(0.5, 2.4), _run(1.0, 1.2), _run(0.8, 1.5)]  # eagle3 / eagle2 speed: 2.0, 1.0, 1.25 by run
    pair = compare_pair(runs)
    assert pair["tau_ratio"][0] == pytest.approx(1.25)  # 5 forwards a prompt against 4
    assert pair["speed_ratio"][0] == pytest.approx(1.25)  # the median run's ratio, not the mean (1.42)
    assert pair["median_speedup"] == {"eagle2": 1.2, "eagle3": 1.5} and (pair["prompts"], pair["runs"]) == (3, 3)
    low, high = pair["tau_ratio"][1:]
    assert low == pytest.approx(1.25) and high == pytest.approx(1.25)  # identical prompts: no spread


def test_a_pair_whose_outputs_left_ar_is_refused():
    with pytest.raises(ValueError, match="reproduce AR"):
        compare_pair([_run(0.5, 2.4, identical=False)])
