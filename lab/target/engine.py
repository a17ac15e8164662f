"""The target forward with a KV cache: the one forward every method shares.

`Engine` wraps a transformers `LlamaForCausalLM` and a `DynamicCache`. It can score several
new positions in one call (verification), take a custom attention mask among the new
positions (tree drafts), crop or compact the cache to the accepted positions, and return the
hidden states of chosen layers (EAGLE's features). AR decoding, two-model speculative
decoding and the draft model itself all go through it, so a faster forward helps all alike.

`lab.target.load.engine_for(model)` picks the forward for a model's dtype: float32 runs here, on
transformers (the reference, and the default: the shipped heads were trained on its features);
bfloat16 runs on lab/target/exact.py's `ExactEngine`, which is batch-invariant and so exact, and faster.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, LlamaForCausalLM


@dataclass
class Scored:
    logits: torch.Tensor                                   # [n, V] for the n new positions
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [n, H]


def allowed_keys(mask: torch.Tensor | None, n: int, cached: int) -> torch.Tensor:
    """bool [n, cached + n]: which keys each of n new positions may attend to, from the `mask`
    a forward takes (None: a causal chain; [n, n] among the new positions, the cached prefix
    visible; or [n, cached + n] as is)."""
    if mask is None:
        return torch.ones(n, cached + n, dtype=torch.bool).tril(cached)
    if mask.shape == (n, n):
        return torch.cat([torch.ones(n, cached, dtype=torch.bool), mask.bool().cpu()], dim=1)
    if mask.shape == (n, cached + n):
        return mask.bool().cpu()
    raise ValueError(f"mask must be [{n}, {n}] or [{n}, {cached + n}], got {tuple(mask.shape)}")


class Engine:
    """A model plus its KV cache for one sequence (batch size 1).

    `hidden_layers` uses transformers' convention: index 0 is the embedding output, index i
    the input of decoder layer i, index N the final normed feature that feeds the LM head.
    """

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
        """Score `tokens` appended after the cached prefix (or, with tokens=None, input
        vectors `embeds` [n, H]: an EAGLE head feeds fused features, not token ids).

        mask: optional bool [n, n], True where new position i may attend to new position j
        (the cached prefix is then always visible), or [n, cached + n] to also hide cached
        positions (a draft expanding a tree it has partly fed already); positions: optional [n] absolute positions (for
        trees, prefix length + depth). Without them the new positions are a causal chain.
        last_only: compute logits for the last position only (prefill, drafting); the
        49k-way LM head over a whole prompt would otherwise cost more than the layers.
        logits=False skips the LM head altogether (logits None): a caller that applies its own
        head (an EAGLE draft over a reduced vocabulary) only needs the hidden states.
        """
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
        # the top feature is the base model's own output; asking transformers to capture every
        # layer's hidden state instead made a 4-token forward about 20 ms slower in a one-off timing
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
        """Compact the cache: keep positions [0, start) plus start + indices (an accepted
        tree path), in that order. Each layer's keys and values are index-selected, unless the
        path is a plain prefix of the new positions: then a crop does (no copy)."""
        if list(indices) == list(range(len(indices))):
            self.crop(start + len(indices))
            return
        index = torch.cat([torch.arange(start), start + torch.as_tensor(indices, dtype=torch.long)])
        index = index.to(self.model.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
        self.length = int(index.numel())
