"""The end-to-end runner (lab/bench/endtoend.py): resuming from a partial file, atomic complete
writes, one bench command per setting; the batch timing and the batch speed-up model."""
import dataclasses
import json

import pytest

import lab.bench.endtoend as e2e
from lab.bench.endtoend import (Setting, bench_command, format_end_to_end, methods_for, parse_settings, prepare,
                                run_end_to_end)
from lab.bench.options import EndToEndOptions
from lab.cli import build_parser
from lab.costmodel import batch_speedups

ARGV = ["--target", "tiny", "--methods", "ar,sd", "--limit", "1", "--max-new-tokens", "4", "--seed", "0"]


@pytest.fixture(scope="module")
def loaded():
    """The tiny target and its draft, loaded once as `endtoend` loads them."""
    return prepare(ARGV + ["--settings", "mt_bench:0"])


def with_settings(options: EndToEndOptions, settings: str, **changes) -> EndToEndOptions:
    return dataclasses.replace(options, settings=settings, **changes)


class Spy:
    """Wraps run_bench: records the temperature of every setting it runs; can fail on a call."""

    def __init__(self, fail_on: int | None = None):
        self.temperatures, self.fail_on = [], fail_on

    def __call__(self, methods, prompts, setup, config, *rest, **kwargs):
        if self.fail_on is not None and len(self.temperatures) == self.fail_on:
            raise KeyboardInterrupt("interrupted")
        self.temperatures.append(config["temperature"])
        return e2e_run_bench(methods, prompts, setup, config, *rest, **kwargs)


e2e_run_bench = e2e.run_bench


def test_a_partial_files_settings_are_not_run_again(loaded, tmp_path, monkeypatch):
    args, setup = loaded
    path = tmp_path / "end_to_end.json"
    first = run_end_to_end(with_settings(args, "mt_bench:0"), setup, path, progress=False)
    spy = Spy()
    monkeypatch.setattr(e2e, "run_bench", spy)
    both = run_end_to_end(with_settings(args, "mt_bench:0,mt_bench:1"), setup, path, progress=False)
    assert spy.temperatures == [1.0]  # only the setting the file lacked
    assert both["settings"]["mt_bench/T0"] == first["settings"]["mt_bench/T0"]  # kept as it was
    assert list(both["settings"]) == ["mt_bench/T0", "mt_bench/T1"]
    run_end_to_end(with_settings(args, "mt_bench:1,mt_bench:0"), setup, path, progress=False)
    assert spy.temperatures == [1.0]  # everything held: nothing runs


def test_a_setting_recorded_with_other_options_or_methods_is_run_again(loaded, tmp_path, monkeypatch):
    args, setup = loaded
    path = tmp_path / "end_to_end.json"
    run_end_to_end(with_settings(args, "mt_bench:0"), setup, path, progress=False)
    spy = Spy()
    monkeypatch.setattr(e2e, "run_bench", spy)
    longer = run_end_to_end(with_settings(args, "mt_bench:0", max_new_tokens=6), setup, path, progress=False)
    assert spy.temperatures == [0.0]
    assert longer["settings"]["mt_bench/T0"]["config"]["max_new_tokens"] == 6
    run_end_to_end(with_settings(args, "mt_bench:0", max_new_tokens=6, methods="ar"), setup, path, progress=False)
    assert spy.temperatures == [0.0, 0.0]


def test_an_interrupted_run_leaves_a_whole_file_that_the_next_run_completes(loaded, tmp_path, monkeypatch):
    args, setup = loaded
    path = tmp_path / "end_to_end.json"
    monkeypatch.setattr(e2e, "run_bench", Spy(fail_on=1))
    with pytest.raises(KeyboardInterrupt):
        run_end_to_end(with_settings(args, "mt_bench:0,mt_bench:1"), setup, path, progress=False)
    partial = json.loads(path.read_text())  # valid JSON: written whole, then renamed
    assert list(partial["settings"]) == ["mt_bench/T0"]
    done = partial["settings"]["mt_bench/T0"]
    assert set(done["methods"]) == {"ar", "sd"} and len(done["methods"]["sd"]["per_prompt"]) == 1
    assert {"machine", "commit", "command", "run_by", "config"} <= set(done)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    spy = Spy()
    monkeypatch.setattr(e2e, "run_bench", spy)
    whole = run_end_to_end(with_settings(args, "mt_bench:0,mt_bench:1"), setup, path, progress=False)
    assert spy.temperatures == [1.0]
    assert json.loads(path.read_text()) == whole


def test_each_setting_records_the_bench_command_that_reruns_it(loaded, tmp_path):
    args, setup = loaded
    result = run_end_to_end(with_settings(args, "humaneval:1"), setup, tmp_path / "e.json", progress=False)
    command = result["settings"]["humaneval/T1"]["command"]
    parsed = build_parser().parse_args(command.split()[3:])
    assert (parsed.command, parsed.dataset, parsed.temperature, parsed.methods) == ("bench", "humaneval", 1.0, "ar,sd")
    assert (parsed.limit, parsed.max_new_tokens, parsed.target) == (1, 4, "tiny")


def test_lossy_rules_run_greedy_only():
    assert methods_for(Setting("mt_bench", 0.0), ["ar", "judge", "topk"]) == (["ar", "judge", "topk"], {})
    names, left_out = methods_for(Setting("mt_bench", 1.0), ["ar", "judge", "eagle2", "topk"])
    assert names == ["ar", "eagle2"] and set(left_out) == {"judge", "topk"}


