"""Command line: `python -m lab {bench,endtoend,quality,generate,data,train,evaluate,export,tune,run} ...`
(see --help of each)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .errors import LabError
from .paths import EAGLE3_SHIPPED, shipped_head

if TYPE_CHECKING:
    from .bench import Setup

ORIGIN_COLOURS = {"draft": "\033[32m", "corrected": "\033[31m", "bonus": "\033[34m", "target": ""}


def _positive(text: str) -> int:
    """argparse type: an integer of at least 1 (a count of prompts or tokens)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 disables (default)")
    p.add_argument("--draft-len", type=int, default=4, help="drafts per cycle (default 4)")
    p.add_argument("--draft-layers", type=int, default=2, choices=[1, 2, 4],
                   help="which shipped draft `sd` uses (default 2)")
    p.add_argument("--tree", default="4,4,16", help="sd-tree: depth,top-k,total tokens (default 4,4,16)")
    p.add_argument("--judge-threshold", type=float, default=None,
                   help="judge: accept a draft if P(correct) > this (default: the shipped head's delta)")
    p.add_argument("--verify-top-k", type=int, default=2,
                   help="topk: accept drafts among the target's top K (default 2)")
    p.add_argument("--eagle-tree", default="auto",
                   help="eagle1/eagle2/eagle3: depth,top-k,total tokens, or auto = the size `python -m lab tune tree` "
                        "chose for this machine and head (default); a given tree applies to every EAGLE method "
                        "(an EAGLE-1 head drafts over its tuned vocabulary, an EAGLE-3 head over its own)")
    p.add_argument("--eagle-head", default="eagle1",
                   help="eagle1/eagle2: data/eagle/NAME.safetensors (default eagle1; eagle1-gpu: the GPU-trained one)")
    p.add_argument("--eagle3-head", default=EAGLE3_SHIPPED,
                   help=f"eagle3: data/eagle/NAME.safetensors (default {EAGLE3_SHIPPED}, the EAGLE-1 head's data and "
                        "budget; eagle3: the earlier one on half the data; eagle3-gpu: the GPU-trained one)")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--kernel", choices=["torch", "triton"], default=None,
                   help="verification: torch reference or Triton kernels (default: triton on a GPU, torch on CPU)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the target's weights and activations (default float32; bfloat16 uses the CPU's "
                        "matrix units, where it has them, for multi-token forwards)")
    p.add_argument("--target", choices=["smollm2", "tiny"], default="smollm2",
                   help="`tiny` is a random 2-layer Llama for smoke tests (its draft is untrained)")


def _parse_tree(text: str, flag: str) -> tuple[int, int, int]:
    try:
        tree = tuple(int(x) for x in str(text).split(","))
        assert len(tree) == 3 and min(tree) >= 1
    except (ValueError, AssertionError):
        raise LabError(f"{flag} must be three positive integers depth,top-k,total (e.g. 4,4,16), "
                       f"got {text!r}") from None
    return tree


def _tree_choice(args: argparse.Namespace, head: str, kind: str):
    """The tree size for the head file `head` of `kind`: its own tuning, or the given --eagle-tree."""
    from .costmodel import given_tree, load_choice
    if args.eagle_tree == "auto":
        return load_choice(dtype=args.dtype, head=head, kind=kind)
    return given_tree(*_parse_tree(args.eagle_tree, "--eagle-tree"), dtype=args.dtype, head=head, kind=kind)


def _eagle(args: argparse.Namespace, target):
    """The EAGLE head (--eagle-head), its tree size and the per-rank accuracies of its manifest."""
    from .heads import check_head, head_manifest, load_head, rank_accuracy_of
    check_head(args.eagle_head, "eagle1", "--eagle-head")
    tree = _tree_choice(args, args.eagle_head, "eagle1")  # a bad --eagle-tree fails before any loading
    return load_head(target, args.eagle_head), tree, rank_accuracy_of(head_manifest(args.eagle_head))


def _eagle3(args: argparse.Namespace, target):
    """The EAGLE-3 head (--eagle3-head), its tree size and the per-rank accuracies of its
    manifest (for the static tree)."""
    from .heads import check_head, head_manifest, load_head, rank_accuracy_of
    check_head(args.eagle3_head, "eagle3", "--eagle3-head")
    tree = _tree_choice(args, args.eagle3_head, "eagle3")
    return load_head(target, args.eagle3_head), tree, rank_accuracy_of(head_manifest(args.eagle3_head))


