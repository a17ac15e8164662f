"""EAGLE-1's head: one layer that drafts by autoregressing on the target's top feature.

The target's top feature f_t (the vector its LM head turns into the distribution of token
t+1) is far more regular than the token sequence, so a single decoder layer can predict the
next feature well. The catch is that f_{t+1} depends on which token was actually sampled at
t+1; EAGLE-1 resolves that by feeding the head the pair (f_t, embedding of x_{t+1}): "the
token one step ahead". The head's output is a predicted feature; the target's own (frozen)
LM head turns it into draft logits, and the prediction is fed back to draft further.

Pair t = (f_t, x_{t+1}) sits at position t. After a cycle the target has scored the root and
the accepted nodes, so their true features replace the head's guesses before the next round.

`variant` selects what the head sees, for the ablation in notebook 04:
  eagle1     (f_t, x_{t+1})   EAGLE-1
  no-token   f_t only         the feature's uncertainty is left unresolved
  token-only x_{t+1} only     a one-layer token-level draft model, trained with CE only
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from .engine import engine_for
from .errors import LabError
from .exact import fast_linear
from .models import TARGET_NAME
from .paths import DATA_DIR

VARIANTS = {"eagle1": ("feature", "token"), "no-token": ("feature",), "token-only": ("token",)}
HEAD_DIR = DATA_DIR / "eagle"


class EagleHead(nn.Module):
    """fc (k·H -> H, with bias) and one Llama decoder layer; the target's embedding and LM head
    are shared (the same tensors) and frozen, so only fc and the layer are trained or shipped.
    The body has no final norm: it predicts the target's already-normed top feature."""

    def __init__(self, target: LlamaForCausalLM, variant: str = "eagle1"):
        super().__init__()
        if variant not in VARIANTS:
            raise LabError(f"unknown EAGLE head variant {variant!r}: choose from {', '.join(VARIANTS)}")
        self.variant = variant
        self.inputs = VARIANTS[variant]
        self.feature_layers = (target.config.num_hidden_layers,)  # transformers' index of the normed top feature
        hidden = target.config.hidden_size
        self.fc = nn.Linear(len(self.inputs) * hidden, hidden, bias=True)
        config = LlamaConfig.from_dict({**target.config.to_dict(), "num_hidden_layers": 1})
        config._attn_implementation = target.config._attn_implementation
        self.body = LlamaForCausalLM(config)
        self.body.model.embed_tokens = target.model.embed_tokens
        self.body.lm_head = target.lm_head
        self.body.model.norm = nn.Identity()
        self.to(target.dtype)

    def fuse(self, features: torch.Tensor | None, tokens: torch.Tensor, fc=None) -> torch.Tensor:
        """Pairs (f_t, x_{t+1}) -> the decoder layer's input vectors [..., H]; `fc` replaces
        self.fc (drafting passes its packed copy)."""
        parts = []
        if "feature" in self.inputs:
            parts.append(features)
        if "token" in self.inputs:
            parts.append(self.body.model.embed_tokens(tokens))
        return (fc or self.fc)(torch.cat(parts, -1))

    def forward(self, features: torch.Tensor | None, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Pairs [B, T] -> predicted next features [B, T, H] (training and evaluation; drafting
        goes through `EagleDraft`, which keeps a KV cache)."""
        return self.body.model(inputs_embeds=self.fuse(features, tokens), attention_mask=attention_mask,
                               position_ids=position_ids).last_hidden_state

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.body.lm_head(features)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's feature is already the head's input state (EAGLE-3 fuses three)."""
        return features

    def drafter_state(self) -> "Eagle1Cache":
        return Eagle1Cache(self)

    def own_state(self) -> dict[str, torch.Tensor]:
        """The tensors the head owns (not the shared embedding and LM head)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith(("body.model.embed_tokens", "body.lm_head"))}


class Eagle1Cache:
    """The head's KV cache while drafting: its one-layer Llama run through `Engine`, fed the
    fused pairs (state, next token)."""

    def __init__(self, head: EagleHead):
        self.head, self.engine = head, engine_for(head.body)
        self.device = head.body.device
        self.fc = fast_linear(head.fc.weight, head.fc.bias)  # the drafting copy of head.fuse's fc

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.project(features)

    @property
    def length(self) -> int:
        return self.engine.length

    def reset(self) -> None:
        self.engine.reset()

    def crop(self, length: int) -> None:
        self.engine.crop(length)

    def run(self, states: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None,
            positions: torch.Tensor | None = None) -> torch.Tensor:
        """Pairs (state [n, H], token [n]) after the cache -> output states [n, H]."""
        embeds = self.head.fuse(states, tokens.to(self.device), self.fc)
        return self.engine.forward(None, mask=mask, positions=positions, hidden_layers=(1,), embeds=embeds,
                                   logits=False).hidden[1]


def head_path(variant: str) -> Path:
    return HEAD_DIR / f"{variant}.safetensors"


def _metadata(head: EagleHead) -> dict[str, str]:
    cfg = head.body.config
    return {"variant": head.variant, "target": TARGET_NAME, "hidden_size": str(cfg.hidden_size),
            "vocab_size": str(cfg.vocab_size)}


def save_head(head: EagleHead, path: Path) -> None:
    """fp16 safetensors; with its variant and target recorded so a mismatch is caught on load."""
    from .artifacts import atomic_write
    state = {k: v.detach().half().contiguous() for k, v in head.own_state().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=_metadata(head)))


def load_head(target: LlamaForCausalLM, variant: str = "eagle1", path: Path | None = None) -> EagleHead:
    """A trained head (default: the shipped data/eagle/<variant>.safetensors) tied to `target`."""
    path = path or head_path(variant)
    if not path.exists():
        raise LabError(f"no EAGLE head at {path}: run `python -m lab train eagle1 --variant {variant}`")
    head = EagleHead(target, variant)
    with safe_open(str(path), "pt") as f:
        meta, state = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    expected = head.own_state()
    if meta != _metadata(head) or set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in state):
        raise LabError(f"{path} was trained for a different target or head shape ({meta or 'no metadata'}): "
                       f"retrain it with `python -m lab train eagle1 --variant {variant}`")
    head.load_state_dict({k: v.to(target.dtype) for k, v in state.items()}, strict=False)
    return head.eval()


def head_manifest(variant: str = "eagle1") -> dict:
    path = head_path(variant).with_suffix(".json")
    if not path.exists():
        raise LabError(f"no manifest at {path}: run `python -m lab train eagle1 --variant {variant}`")
    return json.loads(path.read_text())


def rank_accuracy_of(manifest: dict) -> list[float]:
    """Per-rank depth-1 accuracy from a head's manifest (EAGLE-1 or EAGLE-3), as the held-out
    evaluator (`lab.train.evaluate`) wrote it under "evaluation"."""
    figures = manifest.get("evaluation", {})
    if "rank_accuracy" not in figures or "evaluator_version" not in figures:
        raise LabError(f"{manifest['artifact']} has no held-out figures of the current evaluator: run "
                       f"`python -m lab evaluate {Path(manifest['artifact']).stem}`")
    return figures["rank_accuracy"]


def training_budget(manifest: dict) -> dict:
    """What a head cost in all: CPU (and GPU) minutes and steps summed over its warm-start chain
    (a head trained with `--init` continues another head), and the training tokens of its last
    stage (regenerated responses plus any ShareGPT replies; each stage here kept the earlier data)."""
    chain = warm_start_chain(manifest)
    data = manifest["data"]
    return {"cpu_minutes": sum(m.get("cpu_budget_minutes", 0.0) for m in chain),
            "gpu_minutes": sum(m.get("gpu_budget_minutes", 0.0) for m in chain),
            "steps": sum(m["steps"] for m in chain), "stages": len(chain),
            "train_tokens": data["train_response_tokens"] + data.get("sharegpt_reply_tokens", 0)}


def warm_start_chain(manifest: dict) -> list[dict]:
    """A head's manifest, then those of the heads it continued (`--init`), newest first."""
    chain, m = [], manifest
    while m is not None:
        chain.append(m)
        m = (m.get("init") or {}).get("manifest")
    return chain


def passes(manifest: dict) -> float:
    """How many times each training sequence was drawn, in expectation, summed over the head's
    warm-start chain: steps x sequences per batch / training sequences, per stage. Every stage
    here trained on the regenerated answers (some also on ShareGPT's replies), so this is how
    often a regenerated training prompt was seen: what memorising it scales with."""
    def batch(m: dict) -> int:  # EAGLE-3 manifests name it for the global batch of all processes
        return m["optimiser"].get("global_batch_sequences", m["optimiser"].get("batch_sequences"))
    return sum(m["steps"] * batch(m) / m["data"]["train_sequences"] for m in warm_start_chain(manifest))
