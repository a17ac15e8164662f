"""Draft trees: the data structure, EAGLE-2's dynamic construction, masks and positions. Node 0 is
the root, the last committed token, whose target distribution checks the first layer of drafts.
Nodes are stored parents first (a node's index exceeds its parent's), so that a tree can be fed to
the target in one forward with an ancestor mask."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .steps import Steps, run_alone, stepped


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    values: list[float] = field(default_factory=list)   # path value: summed draft log-probabilities
    confidences: list[float] = field(default_factory=list)  # the draft's probability of each node
    # nodes [0, candidates) may be accepted, the rest are only scored (Lookahead's window); None: all
    candidates: int | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        out = []
        for parent in self.parents:
            out.append(0 if parent < 0 else out[parent] + 1)
        return out

    def ancestor_mask(self) -> torch.Tensor:
        """bool [N, N]: node i may attend to node j iff j is i or one of its ancestors."""
        # Python lists made a tensor once: a tensor operation per node costs more than the whole mask
        rows: list[list[bool]] = []
        for i, parent in enumerate(self.parents):
            row = list(rows[parent]) if parent >= 0 else [False] * len(self)
            row[i] = True
            rows.append(row)
        return torch.tensor(rows, dtype=torch.bool)

    def positions(self, root_position: int) -> torch.Tensor:
        """Absolute positions: the root's, plus each node's depth."""
        return root_position + torch.tensor(self.depths())

    def follow(self, tokens: list[int]) -> list[int]:
        """The root and the nodes reached walking down along `tokens`, stopping at the first miss."""
        path = [0]
        for token in tokens:
            child = next((i for i, p in enumerate(self.parents) if p == path[-1] and self.tokens[i] == token), None)
            if child is None:
                break
            path.append(child)
        return path

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


# (tree, frontier nodes, k) -> (log-probs, token ids), both [F, k]: each frontier node's k most likely
# children, best first (ids, not columns, so that a drafter may score a reduced vocabulary); or steps
# (lab/steps.py) that hand out the drafter's forward and return them
Expand = Callable[[DraftTree, list[int], int], "tuple[torch.Tensor, torch.Tensor] | Steps"]


def top_children(logp: torch.Tensor, k: int, ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best columns of each row of `logp` [F, V] as (log-probs, token ids); `ids` [V] names
    the columns' tokens when they are a subset of the vocabulary."""
    top = torch.topk(logp, k, dim=-1)
    return top.values, (top.indices if ids is None else ids[top.indices])


def dynamic_tree(root_token: int, expand: Expand, depth: int, top_k: int, total_tokens: int,
                 expansions: list[DraftTree] | None = None) -> DraftTree:
    """EAGLE-2's dynamic draft tree: at each of `depth` depths the `top_k` newest nodes of highest
    path value (summed draft log-probabilities; a product of probabilities underflows) each get their
    `top_k` most likely children; then `rerank` keeps at most `total_tokens` nodes, which form a
    connected tree because a child's value never exceeds its parent's. With `expansions` (a list: the
    inspector's), the tree before reranking is appended to it."""
    return run_alone(dynamic_tree_steps(root_token, expand, depth, top_k, total_tokens, expansions))


def dynamic_tree_steps(root_token: int, expand: Expand, depth: int, top_k: int, total_tokens: int,
                       expansions: list[DraftTree] | None = None) -> Steps:
    """`dynamic_tree` as steps (lab/steps.py) that hand out the forwards of an `expand` written as steps."""
    tree = DraftTree([root_token], [-1], [0.0], [1.0])
    frontier = [0]
    for _ in range(depth):
        values, tokens = yield from stepped(expand(tree, frontier, top_k))
        layer = []
        for row, node in enumerate(frontier):
            for lp, token in zip(values[row].tolist(), tokens[row].tolist()):
                tree.tokens.append(token)
                tree.parents.append(node)
                tree.values.append(tree.values[node] + lp)
                tree.confidences.append(math.exp(lp))
                layer.append(len(tree.tokens) - 1)
        frontier = sorted(layer, key=lambda i: (-tree.values[i], i))[:top_k]
    if expansions is not None:
        expansions.append(tree)
    return rerank(tree, total_tokens)


def reranked(tree: DraftTree, total_tokens: int) -> list[int]:
    """The nodes `rerank` keeps: the root and the best `total_tokens - 1` by value (ties: the earlier)."""
    return [0] + sorted(sorted(range(1, len(tree)), key=lambda i: (-tree.values[i], i))[: max(total_tokens - 1, 0)])


def rerank(tree: DraftTree, total_tokens: int) -> DraftTree:
    """The tree of the nodes `reranked` keeps, parents first."""
    keep = reranked(tree, total_tokens)
    new_index = {old: new for new, old in enumerate(keep)}
    if any(tree.parents[i] not in new_index for i in keep[1:]):
        raise AssertionError("reranking broke the tree: a kept node's parent was dropped")
    return DraftTree([tree.tokens[i] for i in keep], [-1] + [new_index[tree.parents[i]] for i in keep[1:]],
                     [tree.values[i] for i in keep], [tree.confidences[i] for i in keep])
