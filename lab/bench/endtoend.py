"""`python -m lab endtoend`: every method on several datasets and temperatures, one JSON, resumable.

The end-to-end comparison (notebook 08) is `python -m lab bench` run once per setting (a dataset
at a temperature) on models loaded once. Each setting's result is exactly what `bench --json`
would write for it, with `command` replaced by the single `bench` command that reruns that
setting alone (so RESULTS.md can print it like any benchmark) and `run_by` the command that ran
it. After each setting the whole file is rewritten atomically, so an interrupted run leaves a
valid file holding the settings that finished, and the next run with the same options skips
them (a setting run with other options is run again and replaced).

Why per setting and not per prompt: `bench` interleaves the methods prompt by prompt so that a
drifting machine slows them all alike; a setting cut in half would mix two machine states.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..artifacts import git_commit, machine, read_results, resumable_runs, write_json
from ..data import load_prompts
from ..errors import LabError
from ..options import add_options, flags, from_args, recorded
from ..paths import DATA_DIR, results_file
from ..sampling import Sampling
from .options import EndToEndOptions, method_list
from .run import run_bench
from .setup import LOSSY_METHODS, Setup, load_setup

RESULTS_FILE = DATA_DIR / "results" / "end_to_end.json"
# Options of the run that are not what a setting's numbers depend on: where they are written, which
# settings and methods are in the run (a setting brings its own temperature).
_NOT_FINGERPRINT = ("json", "settings", "methods", "temperature")

# The EAGLE-3 paper's Table 1 (temperature 0): (model, benchmark) -> (speed-up, tau). Measured on
# GPUs with 8B and 13B targets: a reference point, not something this lab reproduces.
PAPER_TABLE1 = {
    ("LLaMA-3.1-8B", "MT-Bench"): (4.40, 6.13), ("LLaMA-3.1-8B", "HumanEval"): (4.85, 6.74),
    ("LLaMA-3.1-8B", "GSM8K"): (4.48, 6.23), ("LLaMA-3.1-8B", "Alpaca"): (4.82, 6.70),
    ("LLaMA-3.1-8B", "CNN/DM"): (3.65, 5.34),
    ("Vicuna-13B", "MT-Bench"): (5.58, 6.65), ("Vicuna-13B", "HumanEval"): (6.47, 7.54),
    ("Vicuna-13B", "GSM8K"): (5.32, 6.29),
}
PAPER_EAGLE2 = {("LLaMA-3.1-8B", "MT-Bench"): (3.16, 4.05)}  # the paper's EAGLE-2 row, same setting
# Throughput speed-up of EAGLE-3 against no speculation by batch size, as the paper reports it
# for serving engines (H100, LLaMA-3.1-8B, MT-Bench): only these points are given.
PAPER_SERVING = {
    "SGLang v0.4.4": {2: 1.81, 64: 1.38},
    "vLLM": {2: 1.75, 56: 1.01},
}
PAPER_SERVING_NOTE = "SGLang: EAGLE (not EAGLE-3) falls below 1x from batch 24"


@dataclass(frozen=True)
class Setting:
    dataset: str
    temperature: float

    @property
    def key(self) -> str:
        """How the setting is named in the JSON, e.g. `mt_bench/T0`."""
        return f"{self.dataset}/T{self.temperature:g}"


def parse_settings(text: str) -> list[Setting]:
    """`mt_bench:0,humaneval:1` -> settings, in the order given."""
    settings = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        dataset, _, temperature = item.partition(":")
        try:
            settings.append(Setting(dataset, float(temperature)))
        except ValueError:
            raise LabError(f"--settings takes dataset:temperature pairs (e.g. mt_bench:0,humaneval:1), got {item!r}") \
                from None
    if not settings:
        raise LabError("--settings is empty: give dataset:temperature pairs, e.g. mt_bench:0,humaneval:1")
    return settings


def methods_for(setting: Setting, methods: list[str]) -> tuple[list[str], dict[str, str]]:
    """The methods a setting runs, and why any are left out: the lossy rules (judge, topk) are
    defined for greedy decoding only (lab/decode.py refuses them when sampling)."""
    if setting.temperature == 0:
        return list(methods), {}
    left_out = {m: "greedy only: its acceptance rule is defined at temperature 0"
                for m in methods if m in LOSSY_METHODS}
    return [m for m in methods if m not in left_out], left_out


def results_path() -> Path:
    """data/results/end_to_end.json at full size, a gitignored file in fast mode."""
    return results_file(RESULTS_FILE.name)


def bench_command(options: EndToEndOptions, setting: Setting, methods: list[str]) -> str:
    """The `python -m lab bench` command that reruns one setting of the `endtoend` run `options`."""
    own = flags(options, skip=("settings", "methods", "json", "temperature"))
    return shlex.join(["python", "-m", "lab", "bench", "--methods", ",".join(methods), "--dataset", setting.dataset,
                       "--temperature", f"{setting.temperature:g}", *own])


def prepare(argv: list[str]) -> tuple[EndToEndOptions, Setup]:
    """Parse an `endtoend` argument list and load the models every method needs, once; notebook
    08 runs `run_end_to_end` on what this returns. A bad --settings fails before any loading."""
    parser = add_options(argparse.ArgumentParser(prog="python -m lab endtoend", exit_on_error=False),
                         EndToEndOptions)
    try:
        args, unknown = parser.parse_known_args([a for a in argv if a != "endtoend"])
    except argparse.ArgumentError as err:
        raise LabError(f"endtoend: {err}") from None
    if unknown:
        raise LabError(f"endtoend does not take {' '.join(unknown)}: see `python -m lab endtoend --help`")
    options = from_args(EndToEndOptions, args)
    parse_settings(options.settings)
    return options, load_setup(options, method_list(options.methods))


def _fingerprint(options: EndToEndOptions) -> dict:
    """The options a setting's numbers depend on, as JSON would give them back (tuples as lists)."""
    return json.loads(json.dumps({k: v for k, v in sorted(recorded(options).items()) if k not in _NOT_FINGERPRINT}))


