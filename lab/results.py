"""RESULTS.md: every benchmark and shipped artifact, rendered from the JSON files under data/.

Why generated: numbers copied into prose by hand go stale as soon as a benchmark is rerun or a
head retrained. Each benchmark JSON (`python -m lab bench --json ...`) and each artifact's
manifest already records the command, commit and machine that produced it, so the page is
rendered from those files alone (and `figures/manifest.json`, which `make figures` writes, for
the notebooks' full-size times, also shown in a generated line of the README's notebook map),
and a test fails when the committed page differs from a fresh render. After rerunning
anything: `python -m lab.results` (or `make results`)."""
from __future__ import annotations

import json
from pathlib import Path

from .artifacts import atomic_write, ignored_by_git, repo_path
from .bench import format_table, head_file, verification_line
from .bench.batch import batch_headline, format_batch_table
from .bench.endtoend import format_end_to_end
from .bench.fidelity import format_fidelity
from .bench.llamacpp import llamacpp_headline
from .bench.report import compare_pair, format_repeats
from .costmodel import choice_row
from .errors import LabError
from .experiments import EXPERIMENTS, experiment_of
from .figures import load_manifest
from .judge.sweep import QUALITY_FILE, QUALITY_HOW, format_quality, judge_bar, judge_heads, recorded_qualities
from .paths import DATA_DIR, ROOT

RESULTS_DIR = DATA_DIR / "results"
END_TO_END = RESULTS_DIR / "end_to_end.json"  # `make run E=end-to-end` (notebook 08 reads it): several settings
END_TO_END_HOW = ("`make run E=end-to-end` (resumable; on the exact bfloat16 engine) writes "
                  "`data/results/end_to_end.json`")
# Figures a manifest may hold (a dotted path reaches into nested objects); shown when present.
KEY_FIGURES = ("machine.gpu", "steps", "budget_minutes", "cpu_budget_minutes", "gpu_budget_minutes",
               "train.response_tokens",
               "heldout.prompts", "data.sharegpt_reply_tokens", "heldout_top1_agreement_before",
               "heldout_top1_agreement", "evaluation.evaluator_version", "evaluation.sequences",
               "evaluation.top1_by_depth.rate", "evaluation.top1_by_depth.chains",
               "evaluation.n_alpha_by_depth.rate",
               "layer", "delta", "val_auc_baselines.token_probability")
DEFINITIONS = (
    "**τ** = tokens emitted by verification forwards ÷ verification forwards (prefill excluded; ratio of totals "
    "over all prompts; AR has τ = 1). **tokens/s** = new tokens ÷ wall seconds, prefill included. **speedup** = "
    "tokens/s over `ar`'s in the same run. **acc@i** = acceptance of draft i given drafts 1..i-1 were accepted. "
    "**scoring** and **drafting** = the share of a method's time in verification cycles (the target's forward, "
    "acceptance, the cache update) and in the drafter's own calls. **identical** = the greedy token ids, up to and "
    "including EOS, equal `ar`'s on every prompt; a mismatch where `ar`'s top-2 logit gap is below 1e-4 is recorded "
    "as a numerical tie (batched and one-token arithmetic round differently), anything else is a bug.")
TREE_COLUMNS = ("depth", "top_k", "total_tokens", "draft_vocab", "predicted_tau", "predicted_speedup")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _number(v) -> str:
    if isinstance(v, list):
        return " / ".join(_number(x) for x in v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:.3f}"
    return "" if v is None else str(v)


def _dig(obj: dict, dotted: str):
    for key in dotted.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _commit(manifest: dict) -> str:
    sha, _, rest = manifest.get("commit", "unknown").partition("+")
    return f"`{sha[:7]}`" + (f" +{rest}" if rest else "")


