"""EAGLE-3: a draft head that reads the target at three depths and predicts tokens only. Where EAGLE-1
regresses the top feature, it fuses the states entering decoder layers 2, N/2 and N-3 (the top layer
is specialised for the next token, lower ones still describe the context) into one state, and its
one layer need only produce a state from which its own LM head (over a reduced vocabulary) predicts
the next token. That output stands in for the next fused state when drafting deeper, the situation
training-time test (lab/train/ttt.py) trains. `export_head` writes the layout vLLM and SGLang load."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from ..artifacts import atomic_write
from ..errors import LabError
from ..target.products import fast_linear
from ..target.load import TARGET_NAME


def feature_layers(num_layers: int) -> tuple[int, int, int]:
    """transformers' hidden_states indices of the low, middle and high taps: the inputs of decoder
    layers 2, N//2 and N-3 (SmolLM2's 30 layers: 2, 15, 27), clamped into range for tiny models."""
    return (min(2, num_layers), num_layers // 2, max(num_layers - 3, 0))


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise LabError(f"the EAGLE-3 head supports plain RoPE only, not {params['rope_type']!r}")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class Eagle3Layer(nn.Module):
    """The one decoder layer (`midlayer`): attention over [norm(embedding), norm(state)] (2H), the
    state on the residual, then a SwiGLU MLP; the caller keeps the keys and values it attends over."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
                 theta: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.hidden_norm = nn.RMSNorm(hidden, eps=eps)
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(2 * hidden, heads * head_dim, bias=False),
            "k_proj": nn.Linear(2 * hidden, kv_heads * head_dim, bias=False),
            "v_proj": nn.Linear(2 * hidden, kv_heads * head_dim, bias=False),
            "o_proj": nn.Linear(heads * head_dim, hidden, bias=False)})
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.mlp = nn.ModuleDict({
            "gate_proj": nn.Linear(hidden, intermediate, bias=False),
            "up_proj": nn.Linear(hidden, intermediate, bias=False),
            "down_proj": nn.Linear(intermediate, hidden, bias=False)})
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim),
                             persistent=False)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., heads, n, d] rotated by absolute `positions` [..., n] (the target's RoPE)."""
        angles = positions[..., None].float() * self.inv_freq
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        cos, sin = cos.unsqueeze(-3).to(x.dtype), sin.unsqueeze(-3).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def projections(self) -> dict[str, nn.Module]:
        """The seven linears by name; a drafter passes packed copies of them instead (`proj`)."""
        return {**self.self_attn, **self.mlp}

    def qkv(self, state: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, proj: dict | None = None):
        """state, embeds [..., n, H], positions [..., n] -> q [..., heads, n, d], k and v
        [..., heads, n, d] (grouped key/value heads already repeated)."""
        proj = proj or self.projections()
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(state)], -1)
        split = lambda t, h: t.unflatten(-1, (h, self.head_dim)).transpose(-2, -3)  # noqa: E731
        q = self._rope(split(proj["q_proj"](x), self.heads), positions)
        k = self._rope(split(proj["k_proj"](x), self.kv_heads), positions)
        v = split(proj["v_proj"](x), self.kv_heads)
        group = self.heads // self.kv_heads
        return q, k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)

    def finish(self, state: torch.Tensor, attended: torch.Tensor, proj: dict | None = None) -> torch.Tensor:
        """attended [..., heads, n, d] -> the layer's output state [..., n, H]."""
        proj = proj or self.projections()
        h = state + proj["o_proj"](attended.transpose(-2, -3).flatten(-2))
        x = self.post_attention_layernorm(h)
        return h + proj["down_proj"](F.silu(proj["gate_proj"](x)) * proj["up_proj"](x))


TAPS = ("fused", "fused-normed", "top")


def tap_columns(taps: str, hidden: int) -> slice:
    """The columns a head with `taps` reads from a cached feature row [low, middle, high, top] of 4 x hidden."""
    return slice(3 * hidden, 4 * hidden) if taps == "top" else slice(0, 3 * hidden)


