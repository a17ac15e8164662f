"""A recorded cycle drawn for the inspector: the draft tree as SVG (also its static form in exported
notebooks) and the text so far as HTML coloured by each token's origin."""
from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass

from ..verify.lossless import children_of
from .cycles import ORIGIN_LABELS, CycleRecord, node_details, node_states, rule_only, rule_verdict, token_text

# (fill, stroke, text) per node kind; the generated text uses the same colours per origin
COLOURS = {"root": ("#ddf4ff", "#0969da", "#0a3069"), "accepted": ("#dafbe1", "#1a7f37", "#0f5323"),
           "rejected": ("#f6f8fa", "#afb8c1", "#6e7781"), "untried": ("#ffffff", "#d0d7de", "#8c959f"),
           "corrected": ("#fff1e5", "#bc4c00", "#762c00"), "bonus": ("#fbefff", "#8250df", "#512a97"),
           "target": ("#f6f8fa", "#57606a", "#24292f")}
ORIGIN_KIND = {"draft": "accepted", "corrected": "corrected", "bonus": "bonus", "target": "target"}
LEGEND_NOTE = ("q: the draft's confidence · path: product of q from the root · p: the target's probability · "
               "click a node for details, a +n badge to unfold")


@dataclass(frozen=True)
class Look:
    """Sizes (px) and colours of a drawing."""
    colours: dict
    box_w: int
    box_h: int
    column: int
    row: int
    legend_h: int
    label_px: int      # a node's token
    numbers_px: int    # a node's q, path and p
    legend_px: int
    text_px: int       # the generated text and the phases' tables


NOTEBOOK = Look(COLOURS, 168, 38, 204, 46, 44, 13, 10, 11, 12)
# Projector mode: every label at least 18 px, fills tinted from the Okabe-Ito palette (distinct under
# the common colour-vision deficiencies) with its strong colours as strokes, and black text, whose
# contrast with the lightest tints is above 12:1 (the bar is 4.5:1).
PROJECTOR = Look({"root": ("#d5ebf8", "#0072b2", "#000000"), "accepted": ("#c9ebe0", "#009e73", "#000000"),
                  "rejected": ("#eeeeee", "#555555", "#000000"), "untried": ("#ffffff", "#999999", "#000000"),
                  "corrected": ("#f6d9c6", "#d55e00", "#000000"), "bonus": ("#f2dde9", "#cc79a7", "#000000"),
                  "target": ("#f0e9b8", "#000000", "#000000")},
                 270, 62, 310, 74, 70, 22, 18, 18, 20)


def _p(x: float) -> str:
    """A probability in four characters at most."""
    if math.isnan(x):
        return "–"
    if x >= 0.995:
        return "1.0"
    return "<.01" if x < 0.005 else f"{x:.2f}"[1:]


def foldable(record: CycleRecord) -> set[int]:
    """Foldable nodes: those with children, off the accepted path (whose children always show)."""
    children = children_of(record.tree.parents)
    return {node for node in range(1, len(record.tree)) if children[node] and node not in record.path}


def _layout(record: CycleRecord, expanded: set[int]) -> dict[int, tuple[int, int]]:
    """(column, row) of every visible node, left to right by depth, the accepted child first in its
    parent's row: the top row reads root, accepted drafts, the target's own token (node len(tree))."""
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


def _legend(look: Look) -> str:
    items = [("accepted", "accepted"), ("rejected", "rejected"), ("untried", "not verified"),
             ("corrected", "corrected"), ("bonus", "bonus"), ("root", "root")]
    parts, x = [], 0
    for kind, label in items:
        fill, stroke, _ = look.colours[kind]
        box = look.legend_px
        parts.append(f'<rect x="{x}" y="2" width="{box}" height="{box}" rx="2" fill="{fill}" stroke="{stroke}"/>'
                     f'<text x="{x + box + 4}" y="{box}">{label}</text>')
        x += box + 12 + round(0.6 * look.legend_px * len(label))
    parts.append(f'<text x="0" y="{2 * box + 10}">{html.escape(LEGEND_NOTE)}</text>')
    return (f'<g class="legend" font-family="sans-serif" font-size="{look.legend_px}" '
            f'fill="{look.colours["target"][2]}">{"".join(parts)}</g>')