def bench_files() -> list[Path]:
    """data/results/*.json in the registry's order (lab/experiments.py), then those kept by their
    recorded command alone, by name; less the end-to-end file and the judge's quality sweep, which
    have sections of their own. `make demo` writes to demo/, not here."""
    listed = [ROOT / step.out for experiment in EXPERIMENTS.values() for step in experiment.steps]
    rank = {path: i for i, path in enumerate(listed)}
    files = [p for p in RESULTS_DIR.glob("*.json") if p not in (END_TO_END, QUALITY_FILE)]
    return sorted(files, key=lambda p: (rank.get(p, len(rank)), p.name))


def rerun_line(path: Path) -> str:
    """How to make a result file again: its experiment, or the command recorded inside it."""
    made_by = experiment_of(repo_path(path))
    return f"`make run E={made_by[0]}`" if made_by else f"`python -m lab run --rerun {repo_path(path)}`"


def _bench_section(path: Path, result: dict) -> list[str]:
    m = result.get("machine", {})
    machine = f"{_machine(result)}, torch {m.get('torch', '?')}"
    if m.get("gpu"):
        machine += f", GPU {m['gpu']}"
    if "dtype" in result["config"]:
        machine += f", target in {result['config']['dtype']}"
    lines = [f"### {path.stem}", "", f"`{repo_path(path)}`, commit {_commit(result)}, {machine}; again: "
             f"{rerun_line(path)}.", "", "```bash", result["command"], "```", ""]
    for name, s in result["config"].get("methods", {}).items():
        if "tree" in s and "head" in s:  # an EAGLE method: which head file drafted
            lines.append(f"* `{name}`: {s['tree']}, depth {s['depth']}, top-k {_number(s['top_k']) or '-'}, "
                         f"{s['total_tokens']} tokens, head `{head_file(result, name)}`")
    lines += ([""] if lines[-1] else []) + [format_table(result), ""]
    return lines


def _batch_section(path: Path, result: dict) -> list[str]:
    """A `bench --batch-size` file: its command and the table the bench printed."""
    return [f"### {path.stem}", "", f"`{repo_path(path)}`, commit {_commit(result)}, {_machine(result)}, target in "
            f"{result['config']['dtype']}; again: {rerun_line(path)}.", "", "```bash", result["command"], "```", "",
            format_batch_table(result), ""]


def _catalogue() -> list[str]:
    lines = ["## Artifacts", "", "Every manifest under `data/` that names an artifact; an artifact marked *manifest "
             "only* does not ship (its command makes it again).", "",
             "| artifact | made by | commit | key figures |", "|---|---|---|---|"]
    manifests = {path: _load(path) for path in sorted(DATA_DIR.rglob("*.json"))}
    manifests = {path: m for path, m in manifests.items() if "artifact" in m}
    unshipped = ignored_by_git([ROOT / m["artifact"] for m in manifests.values()])
    for path, manifest in manifests.items():
        figures = [f"{key}: {_number(_dig(manifest, key))}" for key in KEY_FIGURES
                   if _dig(manifest, key) is not None]
        stages, init = [], manifest.get("init")
        while init:  # a head that continues an earlier one nests that one's manifest
            stages.append(f"`{init['manifest']['command']}` ({init['manifest'].get('steps')} steps)")
            init = init["manifest"].get("init")
        if stages:
            figures.append("continues " + ", which continues ".join(stages))
        shipped = "manifest only" if ROOT / manifest["artifact"] in unshipped else "manifest"
        lines.append(f"| `{manifest['artifact']}` ({shipped} `{repo_path(path)}`) | `{manifest['command']}` | "
                     f"{_commit(manifest)} | {'; '.join(figures)} |")
    return lines + [""]


