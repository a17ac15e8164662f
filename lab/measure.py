"""Measurements of the target on this machine: forward latency T(k), bytes moved, FLOP/s, the roofline
(read bandwidth, matrix-multiply peak), and the difference between batched and one-token forwards."""
from __future__ import annotations

import time
from typing import Callable

import torch

from .sampling import probabilities
from .target.engine import Request
from .target.exact import forward_batch
from .target.products import step_seconds
from .target.load import engine_for, exact_engine
from .theory import acceptance_rate
from .timing import fastest


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights read per forward (tied embedding/LM head counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def matmul_flops_per_token(model: torch.nn.Module) -> int:
    """2 x the weights of every linear layer, LM head included (an embedding lookup is no matmul)."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 2 * n


def kv_cache_bytes(model: torch.nn.Module, context: int) -> int:
    """Bytes of keys and values one sequence's forward reads from its KV cache at `context` tokens."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * context * element


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Memory read bandwidth (bytes per second): the fastest of `repeats` sums over a large tensor."""
    x = torch.ones(megabytes * 2**20 // 4)
    return x.numel() * 4 / fastest({0: lambda: x.sum()}, repeats)[0]


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, repeats: int = 5) -> float:
    """FLOP per second of one n x n matrix product in `dtype`: the machine's arithmetic ceiling."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / fastest({0: lambda: a @ b}, repeats)[0]


@torch.inference_mode()
def linear_latency(model: torch.nn.Module, ks: list[int], repeats: int = 5) -> dict[int, float]:
    """Seconds (fastest of `repeats`) of only the weight products of one forward over k rows: every
    linear layer, the LM head included, on random inputs; the rest of T(k) is attention and overhead."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dtype = linears[0].weight.dtype
    out = {}
    for k in ks:
        # one input per input width, reused, as a forward's activations stay in cache
        inputs = {m.in_features: torch.randn(k, m.in_features, dtype=dtype) for m in linears}

        def products() -> None:
            for m in linears:
                torch.nn.functional.linear(inputs[m.in_features], m.weight)
        out[k] = fastest({0: products}, repeats)[0]
    return out


def cropped_forwards(model: torch.nn.Module, configs: list[tuple[int, bool]], prefix: int = 200, seed: int = 0,
                     make_engine: Callable = engine_for) -> dict[tuple[int, bool], Callable[[], None]]:
    """Per (k, tree) in `configs`, a function that runs one forward over k random new positions after
    `prefix` cached ones (tree: with an explicit mask among them) and crops them; one engine for all."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prefix_ids = torch.randint(0, vocab, (prefix,), generator=g).tolist()
    engine = make_engine(model)
    engine.reset()
    engine.forward(prefix_ids)

    def step(new: list[int], mask: torch.Tensor | None) -> Callable[[], None]:
        def run() -> None:
            engine.forward(new, mask=mask)
            engine.crop(prefix)
        return run
    steps = {}
    for k, tree in configs:
        new = torch.randint(0, vocab, (k,), generator=g).tolist()
        steps[(k, tree)] = step(new, torch.ones(k, k, dtype=torch.bool).tril() if tree else None)
    return steps


def latency_table(model: torch.nn.Module, configs: list[tuple[int, bool]], prefix: int = 200, repeats: int = 5,
                  seed: int = 0, make_engine: Callable = engine_for) -> dict[tuple[int, bool], float]:
    """Seconds of each of `cropped_forwards`, the fastest of `repeats` runs taken in turns, so that timings
    the cost model divides by each other come from the same minutes."""
    return fastest(cropped_forwards(model, configs, prefix, seed, make_engine), repeats)


def forward_latency(model: torch.nn.Module, ks: list[int], prefix: int = 200, cached: bool = True,
                    repeats: int = 5, seed: int = 0, tree: bool = False,
                    make_engine: Callable = engine_for) -> dict[int, float]:
    """Seconds of one forward over k new positions after `prefix` tokens (fastest of `repeats`, in turns).
    cached=False recomputes the prefix with them; tree=True passes an explicit mask among the new
    positions, as tree verification does, and needs cached=True (else ValueError)."""
    if tree and not cached:
        raise ValueError("forward_latency: tree=True times a cached tree forward; it needs cached=True")
    if cached:
        table = latency_table(model, [(k, tree) for k in ks], prefix, repeats, seed, make_engine)
        return {k: table[(k, tree)] for k in ks}
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prefix_ids = torch.randint(0, vocab, (prefix,), generator=g).tolist()
    engine = make_engine(model)

    def step(ids: list[int]) -> Callable[[], None]:
        def run() -> None:
            engine.reset()
            engine.forward(ids)
        return run
    return fastest({k: step(prefix_ids + torch.randint(0, vocab, (k,), generator=g).tolist()) for k in ks},
                           repeats)


def exact_step_latency(model: torch.nn.Module, ks: list[int], prefix: int = 200, repeats: int = 5,
                       seed: int = 0) -> dict[int, dict[str, float]]:
    """Seconds per step of the exact bfloat16 engine's tree-masked forward over k new positions after
    `prefix` cached tokens (its steps, "other" and "total"), from the fastest of `repeats` runs."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    engine = exact_engine(model)
    engine.forward(torch.randint(0, vocab, (prefix,), generator=g).tolist())
    out = {}
    for k in ks:
        new, mask = torch.randint(0, vocab, (k,), generator=g).tolist(), torch.ones(k, k, dtype=torch.bool).tril()
        runs = []
        for attempt in range(3 + repeats):  # the first three warm up
            with step_seconds() as steps:
                start = time.perf_counter()
                engine.forward(new, mask=mask)
                total = time.perf_counter() - start
            engine.crop(prefix)
            if attempt >= 3:
                runs.append({**steps, "other": total - sum(steps.values()), "total": total})
        out[k] = min(runs, key=lambda r: r["total"])
    return out


@torch.inference_mode()
def batched_vs_incremental(model: torch.nn.Module, ids: list[int], start: int,
                           make_engine: Callable = engine_for) -> dict:
    """Logits for positions start.. from one forward over the whole sequence and from one token at a time
    with the KV cache: whether bit-identical, their differences, argmax flips and top-2 gaps below 1e-3."""
    full = make_engine(model).forward(ids).logits[start - 1: -1]
    engine = make_engine(model)
    engine.forward(ids[: start - 1])
    steps = torch.stack([engine.forward([t]).logits[-1] for t in ids[start - 1: -1]])
    diff = (full - steps).abs().max(-1).values
    top2 = torch.topk(full, 2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    return {"positions": len(diff), "identical": bool(torch.equal(full, steps)), "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "argmax_flips": int((full.argmax(-1) != steps.argmax(-1)).sum()),
            "min_top2_gap": float(gap.min()), "gaps_below_1e-3": int((gap < 1e-3).sum())}


@torch.inference_mode()
def draft_alpha(target: torch.nn.Module, draft: torch.nn.Module, sequences, sampling) -> float:
    """Mean over response positions of alpha = sum_x min(p(x), q(x)), p and q the target's and draft's
    distributions under `sampling`. `sequences` are (token ids, prompt length) pairs."""
    total, count = 0.0, 0
    for ids, prompt_len in sequences:
        x = torch.as_tensor(ids).reshape(1, -1)
        rows = slice(prompt_len - 1, len(ids) - 1)
        p = probabilities(target(input_ids=x).logits[0, rows], sampling)
        q = probabilities(draft(input_ids=x).logits[0, rows], sampling)
        a = acceptance_rate(p, q)
        total, count = total + float(a.sum()), count + len(a)
    return total / max(count, 1)


@torch.inference_mode()
def exact_batch_latency(model: torch.nn.Module, batches: list[int], ns: list[int], prefix: int = 200,
                        repeats: int = 5, seed: int = 0) -> dict[tuple[int, int], float]:
    """T(batch, n), keyed (batch, n): seconds (fastest of `repeats`) of one exact-engine forward
    (`lab.target.exact.forward_batch`) over `batch` sequences, each with n new causal positions
    after its own cached `prefix` tokens."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    out = {}
    for b in batches:
        engines = [exact_engine(model) for _ in range(b)]
        for engine in engines:
            engine.forward(torch.randint(0, vocab, (prefix,), generator=g).tolist(), logits=False)
        for n in ns:
            requests = [Request(e, torch.randint(0, vocab, (n,), generator=g).tolist()) for e in engines]

            def step() -> None:
                forward_batch(requests)
                for engine in engines:
                    engine.crop(prefix)
            out[(b, n)] = fastest({0: step}, repeats)[0]
    return out


