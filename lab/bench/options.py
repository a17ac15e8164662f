"""The options of the decoding commands (`bench`, `generate`, `endtoend`), written once: the
flags are generated from these fields and a result records them whole under `config`."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..options import opt
from ..paths import EAGLE3_SHIPPED


def positive(text: str) -> int:
    """argparse type: an integer of at least 1 (a count of prompts or tokens)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _triple(text: str, names: str, example: str) -> tuple[int, int, int]:
    try:
        triple = tuple(int(x) for x in text.split(","))
        assert len(triple) == 3 and min(triple) >= 1
    except (ValueError, AssertionError):
        raise argparse.ArgumentTypeError(f"must be three positive integers {names} (e.g. {example}), "
                                         f"got {text!r}") from None
    return triple


def tree_triple(text: str) -> tuple[int, int, int]:
    """argparse type: depth,top-k,total as three positive integers."""
    return _triple(text, "depth,top-k,total", "4,4,16")


def lookahead_triple(text: str) -> tuple[int, int, int]:
    """argparse type: Lookahead's N,W,G as three positive integers."""
    return _triple(text, "N,W,G", "4,4,3")


@dataclass
class DecodeOptions:
    """What every decoding command shares: sampling, the drafters' settings, the target."""
    temperature: float = opt(0.0, "0 = greedy")
    top_k: int = opt(0, "0 disables")
    top_p: float = opt(1.0, "1 disables")
    draft_len: int = opt(4, "drafts per cycle")
    draft_layers: int = opt(2, "which shipped draft `sd` uses", choices=[1, 2, 4])
    tree: tuple = opt((4, 4, 16), "sd-tree: depth,top-k,total tokens", parse=tree_triple)
    lookahead: tuple = opt((4, 4, 3), "lookahead: N (n-gram size), W (Jacobi window width), G (n-grams kept per "
                                      "first token and verified per step)", parse=lookahead_triple)
    judge_threshold: float | None = opt(None, "judge: accept a draft if P(correct) > this (default: the shipped "
                                              "head's delta)")
    verify_top_k: int = opt(2, "topk: accept drafts among the target's top K")
    eagle_tree: str = opt("auto", "eagle1/eagle2/eagle3: depth,top-k,total tokens, or auto = the size `python -m "
                                  "lab tune tree` chose for this machine and head; a given tree applies to every "
                                  "EAGLE method (an EAGLE-1 head drafts over its tuned vocabulary, an EAGLE-3 head "
                                  "over its own)")
    eagle_head: str = opt("eagle1", "eagle1/eagle2: data/eagle/NAME.safetensors (eagle1-gpu: the GPU-trained one)")
    eagle3_head: str = opt(EAGLE3_SHIPPED, "eagle3: data/eagle/NAME.safetensors (eagle3: the earlier one on half "
                                           "the data; eagle3-gpu: the GPU-trained one)")
    medusa_head: str = opt("medusa", "medusa: data/eagle/NAME.safetensors (`python -m lab train medusa`)")
    medusa_tree: str = opt("auto", "medusa: tokens of its static tree, root included, or auto = the size the cost "
                                   "model predicts fastest from this machine's T(n) (the --eagle-head's tuning file "
                                   "for the dtype) and the heads' measured per-head rank accuracies")
    max_new_tokens: int = opt(128, "new tokens per prompt", parse=positive)
    seed: int = opt(0, "seed of the sampling streams")
    device: str | None = opt(None, "cpu or cuda (default: cuda when available)")
    kernel: str | None = opt(None, "verification: torch reference or Triton kernels (default: triton on a GPU, "
                                   "torch on CPU)", choices=["torch", "triton"])
    dtype: str = opt("float32", "the target's weights and activations (bfloat16 uses the CPU's matrix units, "
                                "where it has them, for multi-token forwards; q4_1: the GGUF's own blocks, Q4_1 "
                                "layers and the Q8_0 embedding and LM head)", choices=["float32", "bfloat16", "q4_1"])
    target: str = opt("smollm2", "`tiny` is a random 2-layer Llama for smoke tests (its draft is untrained)",
                      choices=["smollm2", "tiny"])
    engine: str = opt("auto", "the target forward: auto (bfloat16 on the CPU runs the exact engine, "
                              "lab/target/exact.py) or transformers (also in bfloat16: not batch-invariant, for "
                              "comparison)",
                      choices=["auto", "transformers"])


@dataclass
class BenchOptions(DecodeOptions):
    """`python -m lab bench`: methods compared on one dataset."""
    methods: str = opt("ar,sd", "comma-separated: ar,sd,sd-tree,pld,pld-tree,lookahead,medusa,eagle1,eagle2,eagle3,"
                                "eagle3-static,judge,topk,hf,hf-assisted,hf-pld,llamacpp,llamacpp-q4_0,llamacpp-bf16,"
                                "llamacpp-pld")
    dataset: str = opt("mt_bench", "mt_bench, humaneval, sharegpt or sharegpt_heldout (the regenerated set's "
                                   "held-out prompts)")
    prompts: str | None = opt(None, "JSONL file with one {\"prompt\": ...} per line")
    limit: int = opt(10, "the dataset's first N prompts", parse=positive)
    json: str | None = opt(None, "write the full results here")
    figure: str | None = opt(None, "write a speed/tau figure here (PNG)")
    breakdown: bool = opt(False, "also print where each cycle's time goes (ms: drafting, the target's forward, "
                                 "acceptance and cache update, commit, the loop's own) beside the bandwidth floor "
                                 "(the target's weights at this machine's measured read bandwidth)")
    batch_size: str = opt("1", "comma-separated batch sizes, e.g. 1,2,4,8,16: other than 1, each method decodes "
                               "groups of b prompts at once on the exact engine, against batched ar at the same b "
                               "(lab/bench/batch.py)")


@dataclass
class GenerateOptions(DecodeOptions):
    """`python -m lab generate`: one answer streamed, coloured by where each token came from."""
    prompt: str = opt(None, "the question", positional=True)
    method: str = opt("eagle2", "the drafter and rule", choices=["ar", "sd", "sd-tree", "pld", "pld-tree", "lookahead",
                                                                 "medusa", "eagle1", "eagle2", "eagle3",
                                                                 "eagle3-static", "judge", "topk"])
    no_color: bool = opt(False, "plain text")


@dataclass
class EndToEndOptions(DecodeOptions):
    """`python -m lab endtoend`: bench on several datasets and temperatures into one resumable file."""
    methods: str = opt("ar,hf,hf-assisted,hf-pld,sd,pld,lookahead,medusa,eagle1,eagle2,eagle3,judge",
                       "comma-separated, as for bench (a lossy rule runs at temperature 0 only)")
    settings: str = opt("mt_bench:0,humaneval:0,sharegpt_heldout:0,mt_bench:1,humaneval:1,sharegpt_heldout:1",
                        "dataset:temperature pairs, comma-separated")
    limit: int = opt(5, "prompts per setting", parse=positive)
    json: str | None = opt(None, "results file (default data/results/end_to_end.json; with LAB_FAST=1 under .cache)")


def method_list(text: str) -> list[str]:
    """`ar, sd,` -> ["ar", "sd"]."""
    return [m.strip() for m in text.split(",") if m.strip()]
