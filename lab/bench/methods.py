"""Each method of the bench as a runner: the lab's own loop with the drafter and rule of
`make_drafter`, transformers' `generate` (plain, assisted, prompt lookup) and llama.cpp's
(llamacpp.py); and the settings each method records."""
from __future__ import annotations

import time
from typing import Callable

import torch

from ..decode import DecodeResult, decode, resolve_kernel
from ..drafters import Lookahead, ModelDraft, NoDraft, PromptLookup, TreeModelDraft
from ..drafters.lookahead import lookahead_positions
from ..drafters.medusa import MedusaDraft
from ..errors import LabError
from ..sampling import prompt_seed
from ..target.load import engine_for
from ..verify.lossy import TopKRule
from .llamacpp import llamacpp_runner, llamacpp_settings
from .setup import (EAGLE3_METHODS, EAGLE_METHODS, LLAMACPP_METHODS, LOOKUP_METHODS, LOSSY_METHODS, METHODS, PEERS,
                    STATIC_METHODS, Setup, is_method, lookahead_config)

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


def make_drafter(setup: Setup, method: str) -> tuple[object, int, object | None]:
    """(drafter, drafts per cycle, acceptance rule) of one of the methods that run in the lab's
    loop, from the components already loaded into `setup`; the rule is None for the lossless
    methods and a lossy rule (lab/verify/lossy.py) for judge and topk. The bench, `python -m lab
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
    if method in LOOKUP_METHODS:
        return PromptLookup(LOOKUP_METHODS[method]), setup.draft_len, None
    if method == "medusa":
        if setup.medusa is None:
            raise LabError("medusa needs its heads (Setup.medusa; the command line loads --medusa-head)")
        return MedusaDraft(setup.medusa, setup.medusa_shape), max(map(len, setup.medusa_shape)), None
    lookahead = lookahead_config(method, setup.lookahead)
    if lookahead:  # a pooled n-gram drafts its N - 1 tokens after the root
        return Lookahead(*lookahead), lookahead[0] - 1, None
    if method == "judge":
        if setup.judge is None:
            raise LabError("judge needs a judge rule (Setup.judge; the command line loads data/judge/judge.json)")
        return ModelDraft(setup.draft), setup.draft_len, setup.judge
    if method == "topk":
        return ModelDraft(setup.draft), setup.draft_len, TopKRule(setup.verify_top_k)
    loop = ", ".join(m for m in METHODS if m not in PEERS)
    raise LabError(f"{method} does not run in the lab's loop: choose from {loop}")


def make_runner(setup: Setup, method: str) -> Runner:
    if method not in PEERS and is_method(method):
        drafter, draft_len, rule = make_drafter(setup, method)
        return _ours(setup, drafter, draft_len, rule)
    if method in ("hf", "hf-assisted", "hf-pld"):
        return _hf(setup, method)
    if method in LLAMACPP_METHODS:
        return llamacpp_runner(setup, method)
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
    if method in LOOKUP_METHODS:
        lookup = PromptLookup(LOOKUP_METHODS[method])
        return {"loop": "lab.decode", "verification_kernel": kernel, "draft_len": setup.draft_len,
                "drafts": "a chain" if lookup.candidates == 1 else f"a tree of up to {lookup.candidates} continuations",
                "suffix_ngram": [lookup.min_ngram, lookup.max_ngram]}
    if method == "medusa":
        return {"loop": "lab.decode", "verification_kernel": kernel, "heads": len(setup.medusa.blocks),
                "tree": "static (Medusa: greedy by the product of measured per-head rank accuracies)",
                "total_tokens": len(setup.medusa_shape) + 1, "depth": max(map(len, setup.medusa_shape)),
                "draft_vocab": len(setup.medusa.vocab), "sized_by_cost_model": setup.medusa_sizing}
    if lookahead := lookahead_config(method, setup.lookahead):
        n, w, g = lookahead
        return {"loop": "lab.decode", "verification_kernel": kernel, "n": n, "window": w, "pool": g,
                "positions_per_step": lookahead_positions(n, w, g)}
    if method in EAGLE_METHODS:
        t = setup.tree_for(method)
        static = method in STATIC_METHODS
        head = setup.head3 if method in EAGLE3_METHODS else setup.head
        return {"loop": "lab.decode", "verification_kernel": kernel, "head": getattr(head, "variant", None),
                "tree": "none: this machine's tuning chose AR" if t.is_ar
                else "static (EAGLE-1 shape from per-rank accuracy)" if static
                else "dynamic (EAGLE-2 expansion and reranking)", "tree_source": t.source or "given (--eagle-tree)",
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
    if method in LLAMACPP_METHODS:
        return llamacpp_settings(method)
    settings = {k: v for k, v in _hf_settings(setup, method).items() if k not in ("eos_token_id", "pad_token_id")}
    if method == "hf-assisted":
        settings["assistant"] = f"the sd draft ({draft_layers} layers)"
    return {"loop": "transformers.generate", **settings}


