"""`python -m lab run NAME`: every experiment that makes a file under data/, by name.

An experiment is data: a one-line purpose, roughly how long it takes on 2 cores, and a few steps,
each a list of `python -m lab ...` commands and the file they make. A step whose file exists is
skipped (delete the file, or pass `--force`, to redo it); a step whose command resumes by itself
(it adds runs to its file) always runs. Either way the step's file (or a head's manifest) is
stamped with the experiment's name. Every step runs in a process of its own, so an interrupted
experiment resumes where it stopped. `python -m lab run --list` shows them all and which of their
files exist; `--rerun FILE` reruns the command recorded inside any result file (`--dry-run`: print it)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import ablation
from .artifacts import write_json
from .errors import LabError
from .paths import ROOT


@dataclass(frozen=True)
class Step:
    commands: tuple[str, ...]  # what follows `python -m lab`, run in order
    out: str                   # the file they make, relative to the repository: present means done
    resumes: bool = False      # the command adds to its file and resumes by itself: run it every time


@dataclass(frozen=True)
class Experiment:
    purpose: str
    minutes: int               # about, on 2 cores (the GPU experiment: on the lent GPU)
    steps: tuple[Step, ...]


def _step(out: str, *commands: str, resumes: bool = False) -> Step:
    return Step(tuple(commands), out, resumes)


BENCH = "bench --dataset mt_bench --limit 10 --max-new-tokens 128 --temperature 0"
EAGLE3_BENCH = "bench --limit 10 --max-new-tokens 128 --temperature 0"
# The EAGLE-3 comparison on the exact engine: the shipped EAGLE-3 head against the EAGLE-1 head nearest it in
# sequence draws (eagle1) and the GPU-trained one, each run holding all three methods
COMPARE = ("bench --methods ar,eagle2,eagle3 --eagle3-head eagle3-full --dataset mt_bench --limit 40 "
           "--max-new-tokens 128 --temperature 0 --dtype bfloat16")
# Lookahead's (N, W, G), each at most 23 positions per step, 1 + (W + G)(N - 1): a 2-core CPU pays for every one
# The float32 comparison drafts the trees the bfloat16 runs were tuned to (EAGLE-2 2,4,6; Medusa 6
# tokens): where the float32 tuning finds no tree that pays it chooses AR, which leaves nothing to compare.
FLOAT32_TREES = " --eagle-tree 2,4,6 --medusa-tree 6"
LOOKAHEAD_SWEEP = ((2, 8, 4), (2, 12, 8), (3, 5, 3), (3, 7, 4), (4, 3, 2), (4, 4, 3), (5, 2, 2), (5, 3, 2))


def _bench(name: str, options: str, base: str = BENCH) -> Step:
    return _step(f"data/results/{name}.json", f"{base} {options} --json data/results/{name}.json")


def _eagle3_benches(head: str, prefix: str) -> tuple[Step, ...]:
    """Notebook 06's four runs of an EAGLE-3 head: each head's tuned tree, one fixed tree, HumanEval,
    and its static tree."""
    base = f"{EAGLE3_BENCH} --eagle3-head {head}"
    return (_bench(prefix, "--methods ar,hf-pld,eagle2,eagle3 --dataset mt_bench", base),
            _bench(f"{prefix}_tree24", "--methods ar,eagle2,eagle3 --eagle-tree 4,6,24 --dataset mt_bench", base),
            _bench(f"{prefix}_humaneval", "--methods ar,eagle2,eagle3 --dataset humaneval", base),
            _bench(f"{prefix}_static", "--methods ar,eagle3,eagle3-static --dataset mt_bench", base))


def _head(name: str, *commands: str) -> Step:
    return _step(f"data/eagle/{name}.safetensors", *commands)


def _quality(judge: str) -> Step:
    return _step("data/results/judge_quality.json", f"quality --judge {judge}", resumes=True)


NB04 = "--max-steps 300 --train-prompts 640"

def _runs(runs: tuple[tuple[str, str], ...]) -> tuple[Step, ...]:
    """Steps of (file, command) pairs: notebook 06's heads and their tau files (lab/ablation.py)."""
    return tuple(_step(out, command) for out, command in runs)


