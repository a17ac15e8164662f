"""Looking inside drafting cycles: record what each cycle drafted, how the target scored every
node and why each one was accepted or rejected, and draw one cycle as an SVG tree (the
inspector in lab/widgets.py shows it; the drawing is also its static form for exported
notebooks).

Recording goes through `decode`'s `on_cycle` hook, so it sees exactly what verification saw:
the drafted tree or chain, the target's logits at every node and the uniform draws. A chain is
kept as a tree with a single path, so one drawing serves both.
"""
from __future__ import annotations

import html
import math
import os
import time
from dataclasses import dataclass

import torch

from .decode import Cycle
from .sampling import Sampling, probabilities
from .trees import DraftTree
from .verify import children_of

ORIGIN_LABELS = {"draft": "accepted draft", "corrected": "corrected by the target", "bonus": "bonus token",
                 "target": "target's own token"}
# (fill, stroke, text) per node kind; the generated text uses the same colours per origin
COLOURS = {"root": ("#ddf4ff", "#0969da", "#0a3069"), "accepted": ("#dafbe1", "#1a7f37", "#0f5323"),
           "rejected": ("#f6f8fa", "#afb8c1", "#6e7781"), "untried": ("#ffffff", "#d0d7de", "#8c959f"),
           "corrected": ("#fff1e5", "#bc4c00", "#762c00"), "bonus": ("#fbefff", "#8250df", "#512a97"),
           "target": ("#f6f8fa", "#57606a", "#24292f")}
ORIGIN_KIND = {"draft": "accepted", "corrected": "corrected", "bonus": "bonus", "target": "target"}
BOX_W, BOX_H, COLUMN, ROW, LEGEND_H = 168, 38, 204, 46, 44


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


class CycleRecorder:
    """Pass as `decode(..., on_cycle=recorder)`: keeps a `CycleRecord` of every cycle in `records`.
    The probabilities it shows are the ones verification used (`sampling`); at temperature 0,
    where verification only compares argmaxes, the target's softmax at temperature 1. A chain
    drafter's confidences come from its `confidences` (ModelDraft keeps them), else from q.
    The verdicts it explains are the lossless rules of lab/verify.py, not a lossy `rule`."""

    def __init__(self, sampling: Sampling, drafter: object | None = None):
        self.sampling, self.drafter = sampling, drafter
        self.records: list[CycleRecord] = []
        self._start, self._recording = time.perf_counter(), 0.0

    def __call__(self, context: list[int], proposal: DraftTree | tuple, cycle: Cycle, emitted: list[int],
                 origins: list[str]) -> None:
        entered = time.perf_counter()
        chain = not isinstance(proposal, DraftTree)
        tree = self._chain_tree(context[-1], *proposal) if chain else proposal
        logits = cycle.logits.float().cpu()
        p = torch.softmax(logits, -1) if self.sampling.greedy else probabilities(logits, self.sampling)
        top = p.max(-1)
        self.records.append(CycleRecord(
            tree, chain, self.sampling.greedy, self.sampling.temperature, list(cycle.rows), cycle.tokens[-1],
            cycle.last, list(emitted), list(origins),
            [1.0] + [float(p[parent, token]) for token, parent in zip(tree.tokens[1:], tree.parents[1:])],
            list(zip(top.indices.tolist(), top.values.tolist())), float(p[cycle.rows[-1], cycle.tokens[-1]]),
            self._per_node(cycle.uniforms, chain), entered - self._start - self._recording))
        self._recording += time.perf_counter() - entered

    @staticmethod
    def _per_node(uniforms: torch.Tensor | None, chain: bool) -> list[float] | None:
        """A tree's verification draws one uniform per node, root included; a chain one per draft."""
        if uniforms is None:
            return None
        return ([math.nan] if chain else []) + uniforms.tolist()

    def _chain_tree(self, root: int, drafts: list[int], q: torch.Tensor | None) -> DraftTree:
        """A chain as a one-path tree. Without q the drafts were one-hot (q(x) = 1); a greedy
        drafter that keeps no confidences leaves them unknown (NaN)."""
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
    """Whitespace made visible: a space is ␣, a newline ↵, other control characters their
    Unicode control pictures; an empty string is ∅."""
    def show(c: str) -> str:
        if c == " ":
            return "␣"
        if c == "\n":
            return "↵"
        return chr(0x2400 + ord(c)) if ord(c) < 32 else ("␡" if c == "\x7f" else c)
    return "".join(show(c) for c in text) or "∅"


def token_text(tokenizer, token: int) -> str:
    return visible_text(tokenizer.decode([token]))


