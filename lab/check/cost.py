"""Checks for the exercises of notebooks 01 (the cost of a decoding step) and 03 (two-model
speculative decoding): KV-cache bytes per token, how far T(k) stays flat, the bound (γ+1)·T(1)/T(γ+1),
the cost ratio c predicted from parameter counts, Leviathan's α > c test and the priced prediction
at γ = 1. Each compares the student's values with a reference computed here on seeded random cases
and on the edge cases where the classic bugs live, and raises `ExerciseError` saying what went
wrong and where to look; on success it prints one line."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import ExerciseError

# SmolLM2-135M-Instruct's configuration, the fields the exercises use (written out here, not read
# from the model, so that the checks stand on their own)
SMOLLM2 = {"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}


def _number(fn: Callable, name: str, *args) -> float:
    """fn(*args) as a float; an exception or a non-number becomes an ExerciseError naming the inputs."""
    try:
        return float(fn(*args))
    except ZeroDivisionError as error:
        raise ExerciseError(f"{name}{args}: division by zero ({error}); find the case and handle it") from error
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise ExerciseError(f"{name}{args} must return one number; it raised {type(error).__name__}: {error}") \
            from error


def _random_config(rng: np.random.Generator) -> dict:
    """A Llama-like configuration: grouped-query attention in most cases, head_dim given in some."""
    heads = int(rng.choice([4, 8, 9, 12, 16, 32, 64]))
    kv = int(rng.choice([d for d in range(1, heads) if heads % d == 0] or [heads]))
    head_dim = int(rng.choice([32, 64, 80, 128, 256]))
    config = {"num_hidden_layers": int(rng.integers(1, 81)), "num_attention_heads": heads,
              "num_key_value_heads": kv, "intermediate_size": int(rng.integers(1, 64)) * 256,
              "vocab_size": int(rng.choice([32000, 49152, 128256, 151936]))}
    if rng.random() < 0.5:  # head_dim given, and not hidden_size / heads (as in some real models)
        config["head_dim"] = head_dim
        config["hidden_size"] = heads * head_dim * int(rng.choice([3, 5])) // 4  # head_dim != hidden / heads
    else:
        config["hidden_size"] = heads * head_dim
    return config


# ---- notebook 01 (a): KV-cache bytes per token ---------------------------------------------

def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _kv_reference(config: dict, element: int) -> int:
    """Per layer and per KV head, one key and one value vector of head_dim elements."""
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * _head_dim(config) * element


def _kv_diagnosis(config: dict, element: int, got: float) -> str:
    layers, heads, kv = (config[k] for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads"))
    dim = _head_dim(config)
    guesses = [
        (layers * kv * dim * element, "the factor 2 is missing: every layer caches a key AND a value vector per "
                                      "KV head"),
        (2 * layers * heads * dim * element, f"you used num_attention_heads ({heads}); only the key-value heads "
                                             f"are cached (num_key_value_heads = {kv}): with grouped-query "
                                             "attention several query heads share one cached key and value"),
        (layers * heads * dim * element, f"the factor 2 (key and value) is missing, and you used "
                                         f"num_attention_heads ({heads}) where only num_key_value_heads ({kv}) "
                                         "are cached"),
        (2 * kv * dim * element, "that is one layer's worth: every layer has its own cache"),
        (2 * layers * kv * dim, "the bytes per element are missing (4 for float32, 2 for bfloat16)"),
        (2 * layers * kv * (config["hidden_size"] // heads) * element,
         f"the config gives head_dim = {config.get('head_dim')}; use it (it need not be hidden_size / heads)"),
        (2 * layers * kv * config["hidden_size"] * element, "hidden_size is not the cached width of a KV head: use "
                                                             "the head dimension"),
    ]
    for value, why in guesses:
        if value != _kv_reference(config, element) and math.isclose(got, value, rel_tol=1e-9):
            return why
    return "compare with 2 x layers x KV heads x head dim x bytes per element"


def check_kv_bytes(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(config, bytes_per_element)` must return the bytes one token adds to the KV cache (notebook
    01): config is a dict with num_hidden_layers, num_attention_heads, num_key_value_heads,
    hidden_size and optionally head_dim (else hidden_size // num_attention_heads)."""
    rng = np.random.default_rng(seed)
    named = [(dict(SMOLLM2), 4, "SmolLM2-135M in float32"), (dict(SMOLLM2), 2, "SmolLM2-135M in bfloat16"),
             ({k: v for k, v in SMOLLM2.items() if k != "head_dim"}, 4, "SmolLM2-135M without head_dim")]
    named += [(_random_config(rng), int(rng.choice([1, 2, 4])), f"random case {i}") for i in range(cases)]
    for config, element, name in named:
        want = _kv_reference(config, element)
        got = _number(fn, "kv_bytes_per_token", dict(config), element)
        if not math.isclose(got, want, rel_tol=1e-9):
            raise ExerciseError(f"{name} ({config}, {element} bytes per element): got {got:,.0f} bytes, want "
                                f"{want:,}: {_kv_diagnosis(config, element, got)}")
    print(f"kv_bytes_per_token: right on SmolLM2-135M (46,080 bytes in float32, 23,040 in bfloat16) and "
          f"{cases} random configurations")