def _tree_choices() -> list[str]:
    lines = ["## EAGLE tree choices", "", "The tree each `python -m lab tune tree` run chose and the cost "
             "model's prediction for it; `bench` and `generate` read the file named for their head and "
             "dtype (`lab.costmodel.choice_path`). `predicted_tau` is walked as decoding walks; "
             "`uniform_tau` is the same tree's average at uniformly drawn roots, which tuning screens "
             "with (a tuning from before the walk predicted from that average).", "",
             "| file | command | commit | head | dtype | " + " | ".join(TREE_COLUMNS) + " | uniform_tau |",
             "|" + "---|" * (6 + len(TREE_COLUMNS))]
    for path in sorted(DATA_DIR.glob("eagle/tree_choice*.json")):
        t = _load(path)
        c, row = t["choice"], choice_row(t)
        cells = [f"`{repo_path(path)}`", f"`{t['command']}`", _commit(t), t.get("head", ""), t.get("dtype", "")]
        lines.append("| " + " | ".join(cells + [_number(c.get(k)) for k in TREE_COLUMNS]
                                       + [_number(row.get("tau"))]) + " |")
    return lines + [""]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _notebooks() -> list[str]:
    entries = load_manifest()["notebooks"]
    lines = ["## Notebooks at full size", "", "Each notebook's last full-size run (`make figures`, i.e. "
             "`python -m lab.figures`), from `figures/manifest.json`.", ""]
    if not entries:
        return lines + ["No full-size run recorded yet.", ""]
    lines += ["| notebook | wall time | figures it wrote | commit | machine |", "|---|---|---|---|---|"]
    for name in sorted(entries):
        e = entries[name]
        lines.append(f"| `{name}` | {_minutes(e['seconds'])} | {', '.join(f'`{f}`' for f in e['figures'])} | "
                     f"{_commit(e)} | {_machine(e)} |")
    return lines + [""]


def render_notebook_times() -> str:
    """The README's generated line under the notebook map: each notebook's full-size time."""
    entries = load_manifest()["notebooks"]
    if not entries:
        return "Full-size run times: none recorded yet (`make figures` records them)."
    cpus = sorted({_machine(e) for e in entries.values() if "machine" in e})
    times = ", ".join(f"`{name.split('_')[0]}` {_minutes(entries[name]['seconds'])}" for name in sorted(entries))
    return (f"Full-size run times (`make figures` on {'; '.join(cpus)}; details in "
            f"[RESULTS.md](RESULTS.md#notebooks-at-full-size)): {times}.")


def _machine(result: dict) -> str:
    """The CPU and its cores, with its instruction sets where the run recorded them."""
    m = result.get("machine", {})
    isa = m.get("fingerprint", {}).get("isa")
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores" + (f" ({'/'.join(isa) or 'no AVX2'})" if isa is not None
                                                                   else "")


def _ratio(methods: dict, name: str) -> str:
    return f"`{name}` {methods[name]['speedup']:.2f}x" if name in methods else f"`{name}` not run"


def _identical(method: dict) -> str:
    """'k/n': on how many prompts the method's tokens equal `ar`'s."""
    rows = [p["identical_to_ar"] for p in method["per_prompt"]]
    return f"{sum(map(bool, rows))}/{len(rows)}"


def _headline_exact(result: dict) -> str:
    m = result["methods"]
    return (f"`eagle2` with head `{head_file(result, 'eagle2')}` {m['eagle2']['speedup']:.2f}x `ar` "
            f"({m['ar']['tokens_per_s']:.0f} tok/s), τ {m['eagle2']['tau']:.2f}, "
            f"identical to `ar` on {_identical(m['eagle2'])} prompts; transformers' own greedy {_ratio(m, 'hf')}, "
            f"prompt lookup {_ratio(m, 'hf-pld')}")


def _llamacpp_runs() -> list[dict]:
    return [_load(path) for path in LLAMACPP_RUNS if path.exists()]


def _headline_eagle3(_: dict) -> str:
    pair = compare_pair([_load(path) for path in COMPARE_RUNS])
    ratio, low, high = pair["tau_ratio"]
    return (f"median of {pair['runs']} runs, heads `eagle3-full` and `eagle1`: τ `eagle3` {pair['tau']['eagle3']:.2f} "
            f"against `eagle2` {pair['tau']['eagle2']:.2f} ({ratio:.2f}x [{low:.2f}, {high:.2f}] over "
            f"{pair['prompts']} prompts), {pair['median_speedup']['eagle3']:.2f}x `ar` against "
            f"{pair['median_speedup']['eagle2']:.2f}x, both identical to `ar` on every prompt")