class Eagle3Head(nn.Module):
    """fc (3H -> H, no bias), `midlayer`, a final `norm` and `lm_head` over the draft vocabulary; the
    target's token embedding is shared (the same tensor) and frozen. The buffer `vocab` holds the
    target id of each draft-vocabulary column (sorted and distinct, LabError otherwise). taps="top"
    reads the top feature only (fc H -> H): notebook 06's ablation of training-time test; taps="fused-normed"
    RMS-normalises each tap (a learned scale per tap) before fc, so no tap's scale dominates the fused state."""
    variant = "eagle3"

    def __init__(self, target, vocab: torch.Tensor, taps: str = "fused"):
        super().__init__()
        if taps not in TAPS:
            raise LabError(f"unknown EAGLE-3 taps {taps!r}: choose one of {', '.join(TAPS)}")
        cfg = target.config
        hidden = cfg.hidden_size
        head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
        self.config, self.taps = cfg, taps
        self.feature_layers = feature_layers(cfg.num_hidden_layers) if taps != "top" else (cfg.num_hidden_layers,)
        self.tap_norms = nn.ModuleList(nn.RMSNorm(hidden, eps=cfg.rms_norm_eps) for _ in self.feature_layers) \
            if taps == "fused-normed" else None
        self.embed_tokens = target.model.embed_tokens
        self.fc = nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(hidden, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim,
                                    cfg.intermediate_size, cfg.rms_norm_eps, rope_theta(cfg))
        self.norm = nn.RMSNorm(hidden, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, len(vocab), bias=False)
        vocab = torch.as_tensor(vocab, dtype=torch.long)
        if len(vocab) == 0 or bool((vocab[1:] <= vocab[:-1]).any()) or int(vocab.max()) >= cfg.vocab_size:
            raise LabError("an EAGLE-3 draft vocabulary must be sorted, distinct target token ids")
        self.register_buffer("vocab", vocab)
        self.to(target.dtype)

    def normed_taps(self, features: torch.Tensor) -> torch.Tensor:
        """The concatenated taps, each RMS-normalised for a "fused-normed" head (unchanged otherwise)."""
        if self.tap_norms is None:
            return features
        return torch.cat([norm(tap) for norm, tap in zip(self.tap_norms, features.chunk(len(self.tap_norms), -1))], -1)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated taps [..., 3H] -> the layer's input state g [..., H]."""
        return self.fc(self.normed_taps(features))

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Output states [..., H] -> logits over the draft vocabulary [..., V']."""
        return self.lm_head(self.norm(states))

    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, pad: torch.Tensor, steps: int,
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Training-time test, all steps in one pass. features [B, T, taps x H] at positions 0..T-1;
        tokens [B, T] with tokens[:, t] = x_{t+1}; pad [B, T] True on real positions.

        Index t of step s is the s-th draft of a chain rooted at the true pair (g_t, x_{t+1}): its
        state is step s-1's output at t (step 0: the fused true features), its token the true
        x_{t+1+s}, its position t+s; it attends to the true pairs 0..t and to its own chain's steps
        1..s (the diagonal). Returns each step's output states, step s's predicting x_{t+2+s}. `rows`
        [B, W] names the chains to run (index t, or -1 for none; every true pair is still a key),
        outputs then [B, W, H] in that order; by default every index, [B, T, H]."""
        b, t = tokens.shape
        index = torch.arange(t, device=features.device)
        at = index.expand(b, t) if rows is None else rows.clamp(min=0)           # [B, W]
        true_state = self.project(features)
        q, k0, v0 = self.midlayer.qkv(true_state, self.embed_tokens(tokens), index.expand(b, t))
        q = q.gather(-2, at[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1]))
        state = true_state.gather(1, at[..., None].expand(-1, -1, true_state.shape[-1]))
        causal = (at[:, None, :, None] >= index) & pad[:, None, None, :].bool()   # [B, 1, W, T]
        ahead = torch.cat([tokens, tokens.new_zeros(b, steps)], 1)                # x_{t+1+s}, 0 past the end
        scale = 1.0 / math.sqrt(q.shape[-1])
        outs, diag_k, diag_v = [], [], []
        for s in range(steps):
            if s:
                q, k, v = self.midlayer.qkv(state, self.embed_tokens(ahead.gather(1, at + s)), at + s)
                diag_k.append(k)
                diag_v.append(v)
            scores = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, h, W, T]
            diag = [((q * dk).sum(-1) * scale)[..., None] for dk in diag_k]                    # [B, h, W, 1] each
            weights = torch.softmax(torch.cat([scores, *diag], -1).float(), -1).to(q.dtype)
            attended = weights[..., :t] @ v0
            for r, dv in enumerate(diag_v):
                attended = attended + weights[..., t + r, None] * dv
            state = self.midlayer.finish(state, attended)
            outs.append(state)
        return outs

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, pad: torch.Tensor, steps: int,
                rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        return self.unrolled(features, tokens, pad, steps, rows)  # what DistributedDataParallel calls

    def metadata(self) -> dict[str, str]:
        """What a saved file of this head records, so that a load can check it (lab.drafters.heads)."""
        return {"variant": "eagle3", "taps": self.taps, "target": TARGET_NAME,
                "hidden_size": str(self.config.hidden_size), "vocab_size": str(self.config.vocab_size),
                "draft_vocab_size": str(len(self.vocab))}

    def own_state(self) -> dict[str, torch.Tensor]:
        """The tensors the head owns (not the shared embedding)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens")}

    def drafter_state(self) -> "Eagle3Cache":
        return Eagle3Cache(self)


class Eagle3Cache:
    """The head's keys and values for one sequence while drafting: committed true pairs, then the
    current round's tree nodes (cropped away after it). It computes with `fast_linear` copies of the
    head's linears, taken once per head when its first drafter is built and kept on the head, so a
    bfloat16 head must not be trained after drafting with it (the packed copies would go stale)."""

    def __init__(self, head: Eagle3Head):
        self.head = head
        self.device = head.fc.weight.device
        linears = getattr(head, "_lab_drafting_linears", None)
        if linears is None:  # the tuner builds dozens of drafters over one head: pack once
            modules = {"fc": head.fc, "lm_head": head.lm_head, **head.midlayer.projections()}
            linears = {name: fast_linear(module.weight) for name, module in modules.items()}
            head._lab_drafting_linears = linears
        self.proj = linears
        self.reset()

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj["fc"](self.head.normed_taps(features))

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.proj["lm_head"](self.head.norm(states))

    def reset(self) -> None:
        self.keys = self.values = None
        self.length = 0

    def crop(self, length: int) -> None:
        if length < self.length:
            self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]
            self.length = length

    @torch.inference_mode()
    def run(self, states: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None,
            positions: torch.Tensor | None = None) -> torch.Tensor:
        """Pairs (state [n, H], token [n]) after the cache -> output states [n, H]. mask: bool
        [n, length + n], True = may attend (default causal); positions [n] (default length..)."""
        n = len(tokens)
        positions = torch.arange(self.length, self.length + n) if positions is None else positions
        q, k, v = self.head.midlayer.qkv(states, self.head.embed_tokens(tokens.to(self.device)),
                                         positions.to(self.device), self.proj)
        self.keys = k if self.keys is None else torch.cat([self.keys, k], -2)
        self.values = v if self.values is None else torch.cat([self.values, v], -2)
        if mask is None:
            mask = torch.ones(n, self.length + n, dtype=torch.bool).tril(self.length)
        self.length += n
        attended = F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=mask.to(self.device))
        return self.head.midlayer.finish(states, attended, self.proj)