def _judge_threshold_used(args: argparse.Namespace, methods: list[str]) -> None:
    if args.judge_threshold is not None and "judge" not in methods:
        raise LabError("--judge-threshold sets the judge method's threshold: add judge to the methods, or drop it")


def _setup_lossy(args: argparse.Namespace, setup, methods: list[str]) -> None:
    """judge: the shipped judge head (and --judge-threshold); topk: --verify-top-k."""
    _judge_threshold_used(args, methods)
    setup.verify_top_k = args.verify_top_k
    if "judge" in methods:
        from .judge import JudgeRule, load_judge
        probe, delta = load_judge(setup.target)
        setup.judge = JudgeRule(probe, delta if args.judge_threshold is None else args.judge_threshold)


def _setup_eagle(args: argparse.Namespace, setup, methods: list[str]) -> None:
    from .bench import EAGLE3_METHODS
    if any(m in ("eagle1", "eagle2") for m in methods):
        setup.head, setup.eagle_tree, setup.rank_accuracy = _eagle(args, setup.target)
    if any(m in EAGLE3_METHODS for m in methods):
        setup.head3, setup.eagle3_tree, setup.rank_accuracy3 = _eagle3(args, setup.target)


def _load(args: argparse.Namespace, need_draft: bool):
    from .models import load_draft, load_target, load_tokenizer, make_draft, tiny_target
    from .sampling import Sampling
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0 or args.draft_len < 0:
        raise LabError("need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0 and --draft-len >= 0")
    args.tree = _parse_tree(args.tree, "--tree")
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer()
    if args.target == "tiny":
        target = tiny_target(0).to(getattr(torch, args.dtype))
        draft = make_draft(target, 1) if need_draft else None
    else:
        target = load_target(args.dtype)
        draft = load_draft(target, args.draft_layers) if need_draft else None
    target.to(device)  # the draft shares the target's embedding and head, so move it too
    if draft is not None:
        draft.to(device)
    return target, draft, tokenizer, Sampling(args.temperature, args.top_k, args.top_p)


def bench_setup(args: argparse.Namespace, methods: list[str]):
    """The models and settings `bench` runs `methods` with, from its parsed options (`lab.endtoend`
    loads them once this way and runs several datasets and temperatures on them)."""
    from .bench import Setup
    os.environ["LAB_ENGINE"] = args.engine  # read by lab.engine.engine_for, wherever a forward is made
    target, draft, tokenizer, sampling = _load(args,
                                               need_draft=any(m in ("sd", "sd-tree", "hf-assisted", "judge", "topk")
                                                              for m in methods))
    setup = Setup(target, draft, tokenizer, sampling, args.max_new_tokens, args.draft_len, args.seed, args.kernel,
                  args.tree)
    _setup_eagle(args, setup, methods)
    _setup_lossy(args, setup, methods)
    return setup