def load_partial(path: Path) -> dict:
    """The settings an earlier run finished (empty if there is no file yet)."""
    return (read_results(path) or {}).get("settings", {})


def run_end_to_end(options: EndToEndOptions, setup: Setup, path: Path | None = None, progress: bool = True) -> dict:
    """Run `options.methods` on every setting of `options.settings` (dataset, temperature) with the
    models of `setup`, `options.limit` prompts each; skip settings `path` already holds from a run
    with the same options; rewrite `path` atomically after each setting. Returns the whole file."""
    methods = method_list(options.methods)
    settings = parse_settings(options.settings)
    path = Path(path or options.json or results_path())
    fingerprint = _fingerprint(options)
    done = load_partial(path)
    # a setting is kept if it ran with the same options and the same methods; others run again
    wanted = {s.key: (methods_for(s, methods)[0], fingerprint) for s in settings}
    kept, todo_keys, stale = resumable_runs(
        done, wanted, lambda r: (list(r["methods"]), r.get("endtoend", {}).get("fingerprint")))
    todo = [s for s in settings if s.key in todo_keys]
    if progress and set(kept) & set(wanted):
        print(f"[endtoend] {path}: {len(wanted) - len(todo)} setting(s) kept from an earlier run with the same "
              f"options: {', '.join(k for k in kept if k in wanted)}; {len(todo)} to run", flush=True)
    if progress and stale:
        print(f"[endtoend] rerunning {', '.join(stale)}: recorded with other options or methods", flush=True)
    prompts = {s.key: load_prompts(s.dataset, options.limit) for s in todo}
    result = {"kind": "end_to_end", "command": shlex.join(["python", "-m", "lab", "endtoend", *flags(options)]),
              "settings": dict(kept)}
    bar = tqdm(total=sum(len(p) for p in prompts.values()), desc="end to end (prompts)", unit="prompt",
               disable=not progress)
    for setting in todo:
        names, left_out = methods_for(setting, methods)
        bar.set_postfix_str(setting.key)
        one = dataclasses.replace(setup, sampling=Sampling(setting.temperature, options.top_k, options.top_p))
        config = {**fingerprint, "dataset": setting.dataset, "temperature": setting.temperature}
        r = run_bench(names, prompts[setting.key], one, config, options.draft_layers, progress=False,
                      on_prompt=lambda *_: bar.update())
        r["run_by"], r["command"] = r["command"], bench_command(options, setting, names)
        r["endtoend"] = {"setting": dataclasses.asdict(setting), "fingerprint": fingerprint, "left_out": left_out}
        result["settings"][setting.key] = r
        # the settings in the order asked for, then any others the file held
        order = [s.key for s in settings] + [k for k in result["settings"] if k not in [s.key for s in settings]]
        result["settings"] = {k: result["settings"][k] for k in order if k in result["settings"]}
        result.update(commit=git_commit(), machine=machine())
        write_json(path, result)
    bar.close()
    if not todo:  # nothing ran: the file stays as it was
        result = json.loads(path.read_text())
    return result


def format_end_to_end(result: dict) -> str:
    """One row per method, one column per setting: tau and speed-up over AR, `-` where the method
    did not run (a lossy rule at T > 0). Lossy methods are marked; a lossless method whose greedy
    tokens differed from AR's (other than numerical ties) is flagged."""
    settings = result["settings"]
    methods: list[str] = []
    for r in settings.values():
        methods += [m for m in r["methods"] if m not in methods]
    lines = ["| method | " + " | ".join(f"{k} τ / speed-up" for k in settings) + " |",
             "|---|" + "---|" * len(settings)]
    for m in methods:
        cells, lossy = [], False
        for r in settings.values():
            s = r["methods"].get(m)
            if s is None:
                cells.append("-")
                continue
            lossy |= not s.get("lossless", True)
            differing = sum(1 for p in s["per_prompt"] if p["identical_to_ar"] is False)
            flag = " (not identical)" if s.get("lossless", True) and differing > s["numerical_ties"] else ""
            cells.append(f"{s['tau']:.2f} / {s['speedup']:.2f}x{flag}" if s.get("speedup") else f"{s['tau']:.2f}")
        lines.append(f"| {m}{' (lossy)' if lossy else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