def test_settings_parse_and_bad_ones_fail_in_one_line():
    from lab.errors import LabError
    assert parse_settings("mt_bench:0, humaneval:1") == [Setting("mt_bench", 0.0), Setting("humaneval", 1.0)]
    assert Setting("sharegpt_heldout", 1.0).key == "sharegpt_heldout/T1"
    with pytest.raises(LabError, match="dataset:temperature"):
        parse_settings("mt_bench:hot")


def test_bench_command_replaces_settings_and_json():
    options = EndToEndOptions(methods="ar,judge", settings="mt_bench:0,mt_bench:1", json="x.json", dtype="bfloat16")
    assert bench_command(options, Setting("mt_bench", 1.0), ["ar"]) == \
        "python -m lab bench --methods ar --dataset mt_bench --temperature 1 --dtype bfloat16"


def test_a_bad_endtoend_argument_is_a_one_line_error():
    from lab.errors import LabError
    with pytest.raises(LabError, match="does not take --no-such-flag"):
        prepare(["--no-such-flag", "1"])


def test_the_table_marks_lossy_methods_and_missing_cells():
    def row(tau, speedup, lossless=True, identical=True):
        return {"tau": tau, "speedup": speedup, "lossless": lossless, "identical_to_ar": identical,
                "numerical_ties": 0, "per_prompt": [{"identical_to_ar": identical}]}
    result = {"settings": {"mt_bench/T0": {"methods": {"ar": row(1, 1), "judge": row(3, 1.5, False, False),
                                                       "eagle2": row(2, 1.4, identical=False)}},
                           "mt_bench/T1": {"methods": {"ar": row(1, 1, identical=None)}}}}
    table = format_end_to_end(result)
    assert "| judge (lossy) | 3.00 / 1.50x | - |" in table
    assert "| eagle2 | 2.00 / 1.40x (not identical) | - |" in table
    assert "| ar | 1.00 / 1.00x | 1.00 / 1.00x |" in table


def test_exact_batch_latency_times_every_batch_and_size(monkeypatch):
    import torch

    from lab.measure import exact_batch_latency
    from lab.target.exact import ExactEngine
    from lab.target.load import tiny_target
    crops = []
    real_crop = ExactEngine.crop
    monkeypatch.setattr(ExactEngine, "crop", lambda self, k: (crops.append(k), real_crop(self, k))[1])
    out = exact_batch_latency(tiny_target(0).to(torch.bfloat16), [1, 3], [1, 5], prefix=8, repeats=2)
    assert set(out) == {(1, 1), (1, 5), (3, 1), (3, 5)}
    assert all(isinstance(t, float) and 0 < t < 10 for t in out.values())
    # every timed step (3 warm-ups + 2 repeats) takes every sequence back to its prefix
    assert crops == [8] * (5 * 1 * 2 + 5 * 3 * 2)


def test_batch_speedups_follow_the_formula():
    latency = {(1, 1): 1.0, (1, 6): 1.5, (4, 1): 2.0, (4, 6): 6.0}
    batched = batch_speedups(2.0, latency, 6, draft_seconds=0.5)
    serial = batch_speedups(2.0, latency, 6, draft_seconds=0.5, draft_scaling="serial")
    assert batched[1] == serial[1] == pytest.approx(2.0 * 1.0 / (1.5 + 0.5))
    assert batched[4] == pytest.approx(2.0 * 2.0 / (6.0 + 0.5 * 2.0))
    assert serial[4] == pytest.approx(2.0 * 2.0 / (6.0 + 0.5 * 4))
    with pytest.raises(ValueError):
        batch_speedups(2.0, latency, 6, 0.5, draft_scaling="free")


def test_heldout_prompts_are_the_regenerated_sets_prompts(tokenizer):
    from lab.data import chat_ids, load_prompts
    from lab.data import load_regen
    prompts = load_prompts("sharegpt_heldout", 8)
    heldout = load_regen().subset("heldout", 8)
    assert len(prompts) == 8
    for i, p in enumerate(prompts):
        assert chat_ids(tokenizer, p.text) == heldout.ids(i)[: heldout.prompt_lens[i]].tolist()


def test_results_page_shows_the_end_to_end_table(loaded, tmp_path, monkeypatch):
    import lab.results as results
    args, setup = loaded
    path = tmp_path / "end_to_end.json"
    result = run_end_to_end(with_settings(args, "mt_bench:0,mt_bench:1"), setup, path, progress=False)
    monkeypatch.setattr(results, "END_TO_END", path)
    section = results.render_results().split("\n## End to end\n", 1)[1].split("\n## ", 1)[0]
    assert format_end_to_end(result) in section
    for r in result["settings"].values():
        assert r["command"] in section  # each setting's own bench command
    assert "identical to ar" in section  # the greedy setting's check
    assert path not in results.bench_files()


def test_resumable_runs_keep_what_is_current_and_rerun_the_rest():
    from lab.artifacts import resumable_runs
    recorded = {"a": {"v": 1}, "b": {"v": 1}, "old": {"v": 0}}
    kept, todo, stale = resumable_runs(recorded, {"a": 1, "b": 2, "c": 3}, lambda r: r["v"])
    assert (list(kept), todo, stale) == (["a", "old"], ["b", "c"], ["b"])
    kept, _, stale = resumable_runs(recorded, {"a": 1}, lambda r: r["v"], keep_other=lambda n, r: False)
    assert (list(kept), stale) == (["a"], ["b", "old"])