def cycle_svg(record: CycleRecord, tokenizer, expanded: set[int] | frozenset = frozenset(),
              selected: int | None = None, look: Look = NOTEBOOK) -> str:
    """One cycle as an SVG tree, branches off the accepted path folded unless their node is in `expanded`;
    every node has a tooltip (`node_details`) and a `data-node` attribute for clicks."""
    tree = record.tree
    states = node_states(record) + [ORIGIN_KIND[record.last]]
    places = _layout(record, set(expanded))
    children = children_of(tree.parents)
    openable = foldable(record)
    edges, nodes = [], []
    for node, (column, row) in places.items():
        x, y = column * look.column, look.legend_h + row * look.row
        kind = states[node]
        if node > 0:
            parent = record.path[-1] if node == len(tree) else tree.parents[node]
            px = places[parent][0] * look.column + look.box_w
            py = look.legend_h + places[parent][1] * look.row + look.box_h / 2
            on_path = node == len(tree) or kind == "accepted"
            stroke = look.colours[kind][1] if on_path else look.colours["untried"][1]
            mid = (px + x) / 2
            dash = ' stroke-dasharray="5 3"' if node == len(tree) else ""
            edges.append(f'<path class="edge{" path" if on_path else ""}" d="M{px},{py} C{mid},{py} {mid},'
                         f'{y + look.box_h / 2} {x},{y + look.box_h / 2}" fill="none" stroke="{stroke}" '
                         f'stroke-width="{3 if on_path else 1.5}"{dash}/>')
        fill, stroke, ink = look.colours[kind]
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
        ring = (f'<rect x="-4" y="-4" width="{look.box_w + 8}" height="{look.box_h + 8}" rx="8" fill="none" '
                f'stroke="#0550ae" stroke-width="2.5"/>' if node == selected else "")
        badge = ""
        if node in openable:
            folded = node not in expanded
            mark = f"+{_subtree_size(children, node) - 1}" if folded else "−"
            badge = (f'<g class="fold"><circle cx="{look.box_w}" cy="{look.box_h / 2}" r="{look.numbers_px}" '
                     f'fill="#ffffff" stroke="{stroke}"/><text x="{look.box_w}" '
                     f'y="{look.box_h / 2 + look.numbers_px / 3}" text-anchor="middle" font-size="{look.numbers_px}" '
                     f'font-family="sans-serif" fill="{ink}">{mark}</text></g>')
        fold_attribute = ' data-foldable="1"' if node in openable else ""
        nodes.append(f'<g class="node {kind}" data-node="{node}"{fold_attribute} '
                     f'transform="translate({x},{y})" style="cursor:pointer"><title>{title}</title>{ring}'
                     f'<rect width="{look.box_w}" height="{look.box_h}" rx="6" fill="{fill}" stroke="{stroke}" '
                     f'stroke-width="{2 if kind in ("accepted", "corrected", "bonus", "root") else 1}"{dash}/>'
                     f'<text x="8" y="{look.label_px + 3}" font-family="monospace" font-size="{look.label_px}" '
                     'font-weight="bold" '
                     f'fill="{ink}" xml:space="preserve">{html.escape(label)}</text>'
                     f'<text x="8" y="{look.box_h - 7}" font-family="monospace" font-size="{look.numbers_px}" '
                     f'fill="{ink}">'
                     f'{html.escape(numbers)}</text>'
                     f'{badge}</g>')
    width = (max(c for c, _ in places.values()) + 1) * look.column + 12
    height = look.legend_h + (max(r for _, r in places.values()) + 1) * look.row
    width = max(width, round(0.55 * look.legend_px * len(LEGEND_NOTE)))  # the legend's second line, whole
    return (f'<svg class="draft-tree" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="-2 -2 {width} {height}">{_legend(look)}'
            f'{"".join(edges)}{"".join(nodes)}</svg>')


def text_pieces(tokenizer, tokens: list[int]) -> list[str]:
    """Each token's share of the decoded text: a token inside a multi-byte character gets nothing, and
    one that rewrites the end of the text (a tokenizer's clean-up) what follows the part that stayed."""
    pieces, shown = [], ""
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1])
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(os.path.commonprefix([shown, text])):])
        shown = text
    return pieces


def generated_html(records: list[CycleRecord], upto: int, tokenizer, look: Look = NOTEBOOK) -> str:
    """The text of cycles 0..upto coloured by origin (cycle `upto` underlined), with running τ and speed."""
    tokens = [t for r in records[: upto + 1] for t in r.emitted]
    origins = [o for r in records[: upto + 1] for o in r.origins]
    lossy = []  # per token: how the lossy rule let it through, where only the rule did
    for r in records[: upto + 1]:
        only = rule_only(r)
        lossy += [rule_verdict(r, r.path[i + 1]) if r.path[i + 1: i + 2] and r.path[i + 1] in only else None
                  for i in range(len(r.emitted))]
    current = len(tokens) - len(records[upto].emitted)
    spans = []
    for i, (piece, origin) in enumerate(zip(text_pieces(tokenizer, tokens), origins)):
        fill, _, ink = look.colours[ORIGIN_KIND[origin]]
        style = f"background:{fill};color:{ink}" + (";text-decoration:underline" if i >= current else "")
        title = ORIGIN_LABELS[origin]
        if lossy[i]:  # a token standard verification would have rejected
            style += f";outline:2px dashed {look.colours['corrected'][1]}"
            title = f"accepted by the lossy rule only ({lossy[i]}): standard verification would reject it"
        spans.append(f'<span class="token {origin}{" lossy" if lossy[i] else ""}" style="{style}" '
                     f'title="{html.escape(title)}">{html.escape(piece)}</span>')
    seconds = records[upto].seconds
    rate = f"{len(tokens) / seconds:.1f} tokens/s" if seconds > 0 else "–"
    legend = " · ".join(f'<span style="background:{look.colours[ORIGIN_KIND[o]][0]};'
                        f'color:{look.colours[ORIGIN_KIND[o]][2]}">'
                        f"{label}</span>" for o, label in ORIGIN_LABELS.items())
    return (f'<div class="generated"><div style="font-size:{look.text_px}px;color:{look.colours["target"][2]}">'
            f"after cycle {upto + 1}: "
            f"{len(tokens)} tokens in {upto + 1} target forwards, τ = {len(tokens) / (upto + 1):.2f}, {rate} "
            f"(recording excluded) · {legend}</div>"
            f'<div style="white-space:pre-wrap;font-family:monospace;font-size:{look.text_px}px;line-height:1.5">'
            f'{"".join(spans)}</div></div>')
