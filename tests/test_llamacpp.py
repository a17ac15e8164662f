"""llama.cpp's configurations (lab/bench/llamacpp.py) without llama.cpp itself: the one-line
refusals where `make peers` has not run, and repeated runs summarised by medians of ratios taken
within each run (a mean, or a ratio of medians, gives other numbers on the planted runs)."""
import sys

import pytest

import lab.bench.llamacpp as llamacpp
from lab.bench.llamacpp import gguf_file, llamacpp_headline
from lab.bench.setup import LLAMACPP_METHODS
from lab.bench.report import format_repeats
from lab.errors import LabError


def _run(speeds: dict[str, float]) -> dict:
    return {"methods": {m: {"tokens_per_s": s} for m, s in speeds.items()}}


# three runs in which the machine drifts: eagle2 / llamacpp-q4_0 is 0.5, 0.6 and 0.9 within the runs
RUNS = [_run({"ar": 50, "eagle2": 50, "llamacpp": 80, "llamacpp-q4_0": 100, "llamacpp-bf16": 40, "llamacpp-pld": 70}),
        _run({"ar": 40, "eagle2": 60, "llamacpp": 90, "llamacpp-q4_0": 100, "llamacpp-bf16": 50, "llamacpp-pld": 75}),
        _run({"ar": 60, "eagle2": 90, "llamacpp": 95, "llamacpp-q4_0": 100, "llamacpp-bf16": 60, "llamacpp-pld": 80})]


def test_repeated_runs_report_medians_of_ratios_within_runs():
    table = format_repeats(RUNS)
    assert "| llamacpp-q4_0 | 100.0 | 100.0 | 100.0 | 100.0 | 0.60x |" in table  # the mean would be 0.67x
    assert "| ar | 50.0 | 40.0 | 60.0 | 50.0 | 1.50x |" in table  # the ratio of medians would be 1.20x
    line = llamacpp_headline(RUNS)
    # ar / llamacpp is 0.625, 0.444 and 0.632 within the runs: the median 0.62x (the ratio of medians 0.56x)
    assert "`ar` 50 tok/s (0.62x llama.cpp's greedy decoding of the same Q4_1 file, 90 tok/s)" in line
    assert "`llamacpp-q4_0`, 100 tok/s (`eagle2` 0.60x it)" in line and "`eagle2` 60 tok/s (0.67x it)" in line


def test_the_llama_cpp_methods_say_what_to_run_without_make_peers(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    with pytest.raises(LabError, match="make peers"):
        llamacpp.llamacpp_runner(None, "llamacpp")
    monkeypatch.setattr(llamacpp, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(llamacpp, "SOURCE", tmp_path / "llama.cpp")
    with pytest.raises(LabError, match="convert_hf_to_gguf.py is missing: run `make peers`"):
        gguf_file("bf16")
    assert not list(tmp_path.rglob("*.gguf")), "a failed conversion leaves no file behind"
    assert set(LLAMACPP_METHODS) == {"llamacpp", "llamacpp-q4_0", "llamacpp-bf16", "llamacpp-pld"}
