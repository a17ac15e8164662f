"""Drafting cycles recorded and explained: what each cycle drafted, how the target scored every node,
and why verification accepted or rejected each. Recording goes through `decode`'s `on_cycle` hook, so
it sees exactly what verification saw; a chain is kept as a one-path tree."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..decode import Cycle
from ..sampling import Sampling, probabilities
from ..trees import DraftTree
from ..verify.lossless import children_of

ORIGIN_LABELS = {"draft": "accepted draft", "corrected": "corrected by the target", "bonus": "bonus token",
                 "target": "target's own token"}


@dataclass
class CycleRecord:
    tree: DraftTree            # what was drafted (a chain is a one-path tree); node i's target row is i
    chain: bool                # a chain, checked with u < p/q, rather than a tree of top-k drafts
    greedy: bool               # temperature 0: drafts are checked against the target's argmax
    temperature: float
    path: list[int]            # accepted nodes, root first
    final: int                 # the target's own token at the end of the path
    last: str                  # its origin: corrected | bonus | target (nothing was drafted)
    emitted: list[int]         # what the cycle added to the text (EOS or max_new_tokens may cut it)
    origins: list[str]         # per emitted token: draft | corrected | bonus | target
    target_probs: list[float]  # the target's probability of each node's token after its parent (root: 1)
    best: list[tuple[int, float]]  # the target's most likely token after each node, and its probability
    final_prob: float          # the target's probability of `final` after the last accepted node
    uniforms: list[float] | None   # verification's draw for each node (root: NaN; None when greedy)
    seconds: float             # decoding time until the end of this cycle, recording excluded
    context_len: int = 0       # tokens before the cycle: the root is the cache's row context_len - 1
    residual: list[tuple[int, float]] | None = None  # a sampled correction: the top of what it was drawn from
    expanded: DraftTree | None = None  # a dynamic tree before reranking (drafters with `expansions` kept)
    rule: str | None = None    # a lossy acceptance rule's name (judge, topkK): drafts checked by it too
    rule_scores: list[float] | None = None  # the judge's P(correct) per node (root: NaN)


class CycleRecorder:
    """Pass as `decode(..., on_cycle=recorder)`: keeps a `CycleRecord` of every cycle in `records`, with
    the probabilities verification used (at temperature 0, the softmax at temperature 1). Give it the
    lossy `rule` decoding used, if any, so that the drafts only the rule let through are named."""

    def __init__(self, sampling: Sampling, drafter: object | None = None, rule: object | None = None):
        self.sampling, self.drafter, self.rule = sampling, drafter, rule
        self.records: list[CycleRecord] = []
        self._start, self._recording = time.perf_counter(), 0.0

    def __call__(self, context: list[int], proposal: DraftTree | tuple, cycle: Cycle, emitted: list[int],
                 origins: list[str]) -> None:
        entered = time.perf_counter()
        chain = not isinstance(proposal, DraftTree)
        tree = self._chain_tree(context[-1], *proposal) if chain else self._scored_tree(proposal)
        logits = cycle.logits.float().cpu()
        p = torch.softmax(logits, -1) if self.sampling.greedy else probabilities(logits, self.sampling)
        top = p.max(-1)
        self.records.append(CycleRecord(
            tree, chain, self.sampling.greedy, self.sampling.temperature, list(cycle.rows), cycle.tokens[-1],
            cycle.last, list(emitted), list(origins),
            [1.0] + [float(p[parent, token]) for token, parent in zip(tree.tokens[1:], tree.parents[1:])],
            list(zip(top.indices.tolist(), top.values.tolist())), float(p[cycle.rows[-1], cycle.tokens[-1]]),
            self._per_node(cycle.uniforms, chain), entered - self._start - self._recording, len(context),
            self._residual(tree, cycle, p, None if not chain else proposal[1]), self._expanded(),
            getattr(self.rule, "name", None), self._rule_scores()))
        self._recording += time.perf_counter() - entered

    def _rule_scores(self) -> list[float] | None:
        """The judge's scores of this cycle's drafts, where it keeps them (`seen`, a list)."""
        kept = getattr(self.rule, "seen", None)
        return [math.nan] + kept.pop().tolist() if kept else None

    def _expanded(self) -> DraftTree | None:
        """The drafter's last tree before reranking, where it keeps them (`expansions`, a list)."""
        kept = getattr(self.drafter, "expansions", None)
        return kept.pop() if kept else None

    @staticmethod
    def _scored_tree(tree: DraftTree) -> DraftTree:
        """The tree with a confidence and path value for every node: a drafter that keeps none (Lookahead's
        n-grams) drafts deterministically, q(x) = 1."""
        if len(tree.confidences) == len(tree) and len(tree.values) == len(tree):
            return tree
        return DraftTree(tree.tokens, tree.parents, [0.0] * len(tree), [1.0] * len(tree), tree.candidates)

    def _residual(self, tree: DraftTree, cycle: Cycle, p: torch.Tensor, q: torch.Tensor | None,
                  top: int = 5) -> list[tuple[int, float]] | None:
        """After a sampled rejection, the `top` tokens of the distribution the correction was drawn from,
        with their probabilities: a chain's max(0, p - q) at the rejected position (q one-hot at the draft
        without a q), a tree's p with the rejected children's tokens removed, both renormalised."""
        if self.sampling.greedy or cycle.last != "corrected":
            return None
        row = cycle.rows[-1]
        left = p[row].clone()
        if q is not None:
            left = (left - q[row].float().cpu()).clamp(min=0)
        else:
            for child in children_of(tree.parents)[row]:
                left[tree.tokens[child]] = 0.0
        values, tokens = (left / left.sum()).topk(top)
        return [(int(t), float(v)) for t, v in zip(tokens, values) if v > 0]

    @staticmethod
    def _per_node(uniforms: torch.Tensor | None, chain: bool) -> list[float] | None:
        """A tree's verification draws one uniform per node, root included; a chain one per draft."""
        if uniforms is None:
            return None
        return ([math.nan] if chain else []) + uniforms.tolist()

    def _chain_tree(self, root: int, drafts: list[int], q: torch.Tensor | None) -> DraftTree:
        """A chain as a one-path tree, its confidences the drafter's kept ones, else q, else 1 (one-hot)
        or NaN (greedy, unknown)."""
        kept = getattr(self.drafter, "confidences", None)
        if kept is not None and len(kept) == len(drafts):
            confidences = list(kept)
        elif q is not None:
            confidences = [float(q[i, x]) for i, x in enumerate(drafts)]
        else:
            confidences = [math.nan if self.sampling.greedy else 1.0] * len(drafts)
        values = [0.0]
        for c in confidences:  # a drawn draft has q(x) > 0
            values.append(values[-1] + (math.nan if math.isnan(c) else math.log(c)))
        return DraftTree([root] + list(drafts), list(range(-1, len(drafts))), values, [1.0] + confidences)


