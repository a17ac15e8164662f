"""Command line: `python -m lab {doctor,bench,generate,endtoend,quality,data,train,evaluate,tau,export,tune,run} ...`
(see --help of each). Every command's options are one dataclass whose fields make its flags
(lab/options.py); the decoding commands' live in lab/bench/options.py."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .artifacts import command_line, cpu_fingerprint, fingerprint_id, git_commit, machine, repo_path, write_json
from .bench import (METHODS, drafting_line, format_breakdown, format_table, is_method, load_setup, make_drafter,
                    run_bench, verification_line)
from .bench.batch import batch_sizes, format_batch_table, run_batch_bench
from .bench.endtoend import format_end_to_end, parse_settings, run_end_to_end
from .bench.fidelity import fidelity, format_fidelity
from .bench.options import BenchOptions, EndToEndOptions, GenerateOptions, method_list, positive, tree_triple
from .costmodel import choice_path, choice_row, quick_tune, tau_at_tree, tune, tuning_cache_path
from .costmodel.choice import DRAFT_VOCAB
from .data import chat_ids, load_prompts, mt_bench, prompts_file
from .decode import decode
from .doctor import report
from .drafters.eagle3 import export_head
from .drafters.heads import check_head, head_names, head_path, load_head
from .errors import LabError
from .experiments import listing, rerun, run as run_experiment
from .judge.sweep import format_quality, quality_sweep
from .measure import parameter_bytes, read_bandwidth
from .options import add_options, from_args, opt, recorded
from .paths import DATA_DIR, EAGLE3_SHIPPED, fast_mode, shipped_head
from .target.load import engine_for, load_target, load_tokenizer
from .train.distill import train_draft
from .train.eagle import train_head
from .train.eagle3 import train_eagle3
from .train.medusa import train_medusa
from .train.evaluate import EVALUATOR_VERSION, evaluate_saved_head
from .train.judge import train_judge
from .train.options import TRAINERS
from .train.regen import DEFAULT_TOKENS, build
from .viz.plots import plot_bench

ORIGIN_COLOURS = {"draft": "\033[32m", "corrected": "\033[31m", "bonus": "\033[34m", "target": ""}


@dataclass
class DataOptions:
    action: str = opt("build", "what to do", positional=True, choices=["build"])
    tokens: int = opt(DEFAULT_TOKENS, "training response tokens to reach (the default takes about 20 minutes on 2 "
                                      "cores)")
    sampled: bool = opt(False, "answers sampled at temperature 1 (data/regen/sharegpt_smollm2_t1.npz) instead of "
                               "greedy")


@dataclass
class EvaluateOptions:
    name: list = opt([], "data/eagle/NAME.safetensors, one or more (default eagle1; `all`: every head there)",
                     positional=True, nargs="*")
    prompts: int = opt(64, "the first N held-out prompts, of which the unique ones are scored (64: 50 prompts)",
                       parse=positive)


@dataclass
class TauOptions:
    name: list = opt([], "data/eagle/NAME.safetensors, one or more", positional=True, nargs="+")
    tree: tuple = opt((4, 6, 24), "the dynamic tree depth,top-k,total every head drafts", parse=tree_triple)
    first: int = opt(30, "the first MT-Bench question (30: past the benchmark's 10 and the tuning's 20)")
    prompts: int = opt(20, "MT-Bench questions, from --first on", parse=positive)
    positions: int = opt(320, "root positions, the same for every head", parse=positive)
    max_new_tokens: int = opt(128, "length of the target's greedy answers", parse=positive)
    json: str | None = opt(None, "write the result here (per head: tau and tau per prompt)", required=True)


@dataclass
class ExportOptions:
    what: str = opt("eagle3", "the head kind", positional=True, choices=["eagle3"])
    out: str | None = opt(None, "folder for config.json and model.safetensors", required=True)
    name: str = opt(EAGLE3_SHIPPED, "data/eagle/NAME.safetensors")


@dataclass
class TuneOptions:
    what: str = opt("tree", "what to tune", positional=True, choices=["tree"])
    positions: int = opt(160, "draft positions measured")
    max_new_tokens: int = opt(128, "length of the tuning continuations", parse=positive)
    draft_vocab: int = opt(DRAFT_VOCAB, "eagle1: draft over the N most frequent training tokens (0: all 49,152); an "
                                 "EAGLE-3 head drafts over its own vocabulary")
    head: str = opt("eagle1", "which kind of head to tune for (each has its own choice file)",
                    choices=["eagle1", "eagle3"])
    name: str | None = opt(None, f"the head file data/eagle/NAME.safetensors of that kind (default: eagle1, or "
                                 f"{EAGLE3_SHIPPED})")
    dtype: str = opt("float32", "the target's dtype to tune for (each has its own choice file)",
                     choices=["float32", "bfloat16", "q4_1"])
    quick: bool = opt(False, "a smaller grid on 6 prompts (about a minute), kept in .cache/tuning/ for this "
                             "machine's fingerprint instead of data/eagle/")


@dataclass
class QualityOptions:
    per_kind: int = opt(20, "evaluation-half questions of each kind (20: 102 questions)", parse=positive)
    json: str | None = opt(None, "results file (default data/results/judge_quality.json; with LAB_FAST=1 under "
                                 ".cache)")
    judge: str = opt("judge", "the judge head data/judge/NAME.json (judge: the shipped one); another head's judge "
                              "runs are added to the file under its name, the other runs shared")


@dataclass
class FidelityOptions:
    configs: str = opt("float32,bfloat16,q4_1,llamacpp,llamacpp-q4_0,llamacpp-bf16",
                       "comma-separated: the lab's engines by --dtype, llama.cpp's files by method "
                       "(those need `make peers`)")
    prompts: int = opt(10, "the first N MT-Bench prompts", parse=positive)
    new_tokens: int = opt(128, "reply tokens of the float32 reference per prompt", parse=positive)
    json: str | None = opt(None, "results file (default data/results/fidelity.json)")


@dataclass
class RunOptions:
    name: str | None = opt(None, "the experiment (`--list` names them)", positional=True, nargs="?")
    list: bool = opt(False, "every experiment, what it makes and which files exist")
    force: bool = opt(False, "redo the steps whose files exist")
    rerun: str | None = opt(None, "rerun what made a result file: its experiment's step, or the command recorded "
                                  "inside it", metavar="FILE")
    dry_run: bool = opt(False, "print the commands instead of running them")


def _bench(args: argparse.Namespace) -> None:
    o = from_args(BenchOptions, args)
    methods = method_list(o.methods)
    unknown = [m for m in methods if not is_method(m)]
    if unknown:
        raise LabError(f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)} "
                       "(and lookahead-N-W-G)")
    prompts = prompts_file(o.prompts, o.limit) if o.prompts else load_prompts(o.dataset, o.limit)
    sizes = batch_sizes(o.batch_size)
    if sizes != [1] and (o.figure or o.breakdown):
        raise LabError("--batch-size prints its own table: drop --figure and --breakdown")
    setup = load_setup(o, methods)
    config = recorded(o)
    if sizes != [1]:
        result = run_batch_bench(methods, prompts, setup, config, o.draft_layers, sizes, o.json)
        print(format_batch_table(result))
        return
    if o.breakdown:  # measured before the run, so the floor's reading does not disturb it
        # the bytes the engine itself reads: the GGUF's blocks for q4_1, the torch model's parameters otherwise
        packed = getattr(engine_for(setup.target), "w", None)
        weights, read = getattr(packed, "weight_bytes", None) or parameter_bytes(setup.target), read_bandwidth()
        config["bandwidth_floor"] = {"weight_bytes": weights, "read_gb_s": read / 1e9, "ms": 1e3 * weights / read}
    result = run_bench(methods, prompts, setup, config, o.draft_layers, o.json)
    print(format_table(result))
    print(verification_line(result))
    drafted = drafting_line(result)
    if drafted:
        print(drafted)
    if o.breakdown:
        print(format_breakdown(result))
    if o.figure:
        plot_bench(result, o.figure)
        print(f"figure written to {o.figure}")


def _generate(args: argparse.Namespace) -> None:
    o = from_args(GenerateOptions, args)
    setup = load_setup(o, [o.method])
    drafter, draft_len, rule = make_drafter(setup, o.method)
    tokenizer, tokens, printed = setup.tokenizer, [], ""

    def show(new: list[int], origins: list[str]) -> None:
        nonlocal printed
        for token, origin in zip(new, origins):
            tokens.append(token)
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            piece, printed = text[len(printed):], text
            colour = "" if o.no_color else ORIGIN_COLOURS[origin]
            print(f"{colour}{piece}\033[0m" if colour else piece, end="", flush=True)

    result = decode(engine_for(setup.target), drafter, chat_ids(tokenizer, o.prompt), o.max_new_tokens,
                    setup.sampling, draft_len, o.seed, tokenizer.eos_token_id, on_tokens=show, kernel=o.kernel,
                    rule=rule)
    print()
    legend = "" if o.no_color else "  (green: accepted draft, red: corrected by target, blue: bonus)"
    print(f"[{o.method}] {len(result.tokens)} tokens in {result.seconds:.2f} s, "
          f"{len(result.tokens) / result.seconds:.1f} tok/s, tau {result.tau:.2f}{legend}", file=sys.stderr)


def _data(args: argparse.Namespace) -> None:
    o = from_args(DataOptions, args)
    print(build(tokens=o.tokens, sampled=o.sampled))


def _train(args: argparse.Namespace) -> None:
    options = from_args(args.options, args)
    trainer = {"draft": train_draft, "eagle1": train_head, "eagle3": train_eagle3, "medusa": train_medusa,
               "judge": train_judge}[args.what]
    print(trainer(options))


def _evaluate(args: argparse.Namespace) -> None:
    o = from_args(EvaluateOptions, args)
    names = head_names() if o.name == ["all"] else (o.name or ["eagle1"])
    target = load_target()
    for name in names:
        report = evaluate_saved_head(head_path(name), target=target, prompts=o.prompts)
        top1, chains = report["top1_by_depth"], report["chain_acceptance_by_depth"]
        print(f"{name}: top-1 by depth {top1['rate']} over {top1['chains']} chains; chain acceptance "
              f"{chains['rate']}; {report['positions']} positions of {report['sequences']} sequences "
              f"({report['prompt_set']}), {report['seconds']} s; evaluator version {EVALUATOR_VERSION}, written "
              "under \"evaluation\"", flush=True)


def _tau(args: argparse.Namespace) -> None:
    o = from_args(TauOptions, args)
    missing = [name for name in o.name if not head_path(name).exists()]
    if missing:
        raise LabError(f"no head file data/eagle/{missing[0]}.safetensors: train it (`python -m lab run --list` "
                       f"names the experiment that makes it) or choose among {', '.join(head_names())}")
    target = load_target()
    taus = tau_at_tree(target, load_tokenizer(), {name: load_head(target, name) for name in o.name}, o.tree,
                       prompts=mt_bench()[o.first:o.first + o.prompts], max_new_tokens=o.max_new_tokens,
                       positions=o.positions)
    write_json(Path(o.json), {"command": command_line(), "commit": git_commit(), "machine": machine(),
                              "options": recorded(o), "heads": taus})
    for name, row in taus.items():
        print(f"{name}: tau {row['tau']:.3f} at tree {','.join(map(str, o.tree))} over {o.positions} positions "
              f"of {len(row['by_prompt'])} prompts")
    print(f"written to {o.json}")


def _run(args: argparse.Namespace) -> None:
    o = from_args(RunOptions, args)
    if o.list:
        print(listing())
    elif o.rerun:
        rerun(Path(o.rerun), dry_run=o.dry_run)
    elif o.name:
        run_experiment(o.name, force=o.force, dry_run=o.dry_run)
    else:
        raise LabError("name an experiment, or pass --list or --rerun FILE")


def _tune(args: argparse.Namespace) -> None:
    o = from_args(TuneOptions, args)
    name = o.name or shipped_head(o.head)
    check_head(name, o.head, "--name")
    target = load_target(o.dtype)
    head = load_head(target, name)
    if o.quick:
        own = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(TuneOptions)
               if f.name in ("positions", "max_new_tokens", "draft_vocab") and getattr(o, f.name) != f.default]
        if own:
            raise LabError(f"--quick tunes on its own small grid: drop {', '.join(own)}")
        path = tuning_cache_path(o.dtype, name)
        result = quick_tune(target, load_tokenizer(), head, name, path)
    else:
        path = choice_path(o.dtype, name)
        draft_vocab = 0 if o.head == "eagle3" else o.draft_vocab  # EAGLE-3 drafts over its own vocabulary
        result = tune(target, load_tokenizer(), head, max_new_tokens=o.max_new_tokens, positions=o.positions,
                      draft_vocab=draft_vocab, path=path, head_name=name)
    c = result["choice"]
    where = f"written to {repo_path(path)} (this machine: {fingerprint_id(cpu_fingerprint())})"
    if c["total_tokens"] == 1:
        print(f"no tree pays on this machine (the best predicted {result['best_tree_predicted_speedup']:.2f}x AR): "
              f"the choice is AR; {where}")
        return
    row = choice_row(result)
    print(f"chosen dynamic tree: depth {c['depth']}, top-k {c['top_k']}, {c['total_tokens']} tokens: "
          f"predicted tau {c['predicted_tau']:.2f} (walked; {row['tau']:.2f} at uniform roots), "
          f"speed-up {c['predicted_speedup']:.2f}x "
          f"(static tree of the same size: tau {c['static_predicted_tau']:.2f}, "
          f"{c['static_predicted_speedup']:.2f}x); draft vocabulary {result['draft_vocab_size']} "
          f"(covers {result['draft_vocab_coverage_of_tuning_responses']:.1%} of the tuning answers' tokens); {where}")


def _export(args: argparse.Namespace) -> None:
    o = from_args(ExportOptions, args)
    out = export_head(load_head(load_target(), o.name), Path(o.out))
    print(f"{o.name} written to {out} (config.json, model.safetensors) in the EAGLE-3 layout vLLM and SGLang load")


def _endtoend(args: argparse.Namespace) -> None:
    o = from_args(EndToEndOptions, args)
    parse_settings(o.settings)  # a bad --settings fails before any loading
    print(format_end_to_end(run_end_to_end(o, load_setup(o, method_list(o.methods)))))


def _fidelity(args: argparse.Namespace) -> None:
    o = from_args(FidelityOptions, args)
    result = fidelity([c for c in o.configs.split(",") if c], o.prompts, o.new_tokens)
    path = Path(o.json) if o.json else DATA_DIR / "results" / "fidelity.json"
    write_json(path, {**result, "options": recorded(o)})
    print(f"{format_fidelity(result)}\nwritten to {repo_path(path)}")


def _quality(args: argparse.Namespace) -> None:
    o = from_args(QualityOptions, args)
    tasks, runs = quality_sweep(load_target(), load_tokenizer(), o.per_kind, fast_mode(), o.json and Path(o.json),
                                o.judge)
    print(f"{len(tasks)} evaluation questions:\n{format_quality(runs)}")


class _OneLineErrors(argparse.ArgumentParser):
    """argparse whose errors are one line, like every other error of the lab (the usage block
    stays in --help). Subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


