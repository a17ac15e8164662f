"""EagleDraft: an EAGLE head (eagle1.py, eagle3.py) drafting EAGLE-1's static tree, EAGLE-2's dynamic
tree or a chain. Both heads look the same from here: `head.drafter_state()` is a cache whose
`project(features)` turns the target's features at a scored position into the head's input state,
and whose `run` feeds pairs (state, next token) through the head's layer, returning output states
that stand in for the next states when drafting deeper."""
from __future__ import annotations

import heapq
import math

import numpy as np
import torch

from ..data import load_regen
from ..errors import LabError
from ..sampling import RandomStream, Sampling
from ..steps import Steps, run_alone, stepped
from ..target.products import fast_linear
from ..trees import DraftTree, Expand, dynamic_tree_steps, top_children
from .model import frontier_mask


def static_shape(total_tokens: int, depth: int, rank_accuracy: list[float] | list[list[float]]
                 ) -> list[tuple[int, ...]]:
    """A fixed tree chosen offline (EAGLE-1's, and Medusa's): the `total_tokens - 1` rank paths
    (r1, ..., rd) most likely accepted if the rank-r guess at depth d is right with probability
    `rank_accuracy[r]` (one list for all depths) or `rank_accuracy[d-1][r]` (one per depth), parents
    first (by depth, then ranks). Raises LabError unless each depth's rank-0 accuracy is positive."""
    by_depth = rank_accuracy if rank_accuracy and isinstance(rank_accuracy[0], list) else [rank_accuracy] * depth
    if len(by_depth) < depth or any(not acc or acc[0] <= 0 for acc in by_depth[:depth]):
        raise LabError("static_shape needs per-rank accuracies with rank 0 > 0 at every depth (the head manifest's "
                       "rank_accuracy)")
    # tail ranks may be noisy or 0: best-first search is optimal on positive, non-increasing ones
    by_depth = [[max(a, 1e-6) for a in acc] for acc in by_depth[:depth]]
    by_depth = [[min(acc[: r + 1]) for r in range(len(acc))] for acc in by_depth]
    chosen: list[tuple[int, ...]] = []
    heap = [(-by_depth[0][0], (0,))]
    while heap and len(chosen) < total_tokens - 1:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        acc = by_depth[len(path) - 1]
        if path[-1] + 1 < len(acc):  # the next sibling
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (neg / acc[path[-1]] * acc[path[-1] + 1], sibling))
        if len(path) < depth:  # the first child
            heapq.heappush(heap, (neg * by_depth[len(path)][0], path + (0,)))
    return sorted(chosen, key=lambda p: (len(p), p))


def static_tree(root_token: int, expand: Expand, shape: list[tuple[int, ...]]) -> DraftTree:
    """Instantiate a fixed rank shape: node (r1..rd) is the r_d-th most likely child of node
    (r1..r_{d-1}). One `expand` call per depth, over the nodes that have children."""
    return run_alone(static_tree_steps(root_token, expand, shape))


def static_tree_steps(root_token: int, expand: Expand, shape: list[tuple[int, ...]]) -> Steps:
    """`static_tree` as steps (lab/steps.py), as `lab.trees.dynamic_tree_steps`."""
    tree = DraftTree([root_token], [-1], [0.0], [1.0])
    index: dict[tuple[int, ...], int] = {(): 0}
    for d in range(1, max((len(p) for p in shape), default=0) + 1):
        layer = [p for p in shape if len(p) == d]
        frontier = sorted({index[p[:-1]] for p in layer})
        values, tokens = yield from stepped(expand(tree, frontier, max(p[-1] for p in layer) + 1))
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
    """The `size` most frequent tokens of the regenerated training responses, sorted by id. Drafting
    over them cuts the draft LM head's memory-bound read per step to size/49,152; it restricts the
    proposals only, as verification still uses the target's full distribution."""
    data = load_regen()
    responses = [ids[p:] for ids, p in data.sequences("train")]
    counts = torch.bincount(torch.from_numpy(np.concatenate(responses)), minlength=size)
    return torch.sort(torch.topk(counts.float(), size).indices).values


