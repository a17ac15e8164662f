"""EAGLE-1 and EAGLE-2: a one-layer head that drafts by autoregressing on the target's features.

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

import heapq
import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from .drafters import frontier_mask
from .engine import Engine
from .errors import LabError
from .models import TARGET_NAME
from .paths import DATA_DIR
from .sampling import RandomStream, Sampling
from .trees import DraftTree, Expand, dynamic_tree, top_children

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

    def fuse(self, features: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
        """Pairs (f_t, x_{t+1}) -> the decoder layer's input vectors [..., H]."""
        parts = []
        if "feature" in self.inputs:
            parts.append(features)
        if "token" in self.inputs:
            parts.append(self.body.model.embed_tokens(tokens))
        return self.fc(torch.cat(parts, -1))

    def forward(self, features: torch.Tensor | None, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Pairs [B, T] -> predicted next features [B, T, H] (training and evaluation; drafting
        goes through `EagleDraft`, which keeps a KV cache)."""
        return self.body.model(inputs_embeds=self.fuse(features, tokens), attention_mask=attention_mask,
                               position_ids=position_ids).last_hidden_state

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.body.lm_head(features)

    def own_state(self) -> dict[str, torch.Tensor]:
        """The tensors the head owns (not the shared embedding and LM head)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith(("body.model.embed_tokens", "body.lm_head"))}


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


def training_budget(manifest: dict) -> dict:
    """What a head cost in all: CPU minutes and steps summed over its warm-start chain (a head
    trained with `--init` continues another head), and the training tokens of its last stage
    (regenerated responses plus any ShareGPT replies; each stage here kept the earlier data)."""
    minutes, steps, stages, m = 0.0, 0, 0, manifest
    while m is not None:
        minutes, steps, stages = minutes + m["cpu_budget_minutes"], steps + m["steps"], stages + 1
        m = (m.get("init") or {}).get("manifest")
    data = manifest["data"]
    return {"cpu_minutes": minutes, "steps": steps, "stages": stages,
            "train_tokens": data["train_response_tokens"] + data.get("sharegpt_reply_tokens", 0)}


# ---- trees -------------------------------------------------------------------------------

def static_shape(total_tokens: int, depth: int, rank_accuracy: list[float]) -> list[tuple[int, ...]]:
    """EAGLE-1's fixed tree, chosen offline: the `total_tokens - 1` rank paths (r1, ..., rd)
    most likely to be accepted if the draft's rank-r guess is right with probability
    `rank_accuracy[r]` at every depth. Best-first search, so parents always come before
    their children; returned parents first (by depth, then ranks)."""
    if not rank_accuracy or rank_accuracy[0] <= 0:
        raise LabError("static_shape needs per-rank accuracies with rank 0 > 0 (the head manifest's rank_accuracy)")
    # measured tail ranks can be noisy or round to 0: make them positive and non-increasing,
    # which the best-first search needs to be optimal
    rank_accuracy = [max(a, 1e-6) for a in rank_accuracy]
    rank_accuracy = [min(rank_accuracy[: r + 1]) for r in range(len(rank_accuracy))]
    chosen: list[tuple[int, ...]] = []
    heap = [(-rank_accuracy[0], (0,))]
    while heap and len(chosen) < total_tokens - 1:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if path[-1] + 1 < len(rank_accuracy):  # the next sibling
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (neg / rank_accuracy[path[-1]] * rank_accuracy[path[-1] + 1], sibling))
        if len(path) < depth:  # the first child
            heapq.heappush(heap, (neg * rank_accuracy[0], path + (0,)))
    return sorted(chosen, key=lambda p: (len(p), p))


def static_tree(root_token: int, expand: Expand, shape: list[tuple[int, ...]]) -> DraftTree:
    """Instantiate a fixed rank shape: node (r1..rd) is the r_d-th most likely child of node
    (r1..r_{d-1}). One `expand` call per depth, over the nodes that have children."""
    tree = DraftTree([root_token], [-1], [0.0], [1.0])
    index: dict[tuple[int, ...], int] = {(): 0}
    for d in range(1, max((len(p) for p in shape), default=0) + 1):
        layer = [p for p in shape if len(p) == d]
        frontier = sorted({index[p[:-1]] for p in layer})
        values, tokens = expand(tree, frontier, max(p[-1] for p in layer) + 1)
        for p in layer:
            row, parent = frontier.index(index[p[:-1]]), index[p[:-1]]
            lp = float(values[row, p[-1]])
            tree.tokens.append(int(tokens[row, p[-1]]))
            tree.parents.append(parent)
            tree.values.append(tree.values[parent] + lp)
            tree.confidences.append(math.exp(lp))
            index[p] = len(tree) - 1
    return tree


