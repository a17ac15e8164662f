"""EAGLE-1's head: one decoder layer that drafts by autoregressing on the target's top feature f_t
(what its LM head turns into token t+1's distribution), regular enough for one layer to predict the
next. As f_{t+1} depends on the token sampled at t+1, the head reads the pair (f_t, embedding of
x_{t+1}) at position t; its predicted feature goes through the target's LM head for draft logits and
is fed back to draft deeper, until the target's true features replace the guesses after a cycle.
`variant` (notebook 04's ablation): eagle1 reads the pair, no-token f_t, token-only x_{t+1}."""
from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from ..errors import LabError
from ..steps import Steps
from ..target.engine import Request
from ..target.products import fast_linear
from ..target.load import TARGET_NAME, engine_for

VARIANTS = {"eagle1": ("feature", "token"), "no-token": ("feature",), "token-only": ("token",)}


class EagleHead(nn.Module):
    """fc (k·H -> H, with bias) and one Llama decoder layer, no final norm (it predicts the normed top
    feature); the target's embedding and LM head are shared (the same tensors) and frozen."""

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
        """Pairs [B, T] -> predicted next features [B, T, H], for training and evaluation."""
        return self.body.model(inputs_embeds=self.fuse(features, tokens), attention_mask=attention_mask,
                               position_ids=position_ids).last_hidden_state

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.body.lm_head(features)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's feature is already the head's input state (EAGLE-3 fuses three)."""
        return features

    def drafter_state(self) -> "Eagle1Cache":
        return Eagle1Cache(self)

    def metadata(self) -> dict[str, str]:
        """What a saved file of this head records, so that a load can check it (lab.drafters.heads)."""
        cfg = self.body.config
        return {"variant": self.variant, "target": TARGET_NAME, "hidden_size": str(cfg.hidden_size),
                "vocab_size": str(cfg.vocab_size)}

    def own_state(self) -> dict[str, torch.Tensor]:
        """The tensors the head owns (not the shared embedding and LM head)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith(("body.model.embed_tokens", "body.lm_head"))}


class Eagle1Cache:
    """The head's KV cache while drafting: its one-layer Llama on `engine_for`, fed fused pairs."""

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
            positions: torch.Tensor | None = None) -> Steps:
        """Pairs (state [n, H], token [n]) after the cache -> output states [n, H]; steps that hand out
        the layer's forward (lab/steps.py), so that a batch of sequences drafts in one forward."""
        embeds = self.head.fuse(states, tokens.to(self.device), self.fc)
        scored = yield Request(self.engine, None, mask=mask, positions=positions, hidden_layers=(1,), embeds=embeds,
                               logits=False)
        return scored.hidden[1]
