"""Medusa (Cai et al., 2024): extra heads on the target's own last state, drafting a static tree. Head
k (1-based) reads the target's final normed hidden state h_t and guesses token t+k+1 with a
residual block h + SiLU(W_k h + b_k), started at zero so that every head begins as the target's
next-token guess, read out through the target's LM head restricted to the draft vocabulary (the
paper gives each head its own projection). All heads read the same h_t, so their guesses do not
depend on earlier drafts: the tree is a fixed set of rank paths, node (r_1..r_d) carrying head d's
rank-r_d token (`static_shape`, from per-(head, rank) accuracies), drafted once per cycle."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import LabError
from ..sampling import RandomStream, Sampling
from ..target.products import fast_linear
from ..target.load import TARGET_NAME
from ..trees import DraftTree, top_children
from .eagle_draft import static_tree


class MedusaHeads(nn.Module):
    """`heads` Medusa heads over `vocab` (token ids, the draft vocabulary) for `target`."""
    variant = "medusa"

    def __init__(self, target, vocab: torch.Tensor, heads: int = 4):
        super().__init__()
        hidden = target.config.hidden_size
        self.feature_layers = (target.config.num_hidden_layers,)  # transformers' index of the normed top feature
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(heads))
        for block in self.blocks:  # h + SiLU(0) = h: every head starts as the target's next-token guess
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.register_buffer("vocab", vocab.long())
        self._readout = [target.lm_head]  # shared and frozen: in a list, so it is no submodule of the heads

    def readout_weight(self) -> torch.Tensor:
        """The target's LM-head rows of the draft vocabulary [V', H]."""
        weight = self._readout[0].weight
        return weight[self.vocab.to(weight.device)]

    def states(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] -> each head's state [..., K, H]: h + SiLU(W_k h + b_k)."""
        return h.unsqueeze(-2) + F.silu(torch.stack([block(h) for block in self.blocks], -2))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Each head's logits over the draft vocabulary, [..., K, V']."""
        return self.states(h) @ self.readout_weight().T

    def metadata(self) -> dict[str, str]:
        return {"variant": self.variant, "target": TARGET_NAME, "hidden_size": str(self.blocks[0].in_features),
                "heads": str(len(self.blocks)), "draft_vocab": str(len(self.vocab))}

    def own_state(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())


class MedusaDraft:
    """Drafts Medusa's static tree: `shape` is a list of rank paths (r_1, ..., r_d), parents
    first, d at most the number of heads (see `static_shape`, given per-head accuracies)."""
    name = "medusa"

    def __init__(self, heads: MedusaHeads, shape: list[tuple[int, ...]]):
        if not shape or max(len(p) for p in shape) > len(heads.blocks):
            raise LabError(f"a Medusa tree needs rank paths at most {len(heads.blocks)} deep (one per head)")
        self.heads, self.shape = heads, shape
        self.feature_layers = heads.feature_layers
        self.vocab = heads.vocab.cpu()
        self._logits = fast_linear(heads.readout_weight().contiguous())

    def begin(self, prompt: list[int]) -> None:
        self.logp: torch.Tensor | None = None  # [K, V'] each head's log-probabilities at the last position

    @torch.inference_mode()
    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        """Run the heads on the last scored position's state (the one whose next token ends `context`)."""
        if features is None or len(features) == 0:
            return
        h = features[-1].to(self.heads.blocks[0].weight.dtype)
        self.logp = torch.log_softmax(self._logits(self.heads.states(h)).float(), -1).cpu()

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream) -> DraftTree:
        if self.logp is None or k < 1:
            return DraftTree([context[-1]], [-1], [0.0], [1.0])
        logp = self.logp

        def expand(tree: DraftTree, frontier: list[int], top: int) -> tuple[torch.Tensor, torch.Tensor]:
            depth = tree.depths()[frontier[0]]  # static_tree expands one depth at a time: head depth + 1
            return top_children(logp[depth][None].expand(len(frontier), -1), top, self.vocab)

        return static_tree(context[-1], expand, [p for p in self.shape if len(p) <= k])