def _bench(args: argparse.Namespace) -> None:
    from .bench import METHODS, drafting_line, format_table, run_bench, verification_line
    from .data import load_prompts, prompts_file
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise LabError(f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
    prompts = prompts_file(args.prompts, args.limit) if args.prompts else load_prompts(args.dataset, args.limit)
    setup = bench_setup(args, methods)
    config = {k: v for k, v in vars(args).items() if k not in ("run", "command")}
    if args.profile:
        from .bench import profiled
        result = profiled(args.profile, run_bench, methods, prompts, setup, config, args.draft_layers, args.json)
    else:
        result = run_bench(methods, prompts, setup, config, args.draft_layers, args.json)
    print(format_table(result))
    print(verification_line(result))
    drafted = drafting_line(result)
    if drafted:
        print(drafted)
    if args.figure:
        from .plots import plot_bench
        plot_bench(result, args.figure)
        print(f"figure written to {args.figure}")


def _generate(args: argparse.Namespace) -> None:
    from .bench import Setup, make_drafter
    from .data import chat_ids
    from .decode import decode
    from .models import engine_for
    _judge_threshold_used(args, [args.method])
    target, draft, tokenizer, sampling = _load(args, need_draft=args.method in ("sd", "sd-tree", "judge", "topk"))
    setup = Setup(target, draft, tokenizer, sampling, args.max_new_tokens, args.draft_len, args.seed, tree=args.tree)
    if args.method in ("judge", "topk"):
        _setup_lossy(args, setup, [args.method])
    elif args.method not in ("ar", "sd", "sd-tree"):
        _setup_eagle(args, setup, [args.method])
    drafter, args.draft_len, rule = make_drafter(setup, args.method)
    tokens: list[int] = []
    printed = ""

    def show(new: list[int], origins: list[str]) -> None:
        nonlocal printed
        for token, origin in zip(new, origins):
            tokens.append(token)
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            piece, printed = text[len(printed):], text
            colour = "" if args.no_color else ORIGIN_COLOURS[origin]
            print(f"{colour}{piece}\033[0m" if colour else piece, end="", flush=True)

    result = decode(engine_for(target), drafter, chat_ids(tokenizer, args.prompt), args.max_new_tokens, sampling,
                    args.draft_len, args.seed, tokenizer.eos_token_id, on_tokens=show, kernel=args.kernel, rule=rule)
    print()
    legend = "" if args.no_color else "  (green: accepted draft, red: corrected by target, blue: bonus)"
    print(f"[{args.method}] {len(result.tokens)} tokens in {result.seconds:.2f} s, "
          f"{len(result.tokens) / result.seconds:.1f} tok/s, tau {result.tau:.2f}{legend}", file=sys.stderr)


def _data(args: argparse.Namespace) -> None:
    from .train.regen import DEFAULT_TOKENS, build
    print(build(tokens=args.tokens or DEFAULT_TOKENS, sampled=args.sampled))


def _train(args: argparse.Namespace) -> None:
    from .options import from_args
    options = from_args(args.options, args)
    if args.what == "draft":
        from .train.distill import train_draft as trainer
    elif args.what == "eagle1":
        from .train.eagle import train_head as trainer
    elif args.what == "eagle3":
        from .train.eagle3 import train_eagle3 as trainer
    else:
        from .train.judge import train_judge as trainer
    print(trainer(options))


def _evaluate(args: argparse.Namespace) -> None:
    from .models import load_target
    from .heads import head_names, head_path
    from .train.evaluate import EVALUATOR_VERSION, evaluate_saved_head
    names = args.name or ["eagle1"]
    if names == ["all"]:
        names = head_names()
    target = load_target()
    for name in names:
        report = evaluate_saved_head(head_path(name), target=target, prompts=args.prompts, split=args.split)
        top1, chains = report["top1_by_depth"], report["chain_acceptance_by_depth"]
        print(f"{name}: top-1 by depth {top1['rate']} over {top1['chains']} chains; chain acceptance "
              f"{chains['rate']}; {report['positions']} positions of {report['sequences']} sequences "
              f"({report['prompt_set']}), {report['seconds']} s; evaluator version {EVALUATOR_VERSION}, written "
              f"under \"{'evaluation' if args.split == 'heldout' else 'evaluation_train'}\"", flush=True)


def _run(args: argparse.Namespace) -> None:
    from .experiments import listing, rerun, run
    if args.list:
        print(listing())
    elif args.rerun:
        rerun(Path(args.rerun), dry_run=args.dry_run)
    elif args.name:
        run(args.name, force=args.force, dry_run=args.dry_run)
    else:
        raise LabError("name an experiment, or pass --list or --rerun FILE")


def _tune(args: argparse.Namespace) -> None:
    from .artifacts import repo_path
    from .costmodel import choice_path, choice_row, tune
    from .heads import check_head, load_head
    from .models import load_target, load_tokenizer
    name = args.name or shipped_head(args.head)
    check_head(name, args.head, "--name")
    target = load_target(args.dtype)
    path = choice_path(args.dtype, name)
    head = load_head(target, name)
    draft_vocab = 0 if args.head == "eagle3" else args.draft_vocab  # EAGLE-3 drafts over its own vocabulary
    result = tune(target, load_tokenizer(), head, max_new_tokens=args.max_new_tokens,
                  positions=args.positions, draft_vocab=draft_vocab, path=path, head_name=name)
    c, row = result["choice"], choice_row(result)
    print(f"chosen dynamic tree: depth {c['depth']}, top-k {c['top_k']}, {c['total_tokens']} tokens: "
          f"predicted tau {c['predicted_tau']:.2f} (walked; {row['tau']:.2f} at uniform roots), "
          f"speed-up {c['predicted_speedup']:.2f}x "
          f"(static tree of the same size: tau {c['static_predicted_tau']:.2f}, "
          f"{c['static_predicted_speedup']:.2f}x); draft vocabulary {result['draft_vocab_size']} "
          f"(covers {result['draft_vocab_coverage_of_tuning_responses']:.1%} of the tuning answers' tokens); "
          f"written to {repo_path(path)}")


def _export(args: argparse.Namespace) -> None:
    from .eagle3 import export_head
    from .heads import load_head
    from .models import load_target
    out = export_head(load_head(load_target(), args.name), Path(args.out))
    print(f"{args.name} written to {out} (config.json, model.safetensors) in the EAGLE-3 layout vLLM and SGLang load")


def _endtoend(args: argparse.Namespace) -> None:
    from .endtoend import format_end_to_end, run_end_to_end
    args, setup = prepare(args.argv)
    result = run_end_to_end(args, setup)
    print(format_end_to_end(result))


def _quality(args: argparse.Namespace) -> None:
    from .models import load_target, load_tokenizer
    from .paths import fast_mode
    from .quality import format_quality, quality_sweep
    if args.per_kind < 1:
        raise LabError(f"--per-kind must be at least 1, got {args.per_kind}")
    tasks, runs = quality_sweep(load_target(), load_tokenizer(), args.per_kind, fast_mode(),
                                args.json and Path(args.json), args.judge)
    print(f"{len(tasks)} evaluation questions:\n{format_quality(runs)}")


class _OneLineErrors(argparse.ArgumentParser):
    """argparse whose errors are one line, like every other error of the lab (the usage block
    stays in --help). Subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def prepare(argv: list[str]) -> tuple[argparse.Namespace, "Setup"]:
    """Parse an `endtoend` argument list with the lab's own parser and load the models every
    method needs, once (`python -m lab bench`'s loading: `bench_setup`); notebook 08 runs
    `lab.endtoend.run_end_to_end` on what this returns."""
    from .endtoend import parse_settings
    args = build_parser().parse_args(["endtoend", *[a for a in argv if a != "endtoend"]])
    args.argv = ["endtoend", *[a for a in argv if a != "endtoend"]]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    parse_settings(args.settings)  # a bad --settings fails before any loading
    return args, bench_setup(args, methods)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (`lab.endtoend` parses its arguments with it too)."""
    parser = _OneLineErrors(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="compare decoding methods on a dataset; prints a table")
    bench.add_argument("--methods", default="ar,sd",
                       help="comma-separated: ar,sd,sd-tree,eagle1,eagle2,eagle3,eagle3-static,"
                            "hf,hf-assisted,hf-pld,llamacpp")
    bench.add_argument("--dataset", default="mt_bench",
                       help="mt_bench, humaneval, sharegpt or sharegpt_heldout "
                            "(the regenerated set's held-out prompts)")
    bench.add_argument("--prompts", default=None, help="JSONL file with one {\"prompt\": ...} per line")
    bench.add_argument("--limit", type=_positive, default=10, help="the dataset's first N prompts (default 10)")
    bench.add_argument("--json", default=None, help="write the full results here")
    bench.add_argument("--figure", default=None, help="write a speed/tau figure here (PNG)")
    bench.add_argument("--profile", type=int, default=0, metavar="N",
                       help="also profile the run (cProfile): print its top N entries by own time, "
                            "keep them in the JSON")
    bench.add_argument("--engine", choices=["auto", "transformers"], default="auto",
                       help="the target forward: auto (bfloat16 on the CPU runs the exact engine, lab/exact.py) "
                            "or transformers (also in bfloat16: not batch-invariant, for comparison)")
    _add_sampling(bench)
    bench.set_defaults(run=_bench)

    gen = sub.add_parser("generate", help="stream one answer, coloured by token origin")
    gen.add_argument("prompt")
    gen.add_argument("--method", choices=["ar", "sd", "sd-tree", "eagle1", "eagle2", "eagle3", "eagle3-static",
                                          "judge", "topk"],
                     default="eagle2")
    gen.add_argument("--no-color", action="store_true")
    _add_sampling(gen)
    gen.set_defaults(run=_generate)

    data = sub.add_parser("data", help="build the regenerated ShareGPT training set")
    data.add_argument("action", choices=["build"])
    data.add_argument("--tokens", type=int, default=None,
                      help="training response tokens to reach (default 100000, about 20 minutes on 2 cores)")
    data.add_argument("--sampled", action="store_true",
                      help="answers sampled at temperature 1 (data/regen/sharegpt_smollm2_t1.npz) instead of greedy")
    data.set_defaults(run=_data)

    train = sub.add_parser("train", help="distil a draft model or train an EAGLE head or the judge head from the "
                                        "target (eagle3 also runs under torchrun --nproc_per_node N)")
    from .options import add_options
    from .train.options import TRAINERS
    trainers = train.add_subparsers(dest="what", required=True, metavar="{" + ",".join(TRAINERS) + "}")
    for what, (options, purpose) in TRAINERS.items():
        add_options(trainers.add_parser(what, help=purpose, description=purpose), options).set_defaults(options=options)
    train.set_defaults(run=_train)

    evaluate = sub.add_parser("evaluate", help="score saved draft heads with the one held-out evaluator")
    evaluate.add_argument("name", nargs="*", help="data/eagle/NAME.safetensors, one or more (default eagle1; "
                                                  "`all`: every head there)")
    evaluate.add_argument("--prompts", type=_positive, default=64,
                          help="the first N held-out prompts, of which the unique ones are scored (default 64: 50 "
                               "prompts); with --split train, the first N training prompts")
    evaluate.add_argument("--split", default="heldout", choices=["heldout", "train"],
                          help="score the held-out prompts (default; written under \"evaluation\") or the first "
                               "training prompts (under \"evaluation_train\": the gap shows what is memorised)")
    evaluate.set_defaults(run=_evaluate)

    export = sub.add_parser("export", help="write a trained EAGLE-3 head in the layout serving engines load")
    export.add_argument("what", choices=["eagle3"])
    export.add_argument("--out", required=True, help="folder for config.json and model.safetensors")
    export.add_argument("--name", default=EAGLE3_SHIPPED,
                        help=f"data/eagle/NAME.safetensors (default {EAGLE3_SHIPPED})")
    export.set_defaults(run=_export)

    tune = sub.add_parser("tune", help="choose the EAGLE tree size for this machine (cost model)")
    tune.add_argument("what", choices=["tree"])
    tune.add_argument("--positions", type=int, default=160, help="draft positions measured (default 160)")
    tune.add_argument("--max-new-tokens", type=_positive, default=128, help="length of the tuning continuations")
    tune.add_argument("--draft-vocab", type=int, default=8192,
                      help="eagle1: draft over the N most frequent training tokens (0: all 49,152; default "
                           "8192); an EAGLE-3 head drafts over its own vocabulary")
    tune.add_argument("--head", choices=["eagle1", "eagle3"], default="eagle1",
                      help="which shipped head to tune for (each has its own choice file; default eagle1)")
    tune.add_argument("--name", default=None,
                      help="the head file data/eagle/NAME.safetensors of that kind "
                           f"(default: eagle1, or {EAGLE3_SHIPPED})")
    tune.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                      help="the target's dtype to tune for (each has its own choice file; default float32)")
    tune.set_defaults(run=_tune)

    endtoend = sub.add_parser("endtoend", help="bench on several datasets and temperatures into one JSON that a "
                                                "rerun resumes (notebook 08)")
    endtoend.add_argument("--methods", default="ar,hf,hf-assisted,hf-pld,sd,eagle1,eagle2,eagle3,judge",
                          help="comma-separated, as for bench (a lossy rule runs at temperature 0 only)")
    endtoend.add_argument("--settings", default="mt_bench:0,humaneval:0,sharegpt_heldout:0,mt_bench:1,humaneval:1,"
                                                "sharegpt_heldout:1", help="dataset:temperature pairs, comma-separated")
    endtoend.add_argument("--limit", type=_positive, default=5, help="prompts per setting (default 5)")
    endtoend.add_argument("--json", default=None,
                          help="results file (default data/results/end_to_end.json; with LAB_FAST=1 under .cache)")
    endtoend.add_argument("--engine", choices=["auto", "transformers"], default="auto", help="as for bench")
    _add_sampling(endtoend)
    endtoend.set_defaults(run=_endtoend)

    quality = sub.add_parser("quality", help="notebook 07's quality-against-speed sweep (target, draft, SD, Top-K, "
                                             "judge over its threshold, EAGLE-1 chain) into one JSON "
                                             "that a rerun resumes")
    quality.add_argument("--per-kind", type=int, default=20,
                         help="evaluation-half questions of each kind (default 20: 102 questions)")
    quality.add_argument("--json", default=None, help="results file (default data/results/judge_quality.json; "
                                                      "with LAB_FAST=1 under .cache)")
    quality.add_argument("--judge", default="judge",
                         help="the judge head data/judge/NAME.json (default judge, the shipped one); another "
                              "head's judge runs are added to the file under its name, the other runs shared")
    quality.set_defaults(run=_quality)

    run = sub.add_parser("run", help="run a named experiment (lab/experiments.py): its steps whose files are "
                                     "missing; --list shows them all")
    run.add_argument("name", nargs="?", help="the experiment (`--list` names them)")
    run.add_argument("--list", action="store_true", help="every experiment, what it makes and which files exist")
    run.add_argument("--force", action="store_true", help="redo the steps whose files exist")
    run.add_argument("--rerun", metavar="FILE", default=None,
                     help="rerun what made a result file: its experiment's step, or the command recorded inside it")
    run.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    run.set_defaults(run=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args.run(args)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0