def draft_vocabulary(size: int) -> torch.Tensor:
    """The `size` most frequent tokens of the regenerated training responses, sorted by id.
    Drafting over them instead of all 49,152 cuts the draft's LM head, which on a CPU is a
    memory-bound read of 113 MB per draft step, to size/49,152 of that. It is a proposal
    restriction only: verification still uses the target's full distribution, so nothing is
    lost but the (rare) drafts outside the subset."""
    from .train.regen import load_regen
    data = load_regen()
    responses = [ids[p:] for ids, p in data.sequences("train")]
    counts = torch.bincount(torch.from_numpy(np.concatenate(responses)), minlength=size)
    return torch.sort(torch.topk(counts.float(), size).indices).values


class EagleDraft:
    """Drafts a tree with an EAGLE head: `static` shape (EAGLE-1) or `dynamic` (EAGLE-2).

    The head keeps its own KV cache of committed pairs (f_t, x_{t+1}), one per scored context
    position; the drafted tree's nodes are appended with an ancestor mask and cropped away
    after the round. Drafts are deterministic top-k children, which verification handles
    losslessly at any temperature (EAGLE's tree rule). `vocab` (token ids) restricts the
    drafts to a subset of the vocabulary (see `draft_vocabulary`); None drafts over all."""

    def __init__(self, head: EagleHead, mode: str = "dynamic", depth: int = 4, top_k: int = 4, total_tokens: int = 16,
                 shape: list[tuple[int, ...]] | None = None, vocab: torch.Tensor | None = None):
        if mode not in ("static", "dynamic") or (mode == "static") != (shape is not None):
            raise LabError("EagleDraft: mode is 'dynamic', or 'static' with a shape (see static_shape)")
        self.head, self.mode, self.shape = head, mode, shape
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.name = "eagle1" if mode == "static" else "eagle2"
        self.feature_layers = head.feature_layers
        self.engine = Engine(head.body)
        weight = head.body.lm_head.weight
        self.vocab = None if vocab is None else vocab.cpu()
        self.vocab_weight = weight if vocab is None else weight[vocab.to(weight.device)].contiguous()

    def _logp(self, features: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities [n, V'] over the draft vocabulary (column i is token
        self.vocab[i], or token i without a subset)."""
        return torch.log_softmax(torch.nn.functional.linear(features, self.vocab_weight).float(), -1).cpu()

    def begin(self, prompt: list[int]) -> None:
        self.engine.reset()
        self.root: tuple[torch.Tensor, torch.Tensor] | None = None  # (predicted feature, log-probs) at the root

    @torch.inference_mode()
    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        """Append the pairs of the positions the target has just scored: `features` [m, H]
        belong to context positions len(context)-1-m .. len(context)-2."""
        if features is None or len(features) == 0:
            return
        start = len(context) - 1 - len(features)
        self.engine.crop(start)  # drops the last round's tree nodes
        tokens = torch.tensor(context[start + 1:], device=self.engine.model.device)
        out = self.engine.forward(None, embeds=self.head.fuse(features.to(self.engine.model.device), tokens),
                                  hidden_layers=(1,), logits=False)
        root = out.hidden[1][-1]
        self.root = (root, self._logp(root[None])[0])

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream) -> DraftTree:
        if self.root is None or k < 1:  # nothing scored yet (a one-token prompt), or no room left
            return DraftTree([context[-1]], [-1], [0.0], [1.0])
        base = self.engine.length  # committed pairs; the root's pair is the last of them
        predicted = {0: self.root[0]}
        slot: dict[int, int] = {}

        def expand(tree: DraftTree, frontier: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
            if frontier == [0]:
                return top_children(self.root[1][None], k, self.vocab)
            mask = frontier_mask(tree, frontier, slot, base, self.engine.length)
            depths = tree.depths()
            positions = torch.tensor([base - 1 + depths[node] for node in frontier])
            device = self.engine.model.device
            embeds = self.head.fuse(torch.stack([predicted[tree.parents[f]] for f in frontier]),
                                    torch.tensor([tree.tokens[f] for f in frontier], device=device))
            out = self.engine.forward(None, mask=mask, positions=positions, hidden_layers=(1,), embeds=embeds,
                                      logits=False)
            for row, node in enumerate(frontier):
                predicted[node] = out.hidden[1][row]
            return top_children(self._logp(out.hidden[1]), k, self.vocab)

        if self.mode == "static":
            tree = static_tree(context[-1], expand, [p for p in self.shape if len(p) <= k])
        else:
            tree = dynamic_tree(context[-1], expand, min(self.depth, k), self.top_k, self.total_tokens)
        self.engine.crop(base)
        return tree