def visible_text(text: str) -> str:
    """Whitespace made visible: ␣ for a space, ↵ for a newline, control pictures, ∅ for an empty string."""
    def show(c: str) -> str:
        if c == " ":
            return "␣"
        if c == "\n":
            return "↵"
        return chr(0x2400 + ord(c)) if ord(c) < 32 else ("␡" if c == "\x7f" else c)
    return "".join(show(c) for c in text) or "∅"


def token_text(tokenizer, token: int) -> str:
    """One token's text with its whitespace made visible (`visible_text`)."""
    return visible_text(tokenizer.decode([token]))


def rule_only(record: CycleRecord) -> set[int]:
    """The accepted nodes that only a lossy rule let through: not the target's argmax after their parent."""
    if record.rule is None:
        return set()
    return {n for n in record.path[1:] if record.tree.tokens[n] != record.best[record.tree.parents[n]][0]}


def rule_verdict(record: CycleRecord, node: int) -> str:
    """How the lossy rule let `node` through: the judge's P(correct), or the Top-K rule's name."""
    scores = record.rule_scores
    return f"P(correct) {scores[node]:.3f}" if scores else f"in the target's {record.rule.removeprefix('topk')} best"


def node_states(record: CycleRecord) -> list[str]:
    """Each node's verdict: root, accepted, rejected or untried. Greedy verification checks every child
    of an accepted node; sampled verification tries them in order and stops at the first accepted."""
    states = ["root"] + ["untried"] * (len(record.tree) - 1)
    for node in record.path[1:]:
        states[node] = "accepted"
    children = children_of(record.tree.parents)
    for node in record.path:
        for child in children[node]:
            if states[child] == "accepted":
                if not record.greedy:
                    break
            else:
                states[child] = "rejected"
    return states


def number(x: float) -> str:
    """Three decimals, or two significant digits for what would print as 0.000."""
    return f"{x:.1e}" if 0 < x < 5e-4 else f"{x:.3f}"


def quoted(tokenizer, token: int) -> str:
    return f"‹{token_text(tokenizer, token)}›"


def mass_left(record: CycleRecord, node: int) -> float:
    """Probability left when `node` is tried: 1 minus the target's p of the siblings rejected before it."""
    siblings = children_of(record.tree.parents)[record.tree.parents[node]]
    return 1.0 - sum(record.target_probs[s] for s in siblings[: siblings.index(node)])


