"""Token-level drafters: none at all (AR) and a small language model, as a chain or a tree."""
from __future__ import annotations

import torch

from ..sampling import RandomStream, Sampling, probabilities
from ..steps import Steps, run_alone
from ..target.engine import Request
from ..target.load import engine_for
from ..trees import DraftTree, dynamic_tree_steps, top_children
from ..verify.lossless import race


class NoDraft:
    """Autoregressive decoding: no drafts, the target's token is the 'bonus' every cycle."""
    name = "ar"

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        return [], None

    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        pass


class ModelDraft:
    """Two-model speculative decoding: a small LM drafts k tokens autoregressively, its own KV cache
    cropped to the prefix it shares with the accepted context at the next proposal."""
    name = "sd"

    def __init__(self, model):
        self.engine = engine_for(model)
        self.cached: list[int] = []
        self._proposal: tuple[list[torch.Tensor], list[int], bool] = ([], [], True)  # rows, drafts, greedy

    def begin(self, prompt: list[int]) -> None:
        self.engine.reset()
        self.cached = []

    def _feed(self, context: list[int]) -> Steps:
        """Bring the cache up to `context` (reusing the common prefix); logits for the next token."""
        common = 0
        limit = min(len(self.cached), len(context) - 1)  # always feed at least one token
        while common < limit and self.cached[common] == context[common]:
            common += 1
        self.engine.crop(common)
        scored = yield Request(self.engine, context[common:], last_only=True)
        self.cached = list(context)
        return scored.logits[-1].cpu()

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream):
        return run_alone(self.propose_steps(context, k, s, rng))

    def propose_steps(self, context: list[int], k: int, s: Sampling, rng: RandomStream) -> Steps:
        """k drafts and their q (None when greedy), the draft model's forwards handed out (lab/steps.py)."""
        drafts, qs, rows, seq = [], [], [], list(context)
        for _ in range(k):
            logits = yield from self._feed(seq)
            if s.greedy:  # one-hot drafts: the argmax is all verification needs
                x = int(logits.argmax())
                rows.append(logits)
            else:
                q = probabilities(logits, s)
                x = race(q, rng.exponential(q.shape[-1]))
                qs.append(q)
                rows.append(q)
            drafts.append(x)
            seq.append(x)
        self._proposal = (rows, drafts, s.greedy)
        return drafts, (torch.stack(qs) if qs else None)

    @property
    def confidences(self) -> list[float]:
        """The draft's probability of each token of the last proposal: q(x) when sampling, its softmax
        at temperature 1 when greedy (q is one-hot then); computed when asked, not while decoding."""
        rows, drafts, greedy = self._proposal
        return [float((torch.softmax(row.float(), -1) if greedy else row)[x]) for row, x in zip(rows, drafts)]

    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        pass  # the next propose() crops the cache to the common prefix with the new context


def frontier_mask(tree: DraftTree, frontier: list[int], slot: dict[int, int], base: int, cached: int) -> torch.Tensor:
    """Mask [F, cached + F] feeding a tree's frontier to a draft whose cache holds `base` committed
    positions (the root's included), then earlier-fed nodes: each frontier node sees the committed
    prefix, its fed ancestors and itself. Records in `slot` where each frontier node lands."""
    n = len(frontier)
    mask = torch.zeros(n, cached + n, dtype=torch.bool)
    mask[:, :base] = True
    for row, node in enumerate(frontier):
        for ancestor in tree.path_to(node)[1:-1]:
            mask[row, slot[ancestor]] = True
        mask[row, cached + row] = True
        slot[node] = cached + row
    return mask


class TreeModelDraft(ModelDraft):
    """Two-model speculative decoding with an EAGLE-2 dynamic tree (`dynamic_tree`): one draft forward
    per depth feeds the frontier with an ancestor mask."""
    name = "sd-tree"
    expansions: list[DraftTree] | None = None  # a list: each tree before reranking is kept (the inspector)

    def __init__(self, model, depth: int = 4, top_k: int = 4, total_tokens: int = 16):
        super().__init__(model)
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens

    def propose_steps(self, context: list[int], k: int, s: Sampling, rng: RandomStream) -> Steps:
        """The dynamic tree, the draft model's forwards handed out (lab/steps.py)."""
        root_logp = torch.log_softmax((yield from self._feed(context)), -1)
        base = len(context)  # cache: the context (root included), then fed tree nodes
        slot: dict[int, int] = {}

        def expand(tree: DraftTree, frontier: list[int], k: int) -> Steps:
            if frontier == [0]:
                return top_children(root_logp[None], k)
            mask = frontier_mask(tree, frontier, slot, base, self.engine.length)
            depths = tree.depths()
            positions = torch.tensor([base - 1 + depths[node] for node in frontier])
            scored = yield Request(self.engine, [tree.tokens[f] for f in frontier], mask=mask, positions=positions)
            return top_children(torch.log_softmax(scored.logits.cpu(), -1), k)

        # the tree must leave room for its bonus token within max_new_tokens
        depth = max(0, min(self.depth, k))
        tree = yield from dynamic_tree_steps(context[-1], expand, depth, self.top_k, self.total_tokens,
                                             self.expansions)
        self.engine.crop(base)
        self.cached = list(context)
        return tree