class EagleDraft:
    """Drafts with an EAGLE head: a `static` tree of `shape` (EAGLE-1), a `dynamic` one (EAGLE-2's
    rule, also EAGLE-3's), or a `chain` of top-1 drafts up to `depth` deep (the lossy rules verify
    chains only). The head's KV cache holds committed pairs (state_t, x_{t+1}), one per scored
    position; a round's nodes are appended with an ancestor mask and cropped away after it. `vocab`
    (`draft_vocabulary`) narrows an EAGLE-1 head's drafts; an EAGLE-3 head takes none (LabError)."""
    expansions: list[DraftTree] | None = None  # a list: each dynamic tree before reranking is kept (the inspector)

    def __init__(self, head, mode: str = "dynamic", depth: int = 4, top_k: int = 4, total_tokens: int = 16,
                 shape: list[tuple[int, ...]] | None = None, vocab: torch.Tensor | None = None):
        if mode not in ("static", "dynamic", "chain") or (mode == "static") != (shape is not None):
            raise LabError("EagleDraft: mode is 'dynamic', 'chain', or 'static' with a shape (see static_shape)")
        self.head, self.mode, self.shape = head, mode, shape
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.feature_layers = head.feature_layers
        self.cache = head.drafter_state()
        own = getattr(head, "vocab", None)
        if own is not None:  # EAGLE-3: its own LM head over its own vocabulary
            if vocab is not None:
                raise LabError("an EAGLE-3 head drafts over its own vocabulary: pass no vocab")
            self.name = {"dynamic": "eagle3", "static": "eagle3-static", "chain": "eagle3-chain"}[mode]
            self.vocab, self._logits = own.cpu(), self.cache.logits
        else:
            self.name = {"dynamic": "eagle2", "static": "eagle1", "chain": "eagle1-chain"}[mode]
            weight = head.body.lm_head.weight
            self.vocab = None if vocab is None else vocab.cpu()
            self._logits = fast_linear(weight if vocab is None else weight[vocab.to(weight.device)].contiguous())

    def _logp(self, states: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities [n, V']: column i is token self.vocab[i] (i without a subset)."""
        return torch.log_softmax(self._logits(states).float(), -1).cpu()

    def begin(self, prompt: list[int]) -> None:
        self.cache.reset()
        self.root: tuple[torch.Tensor, torch.Tensor] | None = None  # (predicted state, log-probs) at the root

    def commit(self, context: list[int], features: torch.Tensor | None = None) -> None:
        run_alone(self.commit_steps(context, features))

    def propose(self, context: list[int], k: int, s: Sampling, rng: RandomStream
                ) -> DraftTree | tuple[list[int], None]:
        return run_alone(self.propose_steps(context, k, s, rng))

    @torch.inference_mode()
    def commit_steps(self, context: list[int], features: torch.Tensor | None = None) -> Steps:
        """Append the pairs of the positions the target has just scored: `features` [m, F]
        belong to context positions len(context)-1-m .. len(context)-2."""
        if features is None or len(features) == 0:
            return
        start = len(context) - 1 - len(features)
        self.cache.crop(start)  # drops the last round's tree nodes
        states = self.cache.project(features.to(self.cache.device))
        root = (yield from stepped(self.cache.run(states, torch.tensor(context[start + 1:]))))[-1]
        self.root = (root, self._logp(root[None])[0])

    @torch.inference_mode()
    def propose_steps(self, context: list[int], k: int, s: Sampling, rng: RandomStream) -> Steps:
        """The drafts (a tree, or a chain and None), the head's forwards handed out (lab/steps.py)."""
        if self.root is None or k < 1:  # nothing scored yet (a one-token prompt), or no room left
            return ([], None) if self.mode == "chain" else DraftTree([context[-1]], [-1], [0.0], [1.0])
        base = self.cache.length  # committed pairs; the root's pair is the last of them
        predicted = {0: self.root[0]}
        slot: dict[int, int] = {}

        def expand(tree: DraftTree, frontier: list[int], k: int) -> Steps:
            if frontier == [0]:
                return top_children(self.root[1][None], k, self.vocab)
            mask = frontier_mask(tree, frontier, slot, base, self.cache.length)
            depths = tree.depths()
            positions = torch.tensor([base - 1 + depths[node] for node in frontier])
            out = yield from stepped(self.cache.run(torch.stack([predicted[tree.parents[f]] for f in frontier]),
                                                    torch.tensor([tree.tokens[f] for f in frontier]), mask,
                                                    positions))
            for row, node in enumerate(frontier):
                predicted[node] = out[row]
            return top_children(self._logp(out), k, self.vocab)

        if self.mode == "static":
            tree = yield from static_tree_steps(context[-1], expand, [p for p in self.shape if len(p) <= k])
        elif self.mode == "chain":  # one child per depth: a chain, one-hot drafts (q is None)
            depth = min(self.depth, k)
            tree = yield from dynamic_tree_steps(context[-1], expand, depth, 1, depth + 1)
        else:
            tree = yield from dynamic_tree_steps(context[-1], expand, min(self.depth, k), self.top_k,
                                                 self.total_tokens, self.expansions)
        self.cache.crop(base)
        return (tree.tokens[1:], None) if self.mode == "chain" else tree