EXPERIMENTS: dict[str, Experiment] = {
    # ---- data, drafts and heads -------------------------------------------------------------
    "data": Experiment("the regenerated training set (greedy answers), and the same prompts answered at T = 1", 60, (
        _step("data/regen/sharegpt_smollm2.npz", "data build --tokens 200000"),
        _step("data/regen/sharegpt_smollm2_t1.npz", "data build --sampled"))),
    "drafts": Experiment("the distilled 1-, 2- and 4-layer draft models of two-model speculative decoding", 20, tuple(
        _step(f"data/drafts/draft_{n}l.safetensors", f"train draft --layers {n} --minutes 6") for n in (1, 2, 4))),
    "eagle-heads": Experiment("the shipped EAGLE-1 head (three stages, 115 CPU-minutes) and the 5-minute baseline",
                              130, (
        _head("eagle1", "train eagle1 --minutes 30",
              "train eagle1 --init eagle1 --replies 400000 --minutes 45 --lr 5e-4",
              "train eagle1 --init eagle1 --replies 980000 --reply-feature-dtype bfloat16 --minutes 40 --lr 5e-4"),
        _head("eagle1-short", "train eagle1 --variant eagle1 --name eagle1-short --minutes 5"))),
    "feature-drift-heads": Experiment("notebook 04's heads: three inputs, trained on greedy and on sampled answers", 60,
                                      tuple(_head(f"{v}-{text}", f"train eagle1 --variant {v} --name {v}-{text} "
                                                                 f"{'--sampled ' if text == 'sampled' else ''}{NB04}")
                                            for v in ("eagle1", "no-token", "token-only")
                                            for text in ("greedy", "sampled"))),
    "eagle3-full": Experiment("the shipped EAGLE-3 head: 45 minutes at S = 1, then 70 at S = 7, on 1.18M tokens", 180, (
        _head("eagle3-full-s1", "train eagle3 --name eagle3-full-s1 --ttt-steps 1 --replies 980000 --fp32 "
                                "--minutes 45"),
        _head("eagle3-full", "train eagle3 --name eagle3-full --init eagle3-full-s1 --replies 980000 --fp32 "
                             "--minutes 70 --lr 5e-4"))),
    "eagle3-heads": Experiment("the earlier EAGLE-3 head (0.6M tokens) and notebook 06's 5-minute ablation heads",
                               160, (
        _head("eagle3", "train eagle3 --replies 400000 --reply-feature-dtype bfloat16 --minutes 60",
              "train eagle3 --init eagle3 --replies 400000 --reply-feature-dtype bfloat16 --minutes 60 --lr 5e-4"),
        _head("ce-top", "train eagle3 --name ce-top --taps top --ttt-steps 1 --minutes 5"),
        _head("ttt-top", "train eagle3 --name ttt-top --taps top --minutes 5"),
        _head("eagle3-short", "train eagle3 --name eagle3-short --minutes 5"),
        _head("eagle3-s1", "train eagle3 --name eagle3-s1 --ttt-steps 1 --minutes 5"),
        _head("eagle3-s3", "train eagle3 --name eagle3-s3 --ttt-steps 3 --minutes 5"),
        _head("eagle3-v16k", "train eagle3 --name eagle3-v16k --draft-vocab 16384 --minutes 5"))),
    "eagle3-curriculum": Experiment("plain steps first, then training-time test: at scale and in 5 minutes", 110, (
        _head("eagle3-curriculum-s1", "train eagle3 --name eagle3-curriculum-s1 --ttt-steps 1 --replies 400000 "
                                      "--reply-feature-dtype bfloat16 --minutes 40"),
        _head("eagle3-curriculum", "train eagle3 --name eagle3-curriculum --init eagle3-curriculum-s1 --replies 400000 "
                                   "--reply-feature-dtype bfloat16 --minutes 50 --lr 5e-4"),
        _head("eagle3-cur-s1", "train eagle3 --name eagle3-cur-s1 --ttt-steps 1 --minutes 3.5"),
        _head("eagle3-cur", "train eagle3 --name eagle3-cur --init eagle3-cur-s1 --minutes 1.5"),
        _head("eagle3-cur-even-s1", "train eagle3 --name eagle3-cur-even-s1 --ttt-steps 1 --max-steps 144"),
        _head("eagle3-cur-even", "train eagle3 --name eagle3-cur-even --init eagle3-cur-even-s1 --max-steps 40"),
        _step("data/eagle/tree_choice_eagle3-curriculum.json", "tune tree --head eagle3 --name eagle3-curriculum"))),
    "scaling-heads": Experiment("EAGLE-1 and EAGLE-3 heads on 1/8 to all of the training prompts at equal steps", 45,
                                tuple(_head(f"{kind}-data1of{part}", f"train {kind} --name {kind}-data1of{part} "
                                                                     f"--train-prompts {prompts} --max-steps {steps} "
                                                                     "--resume")
                                      for kind, steps in (("eagle1", 158), ("eagle3", 84))
                                      for part, prompts in ((8, 184), (4, 368), (2, 736), (1, 1472)))),
    "gpu-heads": Experiment("EAGLE-1 and EAGLE-3 heads trained 3.5 minutes each on a lent GPU (then `python -m lab "
                            "evaluate eagle3-gpu eagle1-gpu` on a CPU)", 15, (
        _head("eagle3-gpu", "train eagle3 --device cuda --batch 64 --replies 980000 --minutes 3.5 --eval-prompts 0 "
                            "--name eagle3-gpu"),
        _head("eagle1-gpu", "train eagle1 --device cuda --batch 64 --replies 980000 --minutes 3.5 --eval-prompts 0 "
                            "--name eagle1-gpu"))),
    "eagle3-ablation": Experiment("notebook 06: feature loss x TTT on the top tap, and the three fused taps; each "
                                  "head 400 plain steps, then 400 TTT or plain", 90, _runs(ablation.ABLATION_RUNS)),
    "eagle3-levers": Experiment("two of EAGLE-3's levers, small: TTT of 2 steps against 7, and normed taps; tau at "
                                "a depth-2 and at the issue's fixed tree", 70,
                                _runs(ablation.LEVER_RUNS)),
    "eagle3-levers2": Experiment("three more levers, small: a first stage with the feature loss, and ShareGPT's "
                                 "replies as the TTT stage's text, beside a baseline; tau at two trees", 60,
                                 _runs(ablation.LEVERS2_RUNS)),
    "eagle3-draws": Experiment("tau against sequence draws along one run of each kind (EAGLE-3 with TTT of 2 "
                               "steps, EAGLE-1), the head saved every 1,200 draws", 40, _runs(ablation.DRAWS_RUNS)),
    # ---- trees --------------------------------------------------------------------------------
    "tune": Experiment("the tree size of every shipped head on this machine (float32 and bfloat16)", 60, (
        _step("data/eagle/tree_choice.json", "tune tree"),
        _step("data/eagle/tree_choice_bfloat16.json", "tune tree --dtype bfloat16"),
        _step("data/eagle/tree_choice_eagle1-gpu_bfloat16.json", "tune tree --head eagle1 --name eagle1-gpu "
                                                                 "--dtype bfloat16"),
        _step("data/eagle/tree_choice_eagle1-gpu.json", "tune tree --head eagle1 --name eagle1-gpu"),
        _step("data/eagle/tree_choice_eagle3-full.json", "tune tree --head eagle3 --name eagle3-full"),
        _step("data/eagle/tree_choice_eagle3.json", "tune tree --head eagle3 --name eagle3"))),
    # ---- benchmarks ---------------------------------------------------------------------------
    "bench-foundation": Experiment("AR, two-model SD and the transformers peers, float32", 10, (
        _step("data/results/bench_foundation.json", f"{BENCH} --methods ar,sd,hf,hf-assisted,hf-pld "
                                                    "--json data/results/bench_foundation.json "
                                                    "--figure figures/bench_foundation.png"),)),
    "bench-eagle": Experiment("EAGLE-1 and EAGLE-2 against AR, float32", 10, (
        _step("data/results/bench_eagle.json",
              f"{BENCH} --methods ar,eagle1,eagle2 --json data/results/bench_eagle.json "
              "--figure figures/bench_eagle.png"),)),
    "bench-exact": Experiment("the exact bfloat16 engine with the GPU-trained head, greedy and at T = 1, and with the "
                              "CPU-trained head", 25, (
        _step("data/results/bench_exact_bf16.json",
              f"{BENCH} --methods ar,hf,hf-pld,eagle1,eagle2 --dtype bfloat16 --eagle-head eagle1-gpu "
              "--json data/results/bench_exact_bf16.json --figure figures/bench_exact_bf16.png"),
        _bench("bench_exact_bf16_t1", "--methods ar,hf,hf-pld,eagle1,eagle2 --dtype bfloat16 --eagle-head eagle1-gpu",
               BENCH.replace("--temperature 0", "--temperature 1")),
        _bench("bench_exact_bf16_cpu_head", "--methods ar,eagle1,eagle2 --dtype bfloat16"))),
    "bench-exact-bar": Experiment("the exact engine's bar as its issue wrote it (the CPU-trained head)", 10, (
        _bench("bench_exact_bf16_bar", "--methods ar,hf,hf-pld,eagle1,eagle2 --dtype bfloat16"),)),
    "bench-exact-again": Experiment("the bar's pair twice more, each to its own file: how much one run moves", 12,
                                    tuple(_bench(f"bench_exact_bf16_run{run}",
                                                 "--methods ar,eagle1,eagle2 --dtype bfloat16 --eagle-head eagle1-gpu")
                                          for run in (2, 3))),
    "bench-llamacpp": Experiment("llama.cpp on the Q4_1 file, a Q4_0 file quantised from the same weights and its "
                                 "prompt lookup (lab/bench/llamacpp.py, with llama-bench's tg128) beside the exact "
                                 "Q4_1 engine's AR and EAGLE-2, three runs; then every engine's teacher-forced "
                                 "agreement with the float32 reference (needs `make peers`)", 20, tuple(
        _bench(f"bench_llamacpp_q4_1_{run}", "--methods ar,eagle2,llamacpp,llamacpp-q4_0,llamacpp-pld "
               "--dtype q4_1 --eagle-head eagle1-gpu --breakdown") for run in (1, 2, 3)) + (
        _step("data/results/fidelity.json", "fidelity --json data/results/fidelity.json"),)),
    "medusa-heads": Experiment("Medusa-1 heads on the target's cached top features (40 CPU-minutes)", 45, (
        _head("medusa", "train medusa --minutes 40"),)),
    "bench-draftless": Experiment("drafting without a separate draft model, prompt lookup (a chain, a tree), Lookahead "
                                  "and Medusa, beside EAGLE-2, on the exact bfloat16 engine and on the float32 path: "
                                  "MT-Bench and HumanEval, greedy and at T = 1", 45, tuple(
        _bench(f"{name}{'_fp32' if dtype == 'float32' else ''}{'_t1' if t else ''}",
               f"--methods ar,pld,pld-tree,lookahead,medusa,eagle2 --dtype {dtype} --eagle-head eagle1-gpu "
               f"--dataset {dataset}{FLOAT32_TREES if dtype == 'float32' else ''}",
               EAGLE3_BENCH.replace("--temperature 0", f"--temperature {t}"))
        for dtype in ("bfloat16", "float32") for t in (0, 1)
        for name, dataset in (("bench_draftless", "mt_bench"), ("bench_draftless_humaneval", "humaneval")))),
    "batch-size": Experiment("AR, two-model SD and EAGLE-2 decoding 16 MT-Bench prompts in batches of 1 to 16 on the "
                             "exact engine, beside the cost model's prediction (notebook 08)", 15, (
        _bench("bench_batch", "--methods ar,sd,eagle2 --dtype bfloat16 --eagle-head eagle1-gpu --batch-size 1,2,4,8,16",
               BENCH.replace("--limit 10", "--limit 16")),)),
    "float32-tuned": Experiment("the float32 path with the tree this machine's tuning picks (AR where no tree "
                                "pays): AR, EAGLE-1 and EAGLE-2 in three runs", 20, tuple(
        _bench(f"bench_float32_tuned_{run}", "--methods ar,eagle1,eagle2 --dtype float32") for run in (1, 2, 3))),
    "lookahead-sweep": Experiment("Lookahead's N, W and G at up to 23 positions per step, side by side in one bench "
                                  "(exact engine, MT-Bench)", 10, (
        _bench("bench_lookahead_sweep", "--methods ar," + ",".join(f"lookahead-{n}-{w}-{g}"
                                                                   for n, w, g in LOOKAHEAD_SWEEP)
               + " --dtype bfloat16 --dataset mt_bench", EAGLE3_BENCH),)),
    "bench-eagle3": Experiment("the shipped EAGLE-3 head against EAGLE-2: tuned trees, a fixed tree, HumanEval, "
                               "its static tree", 35, _eagle3_benches("eagle3-full", "bench_eagle3")),
    "bench-eagle3-curriculum": Experiment("the same four runs for the curriculum head", 35,
                                          _eagle3_benches("eagle3-curriculum", "bench_eagle3_curriculum")),
    "bench-eagle3-gpu-heads": Experiment("the two GPU-trained heads at one fixed tree, MT-Bench and HumanEval",
                                         15, tuple(
        _step(f"data/results/bench_eagle3_gpu_heads_{tag}.json",
              f"bench --methods ar,eagle2,eagle3 --dataset {dataset} --limit 10 --max-new-tokens 128 --temperature 0 "
              f"--eagle-head eagle1-gpu --eagle3-head eagle3-gpu --eagle-tree 4,6,24 "
              f"--json data/results/bench_eagle3_gpu_heads_{tag}.json")
        for tag, dataset in (("tree24", "mt_bench"), ("humaneval", "humaneval")))),
    "eagle3-compare": Experiment("the shipped EAGLE-3 head against the nearest EAGLE-1 head (three interleaved runs) "
                                 "and the GPU-trained one (one run), fixed and tuned trees, 40 prompts (notebook 06)",
                                 45, tuple(_bench(f"eagle3_compare_{name}", options, COMPARE) for name, options in (
                                     (f"{head}_{tag}_{run}", f"--eagle-head {head} --eagle-tree {tree}")
                                     for run in (1, 2, 3) for head in ("eagle1", "eagle1-gpu")
                                     if run == 1 or head == "eagle1"
                                     for tag, tree in (("tree24", "4,6,24"), ("tuned", "auto"))))),
    "end-to-end": Experiment("every method on MT-Bench, HumanEval and held-out ShareGPT at T = 0 and 1 (notebook 08)",
                             30, (_step("data/results/end_to_end.json",
                                        "endtoend --methods ar,hf,hf-assisted,hf-pld,sd,pld,lookahead,medusa,eagle1,"
                                        "eagle2,eagle3,judge "
                                        "--settings mt_bench:0,humaneval:0,sharegpt_heldout:0,mt_bench:1,humaneval:1,"
                                        "sharegpt_heldout:1 --limit 4 --max-new-tokens 64 --dtype bfloat16 "
                                        "--eagle-tree 2,4,6 --seed 0", resumes=True),)),
    # ---- Judge Decoding -----------------------------------------------------------------------
    "judge-head": Experiment("the shipped judge head: planted and mined labels on the judge half", 30, (
        _step("data/judge/judge.json", "train judge --mined 131"),)),
    "judge-heads": Experiment("the other judge heads: two drafters, with logits", 60, (
        _step("data/judge/judge-draft-eagle1.json",
              "train judge --mined 131 --mine-with draft,eagle1 --out data/judge/judge-draft-eagle1.json"),
        _step("data/judge/judge-logits.json",
              "train judge --mined 131 --mine-with draft,eagle1 --with-logits --out data/judge/judge-logits.json"))),
    "judge-quality": Experiment("notebook 07's quality against speed for every judge head (resumable)", 120, (
        _step("data/results/judge_quality.json", "quality", resumes=True),
        *(_quality(judge)
          for judge in ("judge-draft-eagle1", "judge-logits")))),
    "bench-judge": Experiment("the lossy rules on HumanEval with pass@1", 15, (
        _step("data/results/bench_judge_humaneval.json", "bench --methods ar,sd,judge,topk --dataset humaneval "
                                                         "--limit 10 --max-new-tokens 192 "
                                                         "--json data/results/bench_judge_humaneval.json"),)),
}


