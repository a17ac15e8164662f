"""The target forward with a KV cache, shared by every method. `Engine` wraps a transformers
`LlamaForCausalLM` and `DynamicCache`: it scores several new positions in one call, optionally
masked among them (trees), crops or compacts the cache to the accepted positions and returns chosen
layers' hidden states (EAGLE's features). It is the float32 reference the shipped heads were trained
on; `lab.target.load.engine_for` runs a bfloat16 model on the CPU on exact.py's `ExactEngine`."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, LlamaForCausalLM


@dataclass
class Scored:
    logits: torch.Tensor                                   # [n, V] for the n new positions
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [n, H]


@dataclass
class Request:
    """One sequence's forward on `engine` (its model and KV cache), as `Engine.forward`'s arguments of
    the same names; a batched forward (`lab.target.exact.forward_batch`) takes one per sequence."""
    engine: "Engine"
    tokens: list[int] | torch.Tensor | None
    mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    hidden_layers: tuple[int, ...] = ()
    last_only: bool = False
    embeds: torch.Tensor | None = None
    logits: bool = True

    def run(self) -> Scored:
        """This forward on its engine alone."""
        return self.engine.forward(self.tokens, mask=self.mask, positions=self.positions,
                                   hidden_layers=self.hidden_layers, last_only=self.last_only, embeds=self.embeds,
                                   logits=self.logits)


def allowed_keys(mask: torch.Tensor | None, n: int, cached: int) -> torch.Tensor:
    """bool [n, cached + n]: the keys each new position may see, from a forward's `mask`: None (a
    causal chain), [n, n] (among the new ones, prefix visible) or [n, cached + n], else ValueError."""
    if mask is None:
        return torch.ones(n, cached + n, dtype=torch.bool).tril(cached)
    if mask.shape == (n, n):
        return torch.cat([torch.ones(n, cached, dtype=torch.bool), mask.bool().cpu()], dim=1)
    if mask.shape == (n, cached + n):
        return mask.bool().cpu()
    raise ValueError(f"mask must be [{n}, {n}] or [{n}, {cached + n}], got {tuple(mask.shape)}")


class Engine:
    """A model plus its KV cache for one sequence (batch size 1). `hidden_layers` index as in
    transformers: 0 the embedding output, i decoder layer i's input, N the final normed feature."""

    def __init__(self, model: LlamaForCausalLM):
        self.model = model
        self.forwards = 0
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, tokens: list[int] | torch.Tensor | None, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, hidden_layers: tuple[int, ...] = (),
                last_only: bool = False, embeds: torch.Tensor | None = None, logits: bool = True) -> Scored:
        """Score `tokens` after the cached prefix, or with tokens=None input vectors `embeds` [n, H]
        (an EAGLE head's fused features). `mask`: see `allowed_keys`; `positions` [n]: absolute
        positions (trees: prefix length + depth), by default a causal chain. `last_only`: the last
        position's logits only (the 49k-way LM head over a prompt costs more than the layers);
        `logits=False`: no LM head (logits None). Logits are float32, [n, V] or [1, V]."""
        device = self.model.device
        if embeds is None:
            kwargs = {"input_ids": torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1).to(device)}
        else:
            kwargs = {"inputs_embeds": embeds.reshape(1, -1, embeds.shape[-1]).to(device, self.model.dtype)}
        n = next(iter(kwargs.values())).shape[1]
        if mask is not None:
            allowed = allowed_keys(mask, n, self.length)
            float_mask = torch.zeros(allowed.shape, dtype=self.model.dtype)
            float_mask.masked_fill_(~allowed, torch.finfo(self.model.dtype).min)
            kwargs["attention_mask"] = float_mask[None, None].to(device)
        if positions is None:
            positions = torch.arange(self.length, self.length + n)
        # the top feature is the base model's own output: capturing every layer's is slower
        top_only = set(hidden_layers) <= {self.model.config.num_hidden_layers}
        out = self.model.model(cache=self.cache, use_cache=True, position_ids=positions.reshape(1, -1).to(device),
                               output_hidden_states=not top_only, **kwargs)
        self.length += n
        self.forwards += 1
        top = out.last_hidden_state
        hidden = {i: top[0] if top_only else out.hidden_states[i][0] for i in hidden_layers}
        if not logits:
            return Scored(None, hidden)
        return Scored(self.model.lm_head(top[:, -1:] if last_only else top)[0].float(), hidden)

    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions (a chain's accepted prefix)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5.24 takes minus the tokens to drop
            self.length = length

    def keep(self, start: int, indices: list[int]) -> None:
        """Keep positions [0, start) plus start + indices (an accepted tree path), in that order: a
        crop when the path is a prefix of the new positions, else an index-select per layer."""
        if list(indices) == list(range(len(indices))):
            self.crop(start + len(indices))
            return
        index = torch.cat([torch.arange(start), start + torch.as_tensor(indices, dtype=torch.long)])
        index = index.to(self.model.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
        self.length = int(index.numel())