# ---- the serving engines' layout (the lab's own files: lab/drafters/heads.py) ----------------------------

CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "rms_norm_eps", "vocab_size", "max_position_embeddings", "hidden_act", "bos_token_id",
                 "eos_token_id", "tie_word_embeddings", "rope_parameters")


def export_head(head: Eagle3Head, out: Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write the head as an EAGLE-3 Llama draft checkpoint as vLLM and SGLang load it: config.json
    (`LlamaForCausalLMEagle3`, one layer, `draft_vocab_size`, the target's Llama fields) and
    model.safetensors with the layer under `midlayer.`, `d2t` (draft id i -> target id i + d2t[i]) and
    `t2d` (a boolean mask over the target vocabulary). Raises LabError for a taps="top" head."""
    if head.taps != "fused":
        raise LabError("only a head over the fused three-layer features has a serving layout (fc is 3H -> H)")
    cfg = head.config
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
              "draft_vocab_size": len(head.vocab), "target_hidden_size": cfg.hidden_size,
              "torch_dtype": str(dtype).removeprefix("torch."),
              **{k: getattr(cfg, k) for k in CONFIG_FIELDS if getattr(cfg, k, None) is not None}}
    vocab = head.vocab.cpu()
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.own_state().items() if k != "vocab"}
    tensors["d2t"] = vocab - torch.arange(len(vocab))
    tensors["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, vocab, True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "model.safetensors", lambda tmp: save_file(tensors, str(tmp)))
    atomic_write(out / "config.json", lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n"))
    return out