def experiment_of(path: str) -> tuple[str, Step] | None:
    """The experiment and step that make the file `path` (relative to the repository), if any."""
    for name, experiment in EXPERIMENTS.items():
        for step in experiment.steps:
            if step.out == path:
                return name, step
    return None


def listing() -> str:
    """Every experiment: its purpose, time, and each file with whether it exists."""
    lines = []
    for name, experiment in EXPERIMENTS.items():
        done = sum((ROOT / step.out).exists() for step in experiment.steps)
        lines.append(f"{name}  (about {experiment.minutes} min on 2 cores; {done}/{len(experiment.steps)} files "
                     f"present): {experiment.purpose}")
        lines += [f"    {'✓' if (ROOT / step.out).exists() else '·'} {step.out}" for step in experiment.steps]
    return "\n".join(lines)


def _python_lab(command: str) -> list[str]:
    return [sys.executable, "-m", "lab", *command.split()]


def stamp(out: Path, name: str) -> None:
    """Write the experiment's name into what a step made: its JSON file, or the manifest beside a
    head's weights (so a file says which experiment makes it again)."""
    manifest = out if out.suffix == ".json" else out.with_suffix(".json")
    if manifest.exists():
        record = json.loads(manifest.read_text())
        if record.get("experiment") != name:
            write_json(manifest, {**record, "experiment": name})