def node_states(record: CycleRecord) -> list[str]:
    """Each node's verdict: root, accepted, rejected (checked and failed) or untried. Greedy
    verification compares every child of an accepted node with the target's argmax; sampled
    verification tries the children in order and stops at the first it accepts."""
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


def _number(x: float) -> str:
    """Three decimals, or two significant digits for what would print as 0.000."""
    return f"{x:.1e}" if 0 < x < 5e-4 else f"{x:.3f}"


def _p(x: float) -> str:
    """A probability in four characters at most."""
    if math.isnan(x):
        return "–"
    if x >= 0.995:
        return "1.0"
    return "<.01" if x < 0.005 else f"{x:.2f}"[1:]


def _quoted(tokenizer, token: int) -> str:
    return f"‹{token_text(tokenizer, token)}›"


def _mass(record: CycleRecord, node: int) -> float:
    """Probability left when `node` is tried: 1 minus the target's probability of the siblings
    rejected before it (their tokens are distinct, so each removes exactly its own p)."""
    siblings = children_of(record.tree.parents)[record.tree.parents[node]]
    return 1.0 - sum(record.target_probs[s] for s in siblings[: siblings.index(node)])


def _verdict(record: CycleRecord, node: int, state: str, tokenizer) -> str:
    """Why verification accepted or rejected a drafted node, in one sentence."""
    parent = record.tree.parents[node]
    p = record.target_probs[node]
    if state == "untried":
        if record.tree.parents[node] in record.path:
            accepted = next(c for c in record.path if record.tree.parents[c] == parent)
            return f"not tried: the earlier sibling {_quoted(tokenizer, record.tree.tokens[accepted])} was accepted"
        return "not verified: a draft above it was rejected"
    if record.greedy:
        best, best_p = record.best[parent]
        if state == "accepted":
            return f"accepted: it is the target's argmax after {_quoted(tokenizer, record.tree.tokens[parent])}"
        return (f"rejected (greedy mismatch): after {_quoted(tokenizer, record.tree.tokens[parent])} the target's "
                f"argmax is {_quoted(tokenizer, best)} (p {_number(best_p)}), not this token (p {_number(p)})")
    u = record.uniforms[node]
    if record.chain:
        q = record.tree.confidences[node]
        ratio = p / q if q > 0 else 0.0
        sign = "<" if state == "accepted" else "≥"
        return (f"{state}: the uniform draw u = {_number(u)} {sign} p/q = {_number(p)}/{_number(q)} = {_number(ratio)} "
                "(a draft passes with probability min(1, p/q))")
    mass = _mass(record, node)
    sign = "<" if state == "accepted" else "≥"
    left = "" if mass >= 0.9995 else f" (m = {_number(mass)} is what the rejected siblings before it left)"
    return (f"{state}: the uniform draw u = {_number(u)} gives u·m = {_number(u * mass)} "
            f"{sign} p = {_number(p)}{left}; "
            f"it passes with probability p/m = {_number(min(p / mass, 1.0) if mass > 0 else 0.0)}")


def _final_reason(record: CycleRecord, tokenizer) -> str:
    after = _quoted(tokenizer, record.tree.tokens[record.path[-1]])
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
        return [f"{_quoted(tokenizer, record.final)}: {kind}", _final_reason(record, tokenizer),
                f"target probability p = {_number(record.final_prob)}"]
    best, best_p = record.best[node]
    after = f"the target's most likely next token: {_quoted(tokenizer, best)} (p {_number(best_p)})"
    if node == 0:
        return [f"{_quoted(tokenizer, tree.tokens[0])}: root, the last token before this cycle's drafts", after]
    siblings = children_of(tree.parents)[tree.parents[node]]
    depth = tree.depths()[node]
    scale = "softmax at temperature 1" if record.greedy else f"at temperature {record.temperature:g}"
    place = (f"{_quoted(tokenizer, tree.tokens[node])}: depth {depth}, rank {siblings.index(node) + 1} of "
             f"{len(siblings)} among its siblings (1 = the draft's top guess)")
    scores = (f"draft confidence q = {_number(tree.confidences[node])}, "
              f"path score {_number(math.exp(tree.values[node]))} "
              "(the product of q from the root)")
    return [place, scores, f"target probability p = {_number(record.target_probs[node])} ({scale})",
            _verdict(record, node, node_states(record)[node], tokenizer), after]


def cycle_summary(record: CycleRecord, tokenizer) -> str:
    n = len(record.path) - 1
    kind = {"corrected": "corrected", "bonus": "bonus", "target": "target's own"}[record.last]
    return (f"{len(record.tree) - 1} drafted, {n} accepted, then the {kind} token "
            f"{_quoted(tokenizer, record.final)}: {len(record.emitted)} new tokens")


