"""Looking inside drafting cycles: record every drafted tree and what the target accepted,
render one cycle as HTML, and browse them with an ipywidgets slider (notebook 05)."""
from __future__ import annotations

import html
from dataclasses import dataclass

from .trees import DraftTree


@dataclass
class CycleRecord:
    tree: DraftTree
    accepted: list[int]   # accepted node indices, root first
    emitted: list[int]    # tokens the cycle produced (accepted drafts, then corrected or bonus)


class RecordingDraft:
    """Wraps a tree drafter and keeps a `CycleRecord` of every cycle (for inspection only)."""

    def __init__(self, drafter):
        self.drafter, self.records = drafter, []
        self.name, self.feature_layers = drafter.name, getattr(drafter, "feature_layers", ())

    def begin(self, prompt: list[int]) -> None:
        self.records, self._pending = [], None
        self.drafter.begin(prompt)

    def propose(self, context, k, s, rng):
        tree = self.drafter.propose(context, k, s, rng)
        self._pending = (tree, len(context))
        return tree

    def commit(self, context: list[int], features=None) -> None:
        if self._pending is not None:
            tree, before = self._pending
            emitted = context[before:]
            self.records.append(CycleRecord(tree, tree.follow(emitted), emitted))
            self._pending = None
        self.drafter.commit(context, features)


def cycle_html(record: CycleRecord, tokenizer) -> str:
    """One cycle as a nested list: each drafted token with the draft's confidence; the accepted
    path in bold green, the rest grey; the target's own final token below."""
    tree, accepted = record.tree, set(record.accepted)
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents[1:], 1):
        children.setdefault(parent, []).append(i)

    def label(i: int) -> str:
        text = html.escape(repr(tokenizer.decode([tree.tokens[i]])))
        if i == 0:
            return f"<b>root</b> {text}"
        style = "color:#1a7f37;font-weight:bold" if i in accepted else "color:#888"
        return f"<span style='{style}'>{text} <small>{tree.confidences[i]:.2f}</small></span>"

    def node(i: int) -> str:
        inner = "".join(node(c) for c in children.get(i, []))
        return f"<li>{label(i)}" + (f"<ul>{inner}</ul>" if inner else "") + "</li>"

    n = len(record.accepted) - 1
    final = record.emitted[n] if n < len(record.emitted) else None
    tail = "" if final is None else f" + target's token <b>{html.escape(repr(tokenizer.decode([final])))}</b>"
    summary = f"<p>{len(tree) - 1} drafted nodes, {n} accepted{tail}: {len(record.emitted)} tokens this cycle</p>"
    return summary + f"<ul style='font-family:monospace'>{node(0)}</ul>"


def cycle_viewer(records: list[CycleRecord], tokenizer):
    """A slider over the recorded cycles, showing each cycle's tree."""
    import ipywidgets as widgets
    if not records:
        raise ValueError("no cycles recorded: decode with a RecordingDraft first")
    slider = widgets.IntSlider(0, 0, len(records) - 1, description="cycle")
    view = widgets.HTML(cycle_html(records[0], tokenizer))
    slider.observe(lambda change: setattr(view, "value", cycle_html(records[change["new"]], tokenizer)), names="value")
    return widgets.VBox([slider, view])