# ---- notebook 01 (b): how far T(k) stays flat -----------------------------------------------

def _flat_reference(times: dict, tolerance: float) -> int:
    limit = (1 + tolerance) * times[1]
    return max(k for k, t in times.items() if t <= limit)


def _flat_case(rng: np.random.Generator) -> tuple[dict, float]:
    """A T(k) table in seconds, shuffled: flat-ish, then rising, with noise (so not always monotone)."""
    ks = sorted(set(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64], size=int(rng.integers(1, 10)),
                               replace=False).tolist()) | {1})
    t1, knee = float(rng.uniform(0.005, 0.2)), float(rng.choice(ks))
    times = {k: t1 * (1 + 0.02 * k / knee + max(0.0, k - knee) / knee) * float(rng.uniform(0.9, 1.15))
             for k in ks}
    times[1] = t1
    order = rng.permutation(len(ks))
    return {ks[i]: times[ks[i]] for i in order}, float(rng.choice([0.0, 0.05, 0.1, 0.2, 0.5]))


def _flat_diagnosis(times: dict, tolerance: float, got) -> str:
    """Which classic mistake gives `got` on this table, if one does."""
    t1, limit = times[1], (1 + tolerance) * times[1]
    first = 1
    for k in sorted(times):
        if times[k] > limit:
            break
        first = k
    guesses = [
        (max(k for k, t in times.items() if k == 1 or t < limit),
         "'at most' includes equality: a T(k) of exactly (1 + tolerance)·T(1) counts"),
        (first, "the table need not be monotone: a k beyond a bump counts if its own T(k) is within the limit"),
        (max(k for k, t in times.items() if t <= t1 + tolerance),
         "the tolerance is relative, (1 + tolerance)·T(1), not T(1) + tolerance seconds"),
        (max(k for k, t in times.items() if t <= (1 + tolerance) * min(times.values())),
         "the reference is T(1), not the smallest time in the table"),
        (list(times)[-1], "the keys are not in order: look at every k, not at the last one"),
    ]
    want = _flat_reference(times, tolerance)
    return next((why for value, why in guesses if value != want and got == value),
                "the largest k with T(k) <= (1 + tolerance)·T(1)")