def foldable(record: CycleRecord) -> set[int]:
    """Nodes whose branch can be folded: those with children, off the accepted path (the
    children of accepted nodes are always shown: they are what verification tried)."""
    children = children_of(record.tree.parents)
    return {node for node in range(1, len(record.tree)) if children[node] and node not in record.path}


def _layout(record: CycleRecord, expanded: set[int]) -> dict[int, tuple[int, int]]:
    """(column, row) of every visible node, left to right by depth. A node's first child shares
    its row and the accepted child comes first, so the top row reads as the cycle's output:
    root, accepted drafts, then the target's own token (node len(tree))."""
    tree, on_path = record.tree, set(record.path)
    children = children_of(tree.parents)
    shown_final = len(record.emitted) == len(record.path)  # else EOS or the token limit cut it
    if shown_final:
        children[record.path[-1]].insert(0, len(tree))
    opened = on_path | expanded
    places: dict[int, tuple[int, int]] = {}
    last_row = 0

    def place(node: int, column: int, row: int) -> None:
        nonlocal last_row
        places[node] = (column, row)
        last_row = max(last_row, row)
        if node == len(tree) or node not in opened:
            return
        kids = sorted(children[node], key=lambda c: (c not in on_path and c != len(tree), c))
        for i, kid in enumerate(kids):
            place(kid, column + 1, row if i == 0 else last_row + 1)

    place(0, 0, 0)
    return places


def _subtree_size(children: list[list[int]], node: int) -> int:
    return 1 + sum(_subtree_size(children, c) for c in children[node])


def _legend() -> str:
    items = [("accepted", "accepted"), ("rejected", "rejected"), ("untried", "not verified"),
             ("corrected", "corrected"), ("bonus", "bonus"), ("root", "root")]
    parts, x = [], 0
    for kind, label in items:
        fill, stroke, _ = COLOURS[kind]
        parts.append(f'<rect x="{x}" y="2" width="12" height="12" rx="2" fill="{fill}" stroke="{stroke}"/>'
                     f'<text x="{x + 16}" y="12">{label}</text>')
        x += 24 + 7 * len(label)
    parts.append('<text x="0" y="32">q: the draft\'s confidence · path: product of q from the root · '
                 'p: the target\'s probability · click a node for details, a +n badge to unfold</text>')
    return f'<g class="legend" font-family="sans-serif" font-size="11" fill="#57606a">{"".join(parts)}</g>'


