"""One recorded cycle in the four phases the course teaches, each drawn as HTML for the inspector:
drafting (the tree level by level, nodes in the order the drafter made them), the tree attention mask
the target received, verification (the nodes in the order the rule examines them, with their numbers
and verdicts, and after a sampled rejection the residual the correction was drawn from) and the commit
(the cache rows kept and the token the target adds)."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

from ..trees import reranked
from ..verify.lossless import children_of
from .cycles import ORIGIN_LABELS, CycleRecord, mass_left, node_states, number, quoted, rule_only, rule_verdict
from .drawing import NOTEBOOK, Look

PHASES = ("drafting", "mask", "verify", "commit")


@dataclass
class Check:
    """One node as verification examined it."""
    node: int
    verdict: str         # accepted | rejected
    p: float             # the target's probability of the node's token after its parent
    q: float             # the draft's confidence in it
    u: float | None      # the uniform draw (None when greedy)
    mass: float          # probability left when it was tried (`mass_left`)


def checks(record: CycleRecord) -> list[Check]:
    """The nodes verification examined, in its order: the children of each accepted node in the drafter's
    order (greedy compares all of them with the target's argmax; sampled tries them until one passes)."""
    states, kids = node_states(record), children_of(record.tree.parents)
    return [Check(child, states[child], record.target_probs[child], record.tree.confidences[child],
                  None if record.uniforms is None else record.uniforms[child], mass_left(record, child))
            for node in record.path for child in kids[node] if states[child] in ("accepted", "rejected")]


def drafted_depth(record: CycleRecord) -> int:
    """How deep the drafter went: the tree before reranking where it was kept (reranking may cut the
    deepest level)."""
    return max((record.expanded or record.tree).depths())


def kept_rows(record: CycleRecord) -> list[int]:
    """The cache rows the target keeps after the cycle: the root's and the accepted drafts'."""
    return [record.context_len - 1 + node for node in record.path]


def _number(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else number(x)


def _quoted(tokenizer, token: int) -> str:
    return html.escape(quoted(tokenizer, token))


def _table(look: Look, head: list[str], rows: list[str], css: str) -> str:
    cells = "".join(f"<th>{h}</th>" for h in head)
    return (f"<style>.{css} td, .{css} th {{padding: 2px 8px; text-align: left}}</style>"
            f'<table class="{css}" style="border-collapse:collapse;font-family:monospace;'
            f'font-size:{look.text_px}px"><tr>{cells}</tr>{"".join(rows)}</table>')


def drafting_html(record: CycleRecord, tokenizer, level: int, look: Look = NOTEBOOK) -> str:
    """The tree as drafted up to depth `level`, one column per depth, each node with its token and q; for
    a dynamic tree every candidate the expansion made, those that reranking cut dashed and struck out."""
    tree = record.expanded or record.tree
    kept = set(reranked(tree, len(record.tree))) if record.expanded else set(range(len(tree)))
    depths, columns = tree.depths(), []
    for depth in range(level + 1):
        cells = []
        for n in (n for n in range(len(tree)) if depths[n] == depth):
            cut = n not in kept
            border = f"2px {'dashed' if cut else 'solid'} {look.colours['untried' if cut else 'root'][1]}"
            parent = "" if n == 0 else (f' <span style="font-size:{look.numbers_px}px">q {_number(tree.confidences[n])}'
                                        f" ← {_quoted(tokenizer, tree.tokens[tree.parents[n]])}</span>")
            cells.append(f'<div class="node{" cut" if cut else ""}" style="border:{border};border-radius:6px;'
                         f'padding:4px 8px;margin:4px 0;font-size:{look.label_px}px'
                         f'{";text-decoration:line-through" if cut else ""}">'
                         f"{_quoted(tokenizer, tree.tokens[n])}{parent}</div>")
        columns.append(f'<div style="margin-right:16px"><div style="font-size:{look.numbers_px}px">'
                       f'{"root" if depth == 0 else f"depth {depth}"}</div>{"".join(cells)}</div>')
    shown = [n for n in range(1, len(tree)) if depths[n] <= level]
    note = f"drafted up to depth {level} of {max(depths)}: {len(shown)} candidates"
    if record.expanded:
        note += (f"; reranking keeps the {len(kept) - 1} of all {len(tree) - 1} with the highest path value "
                 f"({sum(n not in kept for n in shown)} of those shown are cut)")
    return (f'<div class="lab-phase drafting"><div style="font-size:{look.text_px}px">{note}</div>'
            f'<div style="display:flex;align-items:flex-start">{"".join(columns)}</div></div>')


def mask_html(record: CycleRecord, tokenizer, selected: int = -1, look: Look = NOTEBOOK) -> str:
    """The tree attention mask the target received: row i may attend to column j (■) iff node j is
    node i or one of its ancestors; the selected node's row and its ancestors' columns are marked."""
    mask = record.tree.ancestor_mask()
    mark = look.colours["accepted"][0]
    labels = [_quoted(tokenizer, t) for t in record.tree.tokens]
    rows = []
    for i, label in enumerate(labels):
        cells = "".join(
            f'<td style="border:1px solid {look.colours["untried"][1]};text-align:center;padding:0 4px;'
            f'background:{mark if i == selected and mask[i, j] else "transparent"}">{"■" if mask[i, j] else ""}</td>'
            for j in range(len(labels)))
        rows.append(f'<tr data-node="{i}"><th style="text-align:right;padding-right:6px">{i} {label}</th>{cells}</tr>')
    head = [""] + [f'<span data-node="{j}">{j}</span>' for j in range(len(labels))]
    return (f'<div class="lab-phase mask"><div style="font-size:{look.text_px}px">The {len(labels)} × {len(labels)} '
            f"mask scored in one forward: each row is a node (with its token), ■ where it may attend; the cached "
            f"context is visible to every row.</div>{_table(look, head, rows, 'lab-mask')}</div>")


def verify_html(record: CycleRecord, tokenizer, look: Look = NOTEBOOK) -> str:
    """The examined nodes in order with their verdicts, then the token the target adds."""
    rows, lossy = [], rule_only(record)
    for i, c in enumerate(checks(record), 1):
        if c.node in lossy:
            test = f"{record.rule} only: {rule_verdict(record, c.node)}"
        elif record.greedy:
            test = "argmax" if c.verdict == "accepted" else "not argmax"
        elif record.chain:
            test = f"u {_number(c.u)} {'<' if c.verdict == 'accepted' else '≥'} p/q {_number(c.p / c.q if c.q else 0)}"
        else:
            test = f"u·m {_number(c.u * c.mass)} {'<' if c.verdict == 'accepted' else '≥'} p {_number(c.p)}"
        colour = look.colours[c.verdict][0]
        rows.append(f'<tr class="{c.verdict}" data-node="{c.node}" style="background:{colour}"><td>{i}</td>'
                    f"<td>{_quoted(tokenizer, record.tree.tokens[c.node])}</td><td>{_number(c.q)}</td>"
                    f"<td>{_number(c.p)}</td><td>{test}</td><td>{c.verdict}</td></tr>")
    table = _table(look, ["#", "draft", "q", "p", "test", "verdict"], rows, "lab-checks")
    final = f"then the {ORIGIN_LABELS[record.last]} {_quoted(tokenizer, record.final)}"
    residual = ""
    if record.residual:
        top = ", ".join(f"{_quoted(tokenizer, t)} {v:.3f}" for t, v in record.residual)
        what = "max(0, p − q)" if record.chain else "p without the rejected drafts"
        residual = f"<div>drawn from the residual {what}, renormalised; its top tokens: {top}</div>"
    return (f'<div class="lab-phase verify" style="font-size:{look.text_px}px">{table}<div>{final}</div>'
            f"{residual}</div>")


def commit_html(record: CycleRecord, tokenizer, look: Look = NOTEBOOK) -> str:
    """Which cache rows stay, which go, and what the cycle adds to the text."""
    kept, scored = kept_rows(record), len(record.tree)
    dropped = scored - len(record.path)
    text = "".join(_quoted(tokenizer, t) for t in record.emitted)
    return (f'<div class="lab-phase commit" style="font-size:{look.text_px}px">'
            f"<div>The cache held {record.context_len - 1} context rows and {scored} scored rows (the root and "
            f"{scored - 1} drafts); it keeps rows <b class='lab-kept'>{kept}</b> (the root and the "
            f"{len(record.path) - 1} accepted drafts) and drops {dropped}.</div>"
            f"<div>The text gains {len(record.emitted)} tokens: {text}; the last, the "
            f"{ORIGIN_LABELS[record.last]}, is the next cycle's root (its row is written then).</div></div>")


def phase_html(phase: str, record: CycleRecord, tokenizer, *, level: int = 1, selected: int = -1,
               look: Look = NOTEBOOK) -> str:
    """One of PHASES drawn; `level` is the drafting depth shown, `selected` the mask's marked node."""
    if phase == "drafting":
        return drafting_html(record, tokenizer, level, look)
    if phase == "mask":
        return mask_html(record, tokenizer, selected, look)
    if phase == "verify":
        return verify_html(record, tokenizer, look)
    return commit_html(record, tokenizer, look)
