"""The components a decoding run needs, loaded once: `Setup`, and `load_setup` which builds it
from a command's options (the target, the draft, the heads and their trees, the lossy rules)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from ..costmodel import TreeChoice, given_tree, machine_tuning, medusa_tree, quick_tune, tree_for_machine
from ..drafters import EagleDraft, NoDraft, draft_vocabulary, static_shape
from ..drafters.heads import check_head, head_manifest, load_head, rank_accuracy_of
from ..drafters.medusa import MedusaDraft
from ..errors import LabError
from ..judge.probe import load_judge
from ..sampling import Sampling
from ..timing import fastest
from ..target.load import QUANT, load_draft, load_target, load_tokenizer, make_draft, tiny_target
from ..verify.lossy import JudgeRule
from .options import DecodeOptions, tree_triple

# llama.cpp (lab/bench/llamacpp.py): method -> (weights, prompt-lookup draft tokens or None); llama-cpp-python's
# README suggests 2 draft tokens on a CPU-only machine (10 on a GPU)
LLAMACPP_METHODS = {"llamacpp": ("q4_1", None), "llamacpp-q4_0": ("q4_0", None), "llamacpp-bf16": ("bf16", None),
                    "llamacpp-pld": ("q4_1", 2)}
METHODS = ("ar", "sd", "sd-tree", "pld", "pld-tree", "lookahead", "medusa", "eagle1", "eagle2", "eagle3",
           "eagle3-static", "judge", "topk", "hf", "hf-assisted", "hf-pld", *LLAMACPP_METHODS)
LOOKUP_METHODS = {"pld": 1, "pld-tree": 4}  # prompt lookup: the continuations each cycle drafts (a chain, a tree)
LOSSY_METHODS = ("judge", "topk")  # the sd draft's chain, a lossy acceptance rule (lab/verify/lossy.py)
EAGLE_METHODS = ("eagle1", "eagle2", "eagle3", "eagle3-static")
EAGLE3_METHODS = ("eagle3", "eagle3-static")  # the EAGLE-3 head with EAGLE-2's dynamic tree, or a static one
STATIC_METHODS = ("eagle1", "eagle3-static")  # EAGLE-1's static tree, shaped by the head's per-rank accuracy
PEERS = ("hf", "hf-assisted", "hf-pld", *LLAMACPP_METHODS)  # other loops than ours
MEDUSA_FALLBACK = 4  # medusa's tree, in tokens, where no tuning of this machine can size it
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
    lookahead: tuple[int, int, int] = (4, 4, 3)  # lookahead: N, W, G
    head: torch.nn.Module | None = None        # eagle1/eagle2: the EAGLE head
    eagle_tree: TreeChoice | None = None       # eagle1/eagle2: tree size (from `python -m lab tune tree`)
    rank_accuracy: list[float] | None = None   # eagle1: per-rank accuracy that shapes the static tree
    head3: torch.nn.Module | None = None       # eagle3: the EAGLE-3 head
    eagle3_tree: TreeChoice | None = None      # eagle3: its tree size (tuned for it, or given)
    rank_accuracy3: list[float] | None = None  # eagle3-static: the EAGLE-3 head's per-rank accuracy
    medusa: torch.nn.Module | None = None      # medusa: the Medusa heads
    medusa_shape: list[tuple[int, ...]] | None = None  # medusa: its static tree's rank paths
    medusa_sizing: dict | None = None          # medusa: the cost model's figures for the size it chose (auto)
    judge: object | None = None                # judge: the JudgeRule (lab/verify/lossy.py), head and threshold
    verify_top_k: int = 2                      # topk: accept drafts among the target's top K

    def tree_for(self, method: str) -> TreeChoice:
        return self.eagle3_tree if method in EAGLE3_METHODS else self.eagle_tree

    def eagle_drafter(self, method: str) -> EagleDraft | NoDraft:
        """The head's drafter at its tree; no drafts where the machine's tuning chose AR."""
        eagle3 = method in EAGLE3_METHODS
        head = self.head3 if eagle3 else self.head
        t = self.tree_for(method)
        if head is None or t is None:
            raise LabError(f"{method} needs an EAGLE head and a tree size "
                           "(Setup.head/head3, Setup.eagle_tree/eagle3_tree)")
        if t.is_ar:
            return NoDraft()
        # an EAGLE-3 head drafts over its own vocabulary; EAGLE-1's may be given a reduced one
        vocab = draft_vocabulary(t.draft_vocab) if t.draft_vocab and not eagle3 else None
        if method in STATIC_METHODS:
            ranks = self.rank_accuracy3 if eagle3 else self.rank_accuracy
            return EagleDraft(head, "static", shape=static_shape(t.total_tokens, t.depth, ranks), vocab=vocab)
        return EagleDraft(head, "dynamic", t.depth, t.top_k, t.total_tokens, vocab=vocab)



def lookahead_config(method: str, given: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """Lookahead's N, W, G for `method`: `lookahead` runs the --lookahead triple (`given`),
    `lookahead-N-W-G` its own, so that a sweep's configurations share one bench and one file;
    None for any other method."""
    if method == "lookahead":
        return given
    parts = method.split("-")
    if len(parts) == 4 and parts[0] == "lookahead" and all(p.isdigit() for p in parts[1:]):
        return int(parts[1]), int(parts[2]), int(parts[3])
    return None


def is_method(method: str) -> bool:
    return method in METHODS or lookahead_config(method, (0, 0, 0)) is not None


NEEDS_DRAFT = ("sd", "sd-tree", "hf-assisted", "judge", "topk")  # the methods that run the draft model


def _given_tree(options: DecodeOptions) -> tuple[int, int, int] | None:
    """The --eagle-tree triple, None for auto."""
    if options.eagle_tree == "auto":
        return None
    try:
        return tree_triple(options.eagle_tree)
    except argparse.ArgumentTypeError as err:
        raise LabError(f"--eagle-tree {err}") from None


def _head(options: DecodeOptions, target, tokenizer, name: str, kind: str, flag: str):
    """A head file, its tree (the given --eagle-tree, else this machine's tuning: see
    `tree_for_machine`, whose one line is printed) and the per-rank accuracies of its manifest
    (for a static tree); a bad --eagle-tree fails before any loading."""
    check_head(name, kind, flag)
    given = _given_tree(options)
    head = load_head(target, name)
    if given:
        tree = given_tree(*given, dtype=options.dtype, head=name, kind=kind)
    else:
        tree = tree_for_machine(options.dtype, name, kind, lambda path: quick_tune(target, tokenizer, head, name, path))
        print(f"[tree] {name}: {tree.source}", flush=True)
    return head, tree, rank_accuracy_of(head_manifest(name))


def _medusa_shape(options: DecodeOptions, heads, accuracy: list[list[float]]) -> tuple[list, dict | None]:
    """Medusa's tree: --medusa-tree N tokens, or (auto) the size the cost model picks with this
    machine's T(n) and the heads' own cost per cycle, timed here."""
    if options.medusa_tree != "auto":
        if not options.medusa_tree.isdigit() or int(options.medusa_tree) < 2:
            raise LabError(f"--medusa-tree takes auto or a number of tokens of at least 2, not {options.medusa_tree!r}")
        return static_shape(int(options.medusa_tree), len(accuracy), accuracy), None
    tuned, why = machine_tuning(options.dtype, options.eagle_head)
    if tuned is None:  # no T(n) of this machine to size it with
        print(f"[tree] medusa: {why}: a conservative {MEDUSA_FALLBACK} tokens instead (size it: `python -m lab tune "
              f"tree --name {options.eagle_head} --dtype {options.dtype} --quick`, or pass --medusa-tree N)",
              flush=True)
        return static_shape(MEDUSA_FALLBACK, len(accuracy), accuracy), {"total_tokens": MEDUSA_FALLBACK,
                                                                        "not_sized": why}
    drafter = MedusaDraft(heads, static_shape(16, len(accuracy), accuracy))
    drafter.begin([0])
    h = torch.zeros(1, heads.blocks[0].in_features, dtype=heads.blocks[0].weight.dtype)
    seconds = fastest({"cycle": lambda: (drafter.commit([0, 0], h), drafter.propose([0, 0], 4, Sampling(), None))},
                      repeats=20)["cycle"]
    return medusa_tree(accuracy, tuned, seconds)


def load_setup(options: DecodeOptions, methods: list[str]) -> Setup:
    """The models and settings `methods` need, from a decoding command's options: the target (and
    the draft model where a method runs it) on the device, the EAGLE heads with their trees, the
    judge rule. Bad sampling options or a threshold without the judge fail before any loading."""
    o = options
    if o.temperature < 0 or not 0 < o.top_p <= 1 or o.top_k < 0 or o.draft_len < 0:
        raise LabError("need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0 and --draft-len >= 0")
    if o.judge_threshold is not None and "judge" not in methods:
        raise LabError("--judge-threshold sets the judge method's threshold: add judge to the methods, or drop it")
    os.environ["LAB_ENGINE"] = o.engine  # read by lab.target.load.engine_for, wherever a forward is made
    need_draft = any(m in NEEDS_DRAFT for m in methods)
    device = o.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if o.target == "tiny":
        if o.dtype == QUANT:
            raise LabError("--target tiny has no GGUF file: use --dtype float32 or bfloat16 with it")
        target = tiny_target(0).to(getattr(torch, o.dtype))
        draft = make_draft(target, 1) if need_draft else None
    else:
        target = load_target(o.dtype)
        draft = load_draft(target, o.draft_layers) if need_draft else None
    target.to(device)  # the draft shares the target's embedding and head, so move it too
    if draft is not None:
        draft.to(device)
    setup = Setup(target, draft, load_tokenizer(), Sampling(o.temperature, o.top_k, o.top_p), o.max_new_tokens,
                  o.draft_len, o.seed, o.kernel, tuple(o.tree), tuple(o.lookahead), verify_top_k=o.verify_top_k)
    if any(m in ("eagle1", "eagle2") for m in methods):
        setup.head, setup.eagle_tree, setup.rank_accuracy = _head(o, target, setup.tokenizer, o.eagle_head, "eagle1",
                                                                  "--eagle-head")
    if any(m in EAGLE3_METHODS for m in methods):
        setup.head3, setup.eagle3_tree, setup.rank_accuracy3 = _head(o, target, setup.tokenizer, o.eagle3_head,
                                                                     "eagle3", "--eagle3-head")
    if "medusa" in methods:
        check_head(o.medusa_head, "medusa", "--medusa-head")
        setup.medusa = load_head(target, o.medusa_head)
        accuracy = head_manifest(o.medusa_head)["evaluation"]["rank_accuracy_by_head"]
        setup.medusa_shape, setup.medusa_sizing = _medusa_shape(o, setup.medusa, accuracy)
    if "judge" in methods:
        probe, delta = load_judge(target)
        setup.judge = JudgeRule(probe, delta if o.judge_threshold is None else o.judge_threshold)
    return setup