def cycle_svg(record: CycleRecord, tokenizer, expanded: set[int] | frozenset = frozenset(),
              selected: int | None = None) -> str:
    """One cycle as an SVG tree, left to right. Accepted nodes are green, rejected ones grey,
    untried ones dashed; the target's own token ends the path (orange: corrected, purple:
    bonus). Branches off the accepted path are folded unless their node is in `expanded`.
    Every node has a tooltip (its `node_details`) and a `data-node` attribute for clicks."""
    tree = record.tree
    states = node_states(record) + [ORIGIN_KIND[record.last]]
    places = _layout(record, set(expanded))
    children = children_of(tree.parents)
    openable = foldable(record)
    edges, nodes = [], []
    for node, (column, row) in places.items():
        x, y = column * COLUMN, LEGEND_H + row * ROW
        kind = states[node]
        if node > 0:
            parent = record.path[-1] if node == len(tree) else tree.parents[node]
            px, py = places[parent][0] * COLUMN + BOX_W, LEGEND_H + places[parent][1] * ROW + BOX_H / 2
            on_path = node == len(tree) or kind == "accepted"
            stroke = COLOURS[kind][1] if on_path else "#d0d7de"
            mid = (px + x) / 2
            dash = ' stroke-dasharray="5 3"' if node == len(tree) else ""
            edges.append(f'<path class="edge{" path" if on_path else ""}" d="M{px},{py} C{mid},{py} {mid},'
                         f'{y + BOX_H / 2} {x},{y + BOX_H / 2}" fill="none" stroke="{stroke}" '
                         f'stroke-width="{3 if on_path else 1.5}"{dash}/>')
        fill, stroke, ink = COLOURS[kind]
        token = record.final if node == len(tree) else tree.tokens[node]
        label = token_text(tokenizer, token)
        label = label if len(label) <= 16 else label[:15] + "…"
        if node == 0:
            numbers = "root"
        elif node == len(tree):
            numbers = f"{ORIGIN_LABELS[record.last].split()[0]} · p {_p(record.final_prob)}"
        else:
            numbers = (f"q {_p(tree.confidences[node])} path {_p(math.exp(tree.values[node]))} "
                       f"p {_p(record.target_probs[node])}")
        title = html.escape("\n".join(node_details(record, node, tokenizer)))
        dash = ' stroke-dasharray="4 3"' if kind == "untried" else ""
        ring = (f'<rect x="-4" y="-4" width="{BOX_W + 8}" height="{BOX_H + 8}" rx="8" fill="none" '
                f'stroke="#0550ae" stroke-width="2.5"/>' if node == selected else "")
        badge = ""
        if node in openable:
            folded = node not in expanded
            mark = f"+{_subtree_size(children, node) - 1}" if folded else "−"
            badge = (f'<g class="fold"><circle cx="{BOX_W}" cy="{BOX_H / 2}" r="10" fill="#ffffff" stroke="{stroke}"/>'
                     f'<text x="{BOX_W}" y="{BOX_H / 2 + 4}" text-anchor="middle" font-size="10" '
                     f'font-family="sans-serif" fill="{ink}">{mark}</text></g>')
        fold_attribute = ' data-foldable="1"' if node in openable else ""
        nodes.append(f'<g class="node {kind}" data-node="{node}"{fold_attribute} '
                     f'transform="translate({x},{y})" style="cursor:pointer"><title>{title}</title>{ring}'
                     f'<rect width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" stroke="{stroke}" '
                     f'stroke-width="{2 if kind in ("accepted", "corrected", "bonus", "root") else 1}"{dash}/>'
                     f'<text x="8" y="16" font-family="monospace" font-size="13" font-weight="bold" '
                     f'fill="{ink}" xml:space="preserve">{html.escape(label)}</text>'
                     f'<text x="8" y="31" font-family="monospace" font-size="10" fill="{ink}">'
                     f'{html.escape(numbers)}</text>'
                     f'{badge}</g>')
    width = (max(c for c, _ in places.values()) + 1) * COLUMN + 12
    height = LEGEND_H + (max(r for _, r in places.values()) + 1) * ROW
    return (f'<svg class="draft-tree" xmlns="http://www.w3.org/2000/svg" width="{max(width, 640)}" '
            f'height="{height}" viewBox="-2 -2 {max(width, 640)} {height}">{_legend()}'
            f'{"".join(edges)}{"".join(nodes)}</svg>')


def text_pieces(tokenizer, tokens: list[int]) -> list[str]:
    """Each token's share of the decoded text. A token that ends inside a multi-byte character
    gets nothing; the token that completes the character gets all of it. Where decoding one
    more token rewrites the end of the text (a tokenizer's clean-up), the token gets what
    follows the part that stayed, and the text shown so far follows the new decoding."""
    pieces, shown = [], ""
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1])
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(os.path.commonprefix([shown, text])):])
        shown = text
    return pieces


def generated_html(records: list[CycleRecord], upto: int, tokenizer) -> str:
    """The text generated by cycles 0..upto, each token coloured by its origin (the tokens of
    cycle `upto` underlined), with the running τ and tokens per second."""
    tokens = [t for r in records[: upto + 1] for t in r.emitted]
    origins = [o for r in records[: upto + 1] for o in r.origins]
    current = len(tokens) - len(records[upto].emitted)
    spans = []
    for i, (piece, origin) in enumerate(zip(text_pieces(tokenizer, tokens), origins)):
        fill, _, ink = COLOURS[ORIGIN_KIND[origin]]
        style = f"background:{fill};color:{ink}" + (";text-decoration:underline" if i >= current else "")
        spans.append(f'<span class="token {origin}" style="{style}" title="{ORIGIN_LABELS[origin]}">'
                     f"{html.escape(piece)}</span>")
    seconds = records[upto].seconds
    rate = f"{len(tokens) / seconds:.1f} tokens/s" if seconds > 0 else "–"
    legend = " · ".join(f'<span style="background:{COLOURS[ORIGIN_KIND[o]][0]};color:{COLOURS[ORIGIN_KIND[o]][2]}">'
                        f"{label}</span>" for o, label in ORIGIN_LABELS.items())
    return (f'<div class="generated"><div style="font-size:12px;color:#57606a">after cycle {upto + 1}: '
            f"{len(tokens)} tokens in {upto + 1} target forwards, τ = {len(tokens) / (upto + 1):.2f}, {rate} "
            f"(recording excluded) · {legend}</div>"
            f'<div style="white-space:pre-wrap;font-family:monospace;font-size:12px;line-height:1.5">'
            f'{"".join(spans)}</div></div>')