def _verdict(record: CycleRecord, node: int, state: str, tokenizer) -> str:
    """Why verification accepted or rejected a drafted node, in one sentence."""
    parent = record.tree.parents[node]
    p = record.target_probs[node]
    if state == "untried":
        if record.tree.parents[node] in record.path:
            accepted = next(c for c in record.path if record.tree.parents[c] == parent)
            return f"not tried: the earlier sibling {quoted(tokenizer, record.tree.tokens[accepted])} was accepted"
        return "not verified: a draft above it was rejected"
    if node in rule_only(record):
        best = record.best[parent][0]
        return (f"accepted by the {record.rule} rule only (lossy, {rule_verdict(record, node)}): the target's argmax "
                f"after {quoted(tokenizer, record.tree.tokens[parent])} is {quoted(tokenizer, best)}, so standard "
                "verification would reject it")
    if record.greedy:
        best, best_p = record.best[parent]
        if state == "accepted":
            return f"accepted: it is the target's argmax after {quoted(tokenizer, record.tree.tokens[parent])}"
        return (f"rejected (greedy mismatch): after {quoted(tokenizer, record.tree.tokens[parent])} the target's "
                f"argmax is {quoted(tokenizer, best)} (p {number(best_p)}), not this token (p {number(p)})")
    u = record.uniforms[node]
    if record.chain:
        q = record.tree.confidences[node]
        ratio = p / q if q > 0 else 0.0
        sign = "<" if state == "accepted" else "≥"
        return (f"{state}: the uniform draw u = {number(u)} {sign} p/q = {number(p)}/{number(q)} = {number(ratio)} "
                "(a draft passes with probability min(1, p/q))")
    mass = mass_left(record, node)
    sign = "<" if state == "accepted" else "≥"
    left = "" if mass >= 0.9995 else f" (m = {number(mass)} is what the rejected siblings before it left)"
    return (f"{state}: the uniform draw u = {number(u)} gives u·m = {number(u * mass)} "
            f"{sign} p = {number(p)}{left}; "
            f"it passes with probability p/m = {number(min(p / mass, 1.0) if mass > 0 else 0.0)}")


def _final_reason(record: CycleRecord, tokenizer) -> str:
    after = quoted(tokenizer, record.tree.tokens[record.path[-1]])
    if record.last == "target":
        return f"the target's own token after {after}: nothing was drafted this cycle"
    if record.greedy:
        what = "corrected" if record.last == "corrected" else "bonus"
        return f"{what}: the target's argmax after {after}"
    if record.last == "bonus":
        return f"bonus: every draft on the path passed; drawn from the target's distribution after {after}"
    removed = "max(0, p − q)" if record.chain else "p with the rejected drafts' probability removed"
    return f"corrected: every draft after {after} was rejected; drawn from the residual {removed}"


def node_details(record: CycleRecord, node: int, tokenizer) -> list[str]:
    """What the inspector says about one node, line by line (the tooltip and the details panel).
    Node `len(record.tree)` is the target's own token at the end of the path."""
    tree = record.tree
    if node == len(tree):
        kind = ORIGIN_LABELS[record.last]
        return [f"{quoted(tokenizer, record.final)}: {kind}", _final_reason(record, tokenizer),
                f"target probability p = {number(record.final_prob)}"]
    best, best_p = record.best[node]
    after = f"the target's most likely next token: {quoted(tokenizer, best)} (p {number(best_p)})"
    if node == 0:
        return [f"{quoted(tokenizer, tree.tokens[0])}: root, the last token before this cycle's drafts", after]
    siblings = children_of(tree.parents)[tree.parents[node]]
    depth = tree.depths()[node]
    scale = "softmax at temperature 1" if record.greedy else f"at temperature {record.temperature:g}"
    place = (f"{quoted(tokenizer, tree.tokens[node])}: depth {depth}, rank {siblings.index(node) + 1} of "
             f"{len(siblings)} among its siblings (1 = the draft's top guess)")
    scores = (f"draft confidence q = {number(tree.confidences[node])}, "
              f"path score {number(math.exp(tree.values[node]))} "
              "(the product of q from the root)")
    return [place, scores, f"target probability p = {number(record.target_probs[node])} ({scale})",
            _verdict(record, node, node_states(record)[node], tokenizer), after]


def cycle_summary(record: CycleRecord, tokenizer) -> str:
    """One line: drafted and accepted counts, the target's token that ended the cycle, tokens added."""
    n = len(record.path) - 1
    kind = {"corrected": "corrected", "bonus": "bonus", "target": "target's own"}[record.last]
    return (f"{len(record.tree) - 1} drafted, {n} accepted, then the {kind} token "
            f"{quoted(tokenizer, record.final)}: {len(record.emitted)} new tokens")