# The README's headline table: (what, the notebook that explains it, result file, its sentence).
EXACT_BENCH = RESULTS_DIR / "bench_exact_bf16.json"
LLAMACPP_RUNS = [RESULTS_DIR / f"bench_llamacpp_q4_1_{run}.json" for run in (1, 2, 3)]  # make run E=bench-llamacpp
COMPARE_RUNS = [RESULTS_DIR / f"eagle3_compare_eagle1_tree24_{run}.json" for run in (1, 2, 3)]  # E=eagle3-compare
HEADLINES = (
    ("lossless speculative decoding on the exact bfloat16 engine", "01, 05", EXACT_BENCH, _headline_exact),
    ("against llama.cpp on the same machine", "01", LLAMACPP_RUNS[0], lambda _: llamacpp_headline(_llamacpp_runs())),
    ("EAGLE-3 against EAGLE-2 on the exact engine, one tree (4, 6, 24)", "06", COMPARE_RUNS[0], _headline_eagle3),
    ("speculation as the batch grows, on the exact engine", "08", RESULTS_DIR / "bench_batch.json", batch_headline),
)


def render_headline() -> str:
    """The README's headline results: one row per chapter's main measurement, each from its JSON
    file (MT-Bench, 10 prompts, the batch row 16, 128 new tokens, greedy), with the machine that measured it."""
    rows = ["| what | notebook | result | run on |", "|---|---|---|---|"]
    for what, notebook, path, sentence in HEADLINES:
        if path.exists():
            result = _load(path)
            rows.append(f"| {what} | {notebook} | {sentence(result)} | {_machine(result)}, target in "
                        f"{result['config']['dtype']} ([{path.stem}](RESULTS.md#{path.stem})) |")
    if QUALITY_FILE.exists():
        quality = _load(QUALITY_FILE)
        rows.append("| Judge Decoding (lossy) on checkable questions | 07 | "
                    f"{judge_bar(recorded_qualities(quality))} | "
                    f"{_machine(quality)}, target in float32 "
                    "([sweep](RESULTS.md#judge-decoding-quality-against-speed)) |")
    if len(rows) == 2:
        return "No results recorded yet: `make run E=bench-exact` and `make run E=bench-eagle3` write them."
    return "\n".join(rows)


def _end_to_end_head(result: dict) -> str:
    first = next(iter(result["settings"].values()))
    return (f"`{result['command']}` on {_machine(first)}, target in "
            f"{first['config']['dtype']} (commit {_commit(result)}), "
            f"{first['config']['limit']} prompts and {first['config']['max_new_tokens']} new tokens per setting")


def _end_to_end() -> list[str]:
    lines = ["## End to end", ""]
    if not END_TO_END.exists():
        return lines + [f"No end-to-end run recorded yet: {END_TO_END_HOW}.", ""]
    result = _load(END_TO_END)
    lines += [f"`{repo_path(END_TO_END)}`: " + _end_to_end_head(result) + ".", "", format_end_to_end(result), ""]
    for key, r in result["settings"].items():
        left_out = r.get("endtoend", {}).get("left_out", {})
        lines += [f"* `{key}`: `{r['command']}`"
                  + (f"; left out: {', '.join(f'`{m}` ({why})' for m, why in left_out.items())}"
                     if left_out else "")
                  + (f"; {verification_line(r)}" if r["config"].get("temperature") == 0 else "")]
    return lines + [""]


