"""How closely each engine computes the target: teacher-forced top-1 agreement and mean KL against the
float32 reference over the same MT-Bench positions. The positions are the reference's own greedy replies;
every engine scores each prompt and its reply in one forward, and at every reply position its next-token
distribution is compared with the reference's: the same argmax or not, and KL(reference || engine)."""
from __future__ import annotations

import numpy as np
import torch

from ..artifacts import command_line, git_commit, machine
from ..data import chat_ids, mt_bench
from ..decode import decode
from ..drafters import NoDraft
from ..errors import LabError
from ..sampling import Sampling
from ..target.engine import Engine
from ..target.load import engine_for, engine_kind, load_target, load_tokenizer
from .llamacpp import _llama_cpp, gguf_file
from .setup import LLAMACPP_METHODS

ENGINES = ("float32", "bfloat16", "q4_1")  # the lab's, by --dtype; llama.cpp's by method name


def reference_replies(prompts: int, new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) of the float32 reference's greedy decoding of the first MT-Bench prompts."""
    model, tokenizer = load_target("float32"), load_tokenizer()
    engine, pairs = Engine(model), []
    for p in mt_bench()[:prompts]:
        prompt = chat_ids(tokenizer, p.text)
        tokens = decode(engine, NoDraft(), prompt, new_tokens, Sampling(), 1, 0, tokenizer.eos_token_id).tokens
        pairs.append((prompt, tokens))
    return pairs


def _lab_scorer(dtype: str):
    engine = engine_for(load_target(dtype))

    def score(ids: list[int]) -> np.ndarray:
        engine.reset()
        return engine.forward(ids).logits.float().numpy()
    return score, engine_kind(engine.model)


def _llamacpp_scorer(method: str):
    weights, _ = LLAMACPP_METHODS[method]
    threads = torch.get_num_threads()
    llm = _llama_cpp().Llama(model_path=str(gguf_file(weights)), n_ctx=4096, n_threads=threads,
                             n_threads_batch=threads, logits_all=True, verbose=False)

    def score(ids: list[int]) -> np.ndarray:
        llm.reset()
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    return score, f"llama.cpp ({weights.upper()} file)"


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def fidelity(configs: list[str], prompts: int = 10, new_tokens: int = 128) -> dict:
    """For each config (a lab dtype of ENGINES or a llama.cpp method), top-1 agreement with the float32
    reference and mean KL(reference || config) in nats over every reply position; the result records
    the command, commit and machine."""
    unknown = [c for c in configs if c not in ENGINES and c not in LLAMACPP_METHODS]
    if unknown:
        raise LabError(f"fidelity: unknown configuration {', '.join(unknown)}: choose from "
                       f"{', '.join(ENGINES + tuple(m for m in LLAMACPP_METHODS if m != 'llamacpp-pld'))}")
    pairs = reference_replies(prompts, new_tokens)
    reference, _ = _lab_scorer("float32")
    rows = {}
    for config in configs:
        score, kind = _lab_scorer(config) if config in ENGINES else _llamacpp_scorer(config)
        agree, kl, positions = 0, 0.0, 0
        for prompt, reply in pairs:
            ids = prompt + reply
            at = slice(len(prompt) - 1, len(ids) - 1)  # the logits that predict each reply token
            ref, got = _log_softmax(reference(ids)[at]), _log_softmax(score(ids)[at])
            agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
            kl += float((np.exp(ref) * (ref - got)).sum())
            positions += len(reply)
        rows[config] = {"engine": kind, "positions": positions, "top1_agreement": agree / positions,
                        "mean_kl_nats": kl / positions}
        print(f"[fidelity] {config:16s} {kind:40s} top-1 {agree / positions:7.2%}  KL {kl / positions:.4f} nats",
              flush=True)
    return {"command": command_line(), "commit": git_commit(), "machine": machine(), "prompts": prompts,
            "new_tokens": new_tokens, "reference": "float32 transformers engine, its own greedy replies",
            "configs": rows}


def format_fidelity(result: dict) -> str:
    lines = ["| configuration | engine | top-1 agreement | mean KL (nats) |", "|---|---|---|---|"]
    for name, r in result["configs"].items():
        lines.append(f"| {name} | {r['engine']} | {r['top1_agreement']:.1%} of {r['positions']} | "
                     f"{r['mean_kl_nats']:.4f} |")
    return "\n".join(lines)