def run(name: str, force: bool = False, dry_run: bool = False) -> list[str]:
    """Run the experiment `name` step by step (see the module's docstring); return the commands run
    (or, with `dry_run`, those that would run)."""
    if name not in EXPERIMENTS:
        raise LabError(f"unknown experiment {name!r}: `python -m lab run --list` shows them all")
    ran = []
    for step in EXPERIMENTS[name].steps:
        skipped = (ROOT / step.out).exists() and not (force or step.resumes)
        if skipped:
            print(f"[run] {step.out} exists: skipped (--force redoes it)", flush=True)
        for command in () if skipped else step.commands:
            ran.append(f"python -m lab {command}")
            print(f"[run] {ran[-1]}", flush=True)
            if not dry_run:
                subprocess.run(_python_lab(command), cwd=ROOT, check=True)
        if not dry_run:  # a skipped step's file is stamped too: it may predate the registry
            stamp(ROOT / step.out, name)
    return ran


def recorded_command(path: Path) -> str:
    """The command recorded inside a result file, or the registry's step that makes it."""
    relative = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else str(path)
    made_by = experiment_of(relative)
    if made_by:
        return " && ".join(f"python -m lab {command}" for command in made_by[1].commands)
    if not path.exists():
        raise LabError(f"no file {path}: name a file under data/")
    command = json.loads(path.read_text()).get("command")
    if not command:
        raise LabError(f"{path} records no command and no experiment makes it: see `python -m lab run --list`")
    return command


def rerun(path: Path, dry_run: bool = False) -> str:
    """Rerun what made the result file `path`; return the command."""
    command = recorded_command(path)
    print(f"[run] {command}", flush=True)
    if not dry_run:
        for part in command.split(" && "):
            subprocess.run(_python_lab(part.removeprefix("python -m lab ")), cwd=ROOT, check=True)
    return command