@dataclass
class DoctorOptions:
    """doctor takes no options."""


def _doctor(args: argparse.Namespace) -> None:
    print(report())


COMMANDS = {  # name: (help, options, handler)
    "bench": ("compare decoding methods on a dataset; prints a table", BenchOptions, _bench),
    "generate": ("stream one answer, coloured by token origin", GenerateOptions, _generate),
    "data": ("build the regenerated ShareGPT training set", DataOptions, _data),
    "evaluate": ("score saved draft heads with the one held-out evaluator", EvaluateOptions, _evaluate),
    "tau": ("tau of each head's dynamic tree at the same root positions of MT-Bench answers, per prompt",
            TauOptions, _tau),
    "export": ("write a trained EAGLE-3 head in the layout serving engines load", ExportOptions, _export),
    "tune": ("choose the EAGLE tree size for this machine (cost model)", TuneOptions, _tune),
    "endtoend": ("bench on several datasets and temperatures into one JSON that a rerun resumes (notebook 08)",
                 EndToEndOptions, _endtoend),
    "fidelity": ("teacher-forced top-1 agreement and mean KL of each engine against the float32 reference, on "
                 "the reference's own MT-Bench replies", FidelityOptions, _fidelity),
    "quality": ("notebook 07's quality-against-speed sweep (target, draft, SD, Top-K, judge over its threshold, "
                "EAGLE-1 chain) into one JSON that a rerun resumes", QualityOptions, _quality),
    "doctor": ("what this machine will run, one line each, and what to do about each missing piece (seconds)",
               DoctorOptions, _doctor),
    "run": ("run a named experiment (lab/experiments.py): its steps whose files are missing; --list shows them all",
            RunOptions, _run),
}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = _OneLineErrors(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, options, handler) in COMMANDS.items():
        add_options(sub.add_parser(name, help=help), options).set_defaults(run=handler)

    train = sub.add_parser("train", help="distil a draft model or train an EAGLE head or the judge head from the "
                                        "target")
    trainers = train.add_subparsers(dest="what", required=True, metavar="{" + ",".join(TRAINERS) + "}")
    for what, (options, purpose) in TRAINERS.items():
        add_options(trainers.add_parser(what, help=purpose, description=purpose), options).set_defaults(options=options)
    train.set_defaults(run=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
