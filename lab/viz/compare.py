"""Two methods side by side in the inspector, aligned by output position (the classroom's comparison)."""
from __future__ import annotations

import ipywidgets as widgets

from ..bench import Setup
from ..errors import LabError
from .inspector import DraftTreeInspector
from .methods import shipped_setup


class SideBySide(widgets.VBox):
    """Two methods on one prompt, seed and temperature, their cycles aligned by output position: the
    token slider shows on each side the cycle that produced that token, and how many target forwards
    (cycles) each method has needed to reach it. `setup` as for DraftTreeInspector, shared."""

    def __init__(self, prompt: str, methods: tuple[str, str] = ("sd", "eagle2"), temperature: float = 0.0,
                 max_new_tokens: int = 64, seed: int = 0, setup: Setup | None = None):
        super().__init__()
        if len(methods) != 2:
            raise LabError(f"SideBySide compares two methods, got {len(methods)}: {methods!r}")
        setup = setup if setup is not None else shipped_setup()
        self.sides = [DraftTreeInspector(prompt, method, temperature, max_new_tokens=max_new_tokens, seed=seed,
                                         setup=setup) for method in methods]
        for side in self.sides:
            side.controls.selected_index = None  # folded: the two cycles need the width
        shortest = min(len(side.result.tokens) for side in self.sides)
        self.position = widgets.IntSlider(1, 1, shortest, description="token", layout=widgets.Layout(width="640px"))
        self.forwards = widgets.HTML()
        self.position.add_class("lab-position")
        self.forwards.add_class("lab-forwards")
        self.add_class("lab-side-by-side")
        self.position.observe(self._align, names="value")
        self.children = [self.position, self.forwards, widgets.HBox(self.sides)]
        self._align()

    def cycle_of(self, side: int, token: int) -> int:
        """The cycle (from 1) of side `side` whose emitted tokens include output token `token` (from 1)."""
        produced = 0
        for number, record in enumerate(self.sides[side].records, 1):
            produced += len(record.emitted)
            if produced >= token:
                return number
        raise LabError(f"side {side} produced {produced} tokens, not {token}")

    def _align(self, _change: dict | None = None) -> None:
        token = self.position.value
        counts = []
        for index, side in enumerate(self.sides):
            side.cycle_slider.value = self.cycle_of(index, token)
            counts.append(f"<b>{side.method_picker.value}</b>: {side.cycle_slider.value} target forwards")
        self.forwards.value = (f'<div style="font-size:{self.sides[0].look.text_px}px">the first {token} tokens took '
                               + " · ".join(counts) + "</div>")