def _judge_quality() -> list[str]:
    lines = ["## Judge Decoding: quality against speed", ""]
    if not QUALITY_FILE.exists():
        return lines + [f"No quality sweep recorded yet: {QUALITY_HOW}.", ""]
    result = _load(QUALITY_FILE)
    runs = recorded_qualities(result)
    return lines + [f"`{repo_path(QUALITY_FILE)}`: `{result['command']}` on {_machine(result)}, "
                    f"float32 target (commit {_commit(result)}). {result['questions']} "
                    f"questions of the evaluation half (`lab.judge.tasks`, seed {result['seed']}), which the "
                    f"judge's labels never touch; greedy, chains of {result['draft_len']} from the 2-layer draft "
                    f"(`eagle`: the shipped EAGLE-1 head's top-1 chain), at most "
                    f"{result['max_new_tokens']} new tokens; tok/fwd counts verification forwards of "
                    "the target (the draft's own for `draft only`); tok/answer and fwd/answer: new tokens "
                    "and target forwards per question; x SD: against standard SD with the same draft "
                    "(`eagle SD` for the `eagle` runs); `(NAME)`: the judge head "
                    "`data/judge/NAME.json` instead of the shipped one.", "",
                    format_quality(runs), ""] + [f"* judge head `{head}`: {judge_bar(runs, head)}."
                                                  for head in judge_heads(result)] + [""]


# the README's generated blocks: marker name -> renderer
FIDELITY = RESULTS_DIR / "fidelity.json"  # `make run E=bench-llamacpp`, its last step


def render_fidelity() -> str:
    """The README's quality table: every engine of the llama.cpp comparison against the float32 reference."""
    if not FIDELITY.exists():
        return f"(no {repo_path(FIDELITY)} yet: `make run E=bench-llamacpp` writes it)"
    result = _load(FIDELITY)
    m = result["machine"]
    return (f"Teacher-forced on the float32 reference's own greedy replies to the first {result['prompts']} MT-Bench "
            f"prompts ({result['new_tokens']} tokens each), `{result['command']}` on {m['cpu']}, {m['cores']} cores:"
            f"\n\n{format_fidelity(result)}")


README_BLOCKS = {"notebook-times": render_notebook_times, "headline": render_headline, "fidelity": render_fidelity}


def render_readme(text: str) -> str:
    """`text` (the README) with every generated block (between its markers) re-rendered."""
    for name, render in README_BLOCKS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start not in text or end not in text:
            raise LabError(f"README.md lacks the markers {start} ... {end}: put them back where that block goes")
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{render()}\n{end}{rest.split(end, 1)[1]}"
    return text


def render_results() -> str:
    """The whole page, from the JSON files under data/ and figures/manifest.json (nothing else:
    no clock, no git)."""
    benches, skipped = [], []
    for path in bench_files():
        result = _load(path)
        (benches if "methods" in result or result.get("kind") == "batch_bench" else skipped).append((path, result))
    lines = ["# Results", "",
             "> Generated by `python -m lab.results` (`make results`) from the JSON files under `data/`.",
             "> Do not edit by hand: rerun the command. What the numbers mean: "
             "[docs/findings.md](docs/findings.md).", "",
             "## Definitions", "", DEFINITIONS, "",
             "## Benchmarks", "",
             "In the order of the experiments that make them (`python -m lab run --list`), then those kept by "
             "their recorded command alone.", ""]
    lines += [f"* [{p.stem}](#{p.stem})" for p, _ in benches] + [""]
    for path, result in benches:
        lines += _batch_section(path, result) if result.get("kind") == "batch_bench" else _bench_section(path, result)
    if skipped:
        lines += ["Other results here (no `methods` key: not a benchmark table; a chapter reads them): "
                  + ", ".join(f"`{repo_path(p)}` ({rerun_line(p)})" for p, _ in skipped) + ".", ""]
    runs = _llamacpp_runs()
    if runs:
        lines += ["### llama.cpp, the runs side by side", "", format_repeats(runs), ""]
    return "\n".join(lines + _end_to_end() + _judge_quality() + _notebooks() + _catalogue()
                     + _tree_choices()).rstrip() + "\n"


def write_results(path: Path = ROOT / "RESULTS.md", readme: Path = ROOT / "README.md") -> Path:
    """Render the page and the README's generated block; write both atomically (temporary
    file, then rename)."""
    text, readme_text = render_results(), render_readme(readme.read_text())
    atomic_write(path, lambda tmp: tmp.write_text(text))
    atomic_write(readme, lambda tmp: tmp.write_text(readme_text))
    return path


if __name__ == "__main__":
    print(write_results())