def check_flat_until(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(times, tolerance)` with times {k: T(k) seconds} (k = 1 included, any order) must return
    the largest k in the table with T(k) <= (1 + tolerance) * T(1) (notebook 01)."""
    edge = [({1: 0.5, 2: 0.75, 4: 0.9}, 0.5),  # T(2) is exactly the limit
            ({1: 1.0, 2: 1.5, 4: 1.05, 8: 2.0}, 0.1),  # not monotone: T(4) is within the limit, T(2) is not
            ({16: 3.0, 1: 1.0, 8: 1.1, 2: 1.05}, 0.2),  # keys out of order
            ({1: 1.0, 2: 0.8, 4: 1.15}, 0.2),  # T(2) < T(1)
            ({1: 0.02, 2: 0.03, 4: 0.05}, 0.2),  # seconds: an absolute tolerance would take every k
            ({1: 0.02}, 0.2),  # k = 1 only
            ({1: 1.0, 2: 1.0, 4: 1.0}, 0.0)]  # all equal, tolerance 0
    rng = np.random.default_rng(seed)
    edge += [_flat_case(rng) for _ in range(cases)]
    for times, tolerance in edge:
        want = _flat_reference(times, tolerance)
        try:
            got = fn(dict(times), tolerance)
        except (TypeError, ValueError, KeyError) as error:
            raise ExerciseError(f"times {times}, tolerance {tolerance}: raised {type(error).__name__}: {error}") \
                from error
        if got != want:
            table = ", ".join(f"T({k}) = {t:.4g}" for k, t in times.items())
            raise ExerciseError(f"{table}; tolerance {tolerance}: got k = {got}, want {want} "
                                f"({_flat_diagnosis(times, tolerance, got)})")
    print(f"flat_until: right on the edge cases and {cases} random T(k) tables")


# ---- notebook 01 (c): the bound (γ+1)·T(1)/T(γ+1) -------------------------------------------

def check_verify_bound(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(times, gamma)` with times {k: T(k) seconds} must return (gamma + 1) * T(1) / T(gamma + 1):
    how much cheaper one forward over a cycle's gamma + 1 positions is than gamma + 1 one-position
    forwards (notebook 01)."""
    rng = np.random.default_rng(seed)
    for case in range(cases):
        ks = range(1, 18)
        t1 = float(rng.uniform(0.005, 0.2))
        times = {k: t1 * (1 + float(rng.uniform(0.0, 0.15)) * (k - 1)) for k in ks}
        if case == 0:
            times[2] = 0.95 * t1  # T(2) below T(1) happens on real CPUs
        gamma = 1 + (case + 2) % 16  # gamma = 3 (the chapter's 4·T(1)/T(4)) first
        want = (gamma + 1) * times[1] / times[gamma + 1]
        got = _number(fn, "verify_bound", dict(times), gamma)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        guesses = [
            (gamma * times[1] / times[gamma], f"that is {gamma}·T(1)/T({gamma}): a cycle with {gamma} draft"
                                              f"{'s' if gamma > 1 else ''} scores {gamma + 1} positions (the last "
                                              "committed token, whose distribution judges the first draft, and the "
                                              "drafts, the last of which yields the bonus token)"),
            ((gamma + 1) * times[1] / times[gamma], f"the numerator counts {gamma + 1} positions but you priced "
                                                    f"T({gamma}): one forward over the cycle costs T({gamma + 1})"),
            (gamma * times[1] / times[gamma + 1], f"the forward costs T({gamma + 1}), but it stands in for "
                                                  f"{gamma + 1} one-position forwards, not {gamma}"),
            (times[gamma + 1] / ((gamma + 1) * times[1]),
             "the ratio is inverted: the bound is above 1 when one forward over gamma + 1 positions is cheaper "
             "than gamma + 1 forwards"),
            ((gamma + 1) * times[1] / times[gamma + 1] / (gamma + 1), "that is T(1)/T(gamma + 1): multiply by the "
                                                                      "gamma + 1 forwards it replaces"),
        ]
        why = next((w for v, w in guesses if math.isclose(got, v, rel_tol=1e-9)),
                   "compute (gamma + 1)·T(1)/T(gamma + 1)")
        shown = ", ".join(f"T({k}) = {times[k]:.4g}" for k in sorted({1, gamma, gamma + 1}))
        raise ExerciseError(f"gamma = {gamma}, {shown}: got {got:.4g}, want {want:.4g}; {why}")
    print(f"verify_bound: (gamma + 1)·T(1)/T(gamma + 1) on {cases} random T(k) tables, gamma = 1..16")


# ---- notebook 03 (a): c predicted from parameter counts --------------------------------------

def _product_weights(config: dict, layers: int) -> tuple[int, int]:
    """(weights of one decoder layer's products, weights of the LM head)."""
    hidden, dim = config["hidden_size"], _head_dim(config)
    attention = 2 * hidden * config["num_attention_heads"] * dim + 2 * hidden * config["num_key_value_heads"] * dim
    return attention + 3 * hidden * config["intermediate_size"], config["vocab_size"] * hidden


def _ratio(config: dict, draft_layers: int, layer: float, head: float) -> float:
    return (draft_layers * layer + head) / (config["num_hidden_layers"] * layer + head)


def check_cost_ratio(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(config, draft_layers)` must return c predicted from weights: (draft_layers x one decoder
    layer's product weights + LM head) / (num_hidden_layers x the same + LM head), norms and the
    embedding lookup left out (notebook 03). Relative tolerance 2e-3 (norms may be counted)."""
    rng = np.random.default_rng(seed)
    named = [(dict(SMOLLM2), n, f"SmolLM2-135M, {n}-layer draft") for n in (1, 2, 4)]
    for i in range(cases):
        config = _random_config(rng)
        named.append((config, int(rng.integers(1, config["num_hidden_layers"] + 1)), f"random case {i}"))
    for config, draft_layers, name in named:
        layer, head = _product_weights(config, draft_layers)
        want = _ratio(config, draft_layers, layer, head)
        got = _number(fn, "predicted_cost_ratio", dict(config), draft_layers)
        if math.isclose(got, want, rel_tol=2e-3):
            continue
        hidden, dim, kv, heads = (config["hidden_size"], _head_dim(config), config["num_key_value_heads"],
                                  config["num_attention_heads"])
        gqa_wrong = layer + 2 * hidden * (heads - kv) * dim
        guesses = [
            (draft_layers / config["num_hidden_layers"],
             "you left out the LM head: the draft multiplies by the same vocab x hidden LM head as the target, at "
             f"every step; on SmolLM2 that is {SMOLLM2['vocab_size'] * 576 / 1e6:.1f}M weights, about a fifth of the "
             "target's products"),
            (_ratio(config, draft_layers, layer, 2 * head),
             "you counted the embedding as well as the LM head: looking up one row of the embedding is a gather, "
             "not a product (and here the two are the same tensor)"),
            (_ratio(config, draft_layers, gqa_wrong, head),
             f"the key and value projections have num_key_value_heads x head_dim = {kv * dim} outputs, not "
             f"num_attention_heads x head_dim = {heads * dim}"),
            (_ratio(config, draft_layers, layer - hidden * config["intermediate_size"], head),
             "the MLP has three matrices (gate, up, down), each hidden x intermediate"),
            (_ratio(config, draft_layers, layer - 3 * hidden * config["intermediate_size"], head),
             "the MLP's three matrices (gate, up, down; hidden x intermediate each) are missing"),
        ]
        why = next((w for v, w in guesses if math.isclose(got, v, rel_tol=2e-3)),
                   "count each decoder layer's seven matrices and the LM head, on both sides of the ratio")
        raise ExerciseError(f"{name} ({config}, draft_layers = {draft_layers}): got {got:.4f}, want {want:.4f}; "
                            f"{why}")
    print("predicted_cost_ratio: right on SmolLM2-135M (1, 2, 4 layers: "
          + ", ".join(f"{_ratio(SMOLLM2, n, *_product_weights(SMOLLM2, n)):.3f}" for n in (1, 2, 4))
          + f") and {cases} random configurations")


# ---- notebook 03 (b): can speculation pay? ----------------------------------------------------

def check_speculation_pays(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(pairs)` with pairs [(alpha, c), ...] must return [bool, ...]: True where some gamma >= 1
    gives a speed-up strictly above 1 by Leviathan et al.'s formula (verification priced as one
    target step), which is exactly when alpha > c (their Corollary 3.9) (notebook 03)."""
    edge = [((0.3, 0.3), "alpha = c: gamma = 1 gives (1 + alpha)/(1 + c) = 1 exactly, no gain; longer chains "
                          "give less"),
            ((0.25, 0.0), "a free draft (c = 0) pays for any alpha > 0"),
            ((0.0, 0.0), "alpha = 0 never pays, even with a free draft"),
            ((1.0, 0.99), "alpha = 1 with c < 1 pays"),
            ((0.9, 1.0), "a draft as slow as the target (c = 1) never pays"),
            ((0.21, 0.22), "alpha slightly below c: no gamma pays"),
            ((0.23, 0.22), "alpha slightly above c: gamma = 1 pays"),
            ((0.6, 0.05), "alpha well above c pays"),
            ((0.05, 0.6), "alpha well below c does not pay (did you swap alpha and c?)")]
    rng = np.random.default_rng(seed)
    pairs = [p for p, _ in edge] + [(float(rng.uniform(0, 1)), float(rng.uniform(0, 1))) for _ in range(cases)]
    why = {p: w for p, w in edge}
    try:
        got = [bool(v) for v in fn(list(pairs))]
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise ExerciseError(f"speculation_can_pay raised {type(error).__name__}: {error}") from error
    if len(got) != len(pairs):
        raise ExerciseError(f"return one answer per pair: {len(pairs)} pairs, {len(got)} answers")
    for (alpha, c), answer in zip(pairs, got):
        want = alpha > c
        if answer != want:
            raise ExerciseError(f"alpha = {alpha:.4g}, c = {c:.4g}: got {answer}, want {want} ("
                                + why.get((alpha, c), "some gamma >= 1 beats plain decoding exactly when alpha > c")
                                + ")")
    print(f"speculation_can_pay: right on the edge cases (alpha = c among them) and {cases} random pairs")


# ---- notebook 03 (c): the priced prediction at γ = 1 ------------------------------------------

def check_priced_speedup(fn: Callable, cases: int = 300, seed: int = 0) -> None:
    """`fn(alpha, c, verify)` with verify = T(2)/T(1) must return the expected speed-up at gamma = 1:
    (1 + alpha) / (c + verify) (notebook 03)."""
    rng = np.random.default_rng(seed)
    cases_ = [(0.4, 0.2, 1.0), (0.4, 0.2, 1.6), (1.0, 0.3, 1.2), (0.0, 0.25, 1.1)]
    cases_ += [(float(rng.uniform(0, 1)), float(rng.uniform(0, 1)), float(rng.uniform(1, 2.5))) for _ in range(cases)]
    for alpha, c, verify in cases_:
        want = (1 + alpha) / (c + verify)
        got = _number(fn, "priced_speedup_gamma1", alpha, c, verify)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        guesses = [
            ((1 + alpha) / (1 + c), "you priced the verification forward as one target step: Leviathan's "
                                    "(1 + alpha)/(1 + c); the forward over 2 positions costs verify = T(2)/T(1) "
                                    "target steps"),
            ((1 + alpha) / (1 + c + verify), "the cycle costs c + verify target steps: verify = T(2)/T(1) already "
                                             "is the target's forward, there is no further 1"),
            (alpha / (c + verify), "a cycle emits 1 + alpha tokens on average: the corrected or bonus token "
                                   "always, the draft with probability alpha"),
            ((1 + alpha) / (1 + c) / verify, "the draft step is not slowed by verify: divide 1 + alpha by "
                                             "c + verify"),
            ((1 + alpha) / (c * verify + verify), "the cost is c + verify, not c·verify + verify"),
        ]
        why = next((w for v, w in guesses if math.isclose(got, v, rel_tol=1e-9)),
                   "tokens per cycle (1 + alpha) over the cycle's cost in target steps (c + T(2)/T(1))")
        raise ExerciseError(f"alpha = {alpha:.4g}, c = {c:.4g}, verify = {verify:.4g}: got {got:.4g}, want "
                            f"{want:.4g}; {why}")
    print(f"priced_speedup_gamma1: (1 + alpha)/(c + T(2)/T(1)) on the edge cases and {cases} random cases")
