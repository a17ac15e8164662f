"""The draft-tree inspector (notebook 05): step through the cycles of a speculative method on one
prompt and see, for every drafted node, what the draft and the target made of it. The controls are
ipywidgets; the tree is an anywidget view whose JavaScript ships in the package (treeview.js), so
nothing is fetched at run time. Where no widget can render (nbconvert), the display falls back to
static HTML of the current cycle."""
from __future__ import annotations

import dataclasses
import html
import threading
from pathlib import Path

import anywidget
import ipywidgets as widgets
import traitlets

from ..bench import STATIC_METHODS, Setup
from ..costmodel import dtype_name, load_choice
from ..data import chat_ids
from ..decode import DecodeResult, decode
from ..errors import LabError
from ..sampling import Sampling
from ..target.load import engine_for
from .cycles import CycleRecord, CycleRecorder, cycle_summary, node_details
from .drawing import NOTEBOOK, PROJECTOR, cycle_svg, foldable, generated_html
from .methods import (CHAIN_METHODS, DEPTHS, INSPECTED_METHODS, LOSSY, MAX_TEMPERATURE, TOP_KS, TOTALS, VIEWS,
                      check_arguments, inspected_drafter, shipped_setup)
from .phases import drafted_depth, phase_html

PLAY_INTERVAL_MS = 1500


class _Cancelled(Exception):
    """Raised inside decoding's token callback once cancel was pressed."""


class TreeView(anywidget.AnyWidget):
    """Shows `svg` and sends `{"click": node}` for every click on an element with `data-node`."""
    _esm = Path(__file__).with_name("treeview.js")
    svg = traitlets.Unicode("").tag(sync=True)


class DraftTreeInspector(widgets.VBox):
    """Decoding cycles of one prompt, one at a time; changing a control decodes again. `method` is one
    of INSPECTED_METHODS; `tree` is (depth, top-k, total tokens), by default the shipped tuned tree; `sd`
    reads only the depth and `eagle1` no top-k. `setup` (lab.bench.Setup) supplies the models, else the
    shipped ones load when first needed. Raises LabError for an argument out of range."""

    # the view's state within a cycle, changed by click() and reset by every new cycle
    expanded = traitlets.List(traitlets.Int(), help="nodes of the current cycle whose folded branch is open")
    selected = traitlets.Int(-1, help="the node whose details are shown (-1: none)")

    def __init__(self, prompt: str, method: str = "eagle2", temperature: float = 0.0,
                 tree: tuple[int, int, int] | None = None, max_new_tokens: int = 64, seed: int = 0,
                 setup: Setup | None = None, recorded: list[CycleRecord] | None = None, background: bool = False):
        super().__init__()
        check_arguments(prompt, method, temperature, tree, max_new_tokens)
        self.setup = dataclasses.replace(setup) if setup is not None else shipped_setup()
        self.engine = engine_for(self.setup.target)
        self.prompt_ids: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.records: list[CycleRecord] = []
        self.result: DecodeResult | None = None
        depth, top_k, total = tree or self._shipped_tree()
        wide = {"description_width": "initial"}
        self.method_picker = widgets.Dropdown(options=INSPECTED_METHODS, value=method, description="method",
                                              style=wide)
        self.seed_box = widgets.BoundedIntText(seed, 0, 2**31 - 1, description="seed",
                                               layout=widgets.Layout(width="160px"))
        self.temperature_slider = widgets.FloatSlider(value=temperature, min=0.0, max=MAX_TEMPERATURE, step=0.1,
                                                      description="temperature", continuous_update=False, style=wide)
        self.depth_slider = widgets.IntSlider(depth, *DEPTHS, description="depth", continuous_update=False)
        self.top_k_slider = widgets.IntSlider(top_k, *TOP_KS, description="top-k", continuous_update=False)
        self.total_slider = widgets.IntSlider(total, *TOTALS, description="total tokens", continuous_update=False,
                                              style=wide)
        # cycles are numbered from 1, as the summary counts them
        self.cycle_slider = widgets.IntSlider(1, 1, 1, description="cycle", layout=widgets.Layout(width="420px"))
        self.play = widgets.Play(1, 1, 1, interval=PLAY_INTERVAL_MS, description="play")
        widgets.link((self.play, "max"), (self.cycle_slider, "max"))
        widgets.link((self.play, "value"), (self.cycle_slider, "value"))
        self.summary, self.details, self.text = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.view = TreeView()
        self.prompt_box = widgets.Textarea(prompt, description="prompt", layout=widgets.Layout(width="640px"))
        self.decode_button = widgets.Button(description="decode", tooltip="decode the prompt again")
        self.cancel_button = widgets.Button(description="cancel", tooltip="stop decoding; the cycles on show stay",
                                            disabled=True)
        self.progress = widgets.IntProgress(0, 0, max_new_tokens, description="tokens")
        self.background, self._cancelled, self._worker = background, False, None
        self.view_picker = widgets.ToggleButtons(options=VIEWS, value="tree", description="view",
                                                 tooltips=["the whole cycle", "the tree, level by level",
                                                           "the attention mask the target received",
                                                           "the nodes in the order verification checks them",
                                                           "the cache rows kept and the tokens added"])
        self.step_button = widgets.Button(description="step ▶", tooltip="the next phase (after the commit: the next "
                                                                         "cycle)")
        self.projector = widgets.Checkbox(False, description="projector", tooltip="labels of 18 px or more, the "
                                                                                  "Okabe-Ito palette")
        self.level = 1  # the drafting view's deepest level shown
        for widget, name in ((self, "inspector"), (self.method_picker, "method"),
                             (self.temperature_slider, "temperature"), (self.depth_slider, "depth"),
                             (self.top_k_slider, "top-k"), (self.total_slider, "total"),
                             (self.cycle_slider, "cycle"), (self.play, "play"), (self.view, "tree"),
                             (self.details, "details"), (self.text, "text"), (self.summary, "summary"),
                             (self.prompt_box, "prompt"), (self.decode_button, "decode"), (self.view_picker, "view"),
                             (self.step_button, "step"), (self.projector, "projector"), (self.seed_box, "seed"),
                             (self.cancel_button, "cancel"), (self.progress, "progress")):
            widget.add_class(f"lab-{name}")  # stable handles for the browser test
        self.controls = widgets.Accordion([widgets.VBox([
            widgets.HBox([self.prompt_box, widgets.VBox([self.decode_button, self.cancel_button, self.progress])]),
            widgets.HBox([self.method_picker, self.temperature_slider, self.seed_box]),
            widgets.HBox([self.depth_slider, self.top_k_slider, self.total_slider])])], selected_index=0)
        self.controls.set_title(0, "controls")
        self.children = [self.controls, widgets.HBox([self.play, self.cycle_slider, self.projector]),
                         widgets.HBox([self.view_picker, self.step_button]),
                         self.summary, self.view, self.details, self.text]
        for control in (self.method_picker, self.temperature_slider, self.seed_box, self.depth_slider,
                        self.top_k_slider, self.total_slider):
            control.observe(self._decode, names="value")
        self.decode_button.on_click(lambda _button: self._decode())
        self.cancel_button.on_click(lambda _button: self.cancel())
        self.step_button.on_click(lambda _button: self.step())
        self.view_picker.observe(lambda _change: self._draw_tree(), names="value")
        self.projector.observe(self._project, names="value")
        self.cycle_slider.observe(self._show_cycle, names="value")
        self.view.on_msg(lambda _view, content, _buffers: self._message(content))
        if recorded is None:
            self._decode()
        else:  # a prepared session (lab/viz/session.py): its cycles as recorded, nothing decoded
            self.prompt_ids = chat_ids(self.setup.tokenizer, prompt)
            self._show(recorded)

    @property
    def record(self) -> CycleRecord:
        """The cycle on show."""
        return self.records[self.cycle_slider.value - 1]

    @property
    def look(self):
        """The drawing's sizes and colours: the projector's or the notebook's."""
        return PROJECTOR if self.projector.value else NOTEBOOK

    def step(self) -> None:
        """One phase further: the drafting levels one by one, then the mask, verification and the
        commit; after the commit, the next cycle's drafting (the whole-cycle view steps to drafting)."""
        view, deepest = self.view_picker.value, drafted_depth(self.record)
        if view == "drafting" and self.level < deepest:
            self.level += 1
            self._draw_tree()
        elif view in ("tree", "commit"):
            if view == "commit" and self.cycle_slider.value < len(self.records):
                self.cycle_slider.value += 1  # shows the next cycle through the slider's observer
            self.level = min(1, deepest)
            if self.view_picker.value == "drafting":
                self._draw_tree()
            self.view_picker.value = "drafting"
        else:
            self.view_picker.value = VIEWS[VIEWS.index(view) + 1]

    def back(self) -> None:
        """One phase back, the reverse of `step`: before a cycle's first drafting level, its previous
        cycle's commit."""
        view = self.view_picker.value
        if view == "drafting" and self.level > min(1, drafted_depth(self.record)):
            self.level -= 1
            self._draw_tree()
        elif view in ("tree", "drafting"):
            if self.cycle_slider.value > 1:
                self.cycle_slider.value -= 1
                self.level = drafted_depth(self.record)  # as stepping through it left it
                self.view_picker.value = "commit"
        else:
            self.view_picker.value = VIEWS[VIEWS.index(view) - 1]
            if self.view_picker.value == "drafting":
                self.level = drafted_depth(self.record)
                self._draw_tree()

    def _message(self, content: dict) -> None:
        """What the tree view reports: a click on a node, or a key pressed while it had focus."""
        if "click" in content:
            self.click(int(content["click"]))
        elif content.get("key") == "ArrowRight":
            self.step()
        elif content.get("key") == "ArrowLeft":
            self.back()
        elif content.get("key") == "t":  # the whole tree, or back to drafting
            self.view_picker.value = "drafting" if self.view_picker.value == "tree" else "tree"

    def click(self, node: int) -> None:
        """Select `node` (len(tree): the target's own token) and fold or unfold its branch where it can.
        Raises LabError for a node the cycle does not have."""
        if not 0 <= node <= len(self.record.tree):
            raise LabError(f"cycle {self.cycle_slider.value} has nodes 0..{len(self.record.tree)}, not {node}")
        if node in foldable(self.record):
            self.expanded = [n for n in self.expanded if n != node] if node in self.expanded else self.expanded + [node]
        self.selected = node
        self._draw_tree()

    def static_html(self) -> str:
        """The current cycle as plain HTML: what a notebook shows where widgets cannot render."""
        return (f'<div class="lab-inspector-static">{self.summary.value}{self.view.svg}{self.details.value}'
                f"{self.text.value}</div>")

    def _repr_mimebundle_(self, **kwargs) -> dict:
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/html"] = self.static_html()  # kept in the saved notebook; nbconvert shows it
        return bundle

    def _shipped_tree(self) -> tuple[int, int, int]:
        """The tree the setup carries, else the shipped tuning for the target's dtype."""
        choice = self.setup.eagle_tree or load_choice(dtype=dtype_name(self.setup.target))
        return choice.depth, choice.top_k, choice.total_tokens

    def _decode(self, _change: dict | None = None) -> None:
        method = self.method_picker.value
        self.top_k_slider.disabled = method in CHAIN_METHODS or method in STATIC_METHODS
        self.total_slider.disabled = method in CHAIN_METHODS
        self.temperature_slider.disabled = method in LOSSY
        sampling = Sampling(0.0 if method in LOSSY else self.temperature_slider.value)  # lossy rules are greedy
        if not self.prompt_box.value.strip():
            raise LabError("the inspector needs a prompt: type one in the prompt box")
        self.prompt_ids = chat_ids(self.setup.tokenizer, self.prompt_box.value)
        drafter, draft_len, rule = inspected_drafter(self.setup, method, self.depth_slider.value,
                                                     self.top_k_slider.value, self.total_slider.value)
        if hasattr(drafter, "expansions"):  # a dynamic tree: keep it before reranking, to show the cut
            drafter.expansions = []
        if hasattr(rule, "seen"):  # the judge: keep its scores, to show them
            rule.seen = []
        self.wait(cancel=True)
        self._cancelled, self.progress.value, self.cancel_button.disabled = False, 0, False
        if self.background:  # the kernel stays free for the controls; tests and notebooks decode in place
            self._worker = threading.Thread(target=self._run, args=(drafter, draft_len, sampling, rule), daemon=True)
            self._worker.start()
        else:
            self._run(drafter, draft_len, sampling, rule)

    def cancel(self) -> None:
        """Stop a decoding under way after its current cycle; the cycles on show stay."""
        self._cancelled = True

    def wait(self, cancel: bool = False) -> None:
        """Return once a background decoding has finished (cancelling it first if `cancel`)."""
        if self._worker is not None and self._worker.is_alive():
            self._cancelled = self._cancelled or cancel
            self._worker.join()

    def _run(self, drafter, draft_len: int, sampling: Sampling, rule) -> None:
        recorder = CycleRecorder(sampling, drafter, rule)

        def progressed(tokens: list[int], _origins: list[str]) -> None:
            if self._cancelled:
                raise _Cancelled
            self.progress.value += len(tokens)
        try:
            result = decode(self.engine, drafter, self.prompt_ids, self.max_new_tokens, sampling, draft_len,
                            self.seed_box.value, self.setup.tokenizer.eos_token_id, on_tokens=progressed,
                            kernel="torch", rule=rule, on_cycle=recorder)
        except _Cancelled:
            self.summary.value += (f'<div style="font-size:{self.look.text_px}px"><b>decoding cancelled</b> after '
                                   f"{self.progress.value} tokens: the cycles above are the earlier decoding's</div>")
            return
        finally:
            self.cancel_button.disabled = True
        self._show(recorder.records, result)

    def _show(self, records: list[CycleRecord], result: DecodeResult | None = None) -> None:
        """Show `records` from their first cycle (`result`: their decoding's, else rebuilt from them)."""
        self.records = records
        self.result = result or DecodeResult([t for r in records for t in r.emitted],
                                             [o for r in records for o in r.origins], len(records))
        if self.cycle_slider.value == 1:
            self._show_cycle()
        else:
            self.cycle_slider.value = 1  # shows the first cycle through the slider's observer
        self.cycle_slider.max = len(self.records)

    def _show_cycle(self, _change: dict | None = None) -> None:
        """A cycle comes into view folded, with nothing selected."""
        tokenizer = self.setup.tokenizer
        self.summary.value = self._summary_html()
        self.text.value = generated_html(self.records, self.cycle_slider.value - 1, tokenizer, self.look)
        self.expanded, self.selected, self.level = [], -1, min(1, drafted_depth(self.record))
        self._draw_tree()

    def _project(self, _change: dict | None = None) -> None:
        """Projector mode on or off: redraw everything; the controls fold away while it is on."""
        self.controls.selected_index = None if self.projector.value else 0
        self._show_cycle()

    def _draw_tree(self) -> None:
        tokenizer, record = self.setup.tokenizer, self.record
        view = self.view_picker.value
        self.view.svg = (cycle_svg(record, tokenizer, set(self.expanded), self.selected, self.look) if view == "tree"
                         else phase_html(view, record, tokenizer, level=self.level, selected=self.selected,
                                         look=self.look))
        if self.selected < 0:
            self.details.value = (f'<div style="font-size:{self.look.text_px}px">Hover over a node for its scores and '
                                  "verdict; click it to keep them here (and to unfold a +n branch).</div>")
        else:
            lines = node_details(record, self.selected, tokenizer)
            self.details.value = (f'<div style="font-size:{self.look.text_px}px"><b>{html.escape(lines[0])}</b>'
                                  '<ul style="margin:2px 0">'
                                  + "".join(f"<li>{html.escape(line)}</li>" for line in lines[1:]) + "</ul></div>")

    def _summary_html(self) -> str:
        method, result = self.method_picker.value, self.result
        depth, top_k, total = self.depth_slider.value, self.top_k_slider.value, self.total_slider.value
        if method in CHAIN_METHODS:
            budget = f"a chain of up to {depth} drafts"
        elif method in STATIC_METHODS:
            budget = f"a static tree, depth {depth}, {total} tokens"
        else:
            budget = f"a dynamic tree, depth {depth}, top-k {top_k}, {total} tokens"
        if method in LOSSY:
            budget += " (lossy: greedy verification or the rule, so the text is no longer the target's)"
        seconds = self.records[-1].seconds
        rate = f", {len(result.tokens) / seconds:.1f} tokens/s" if seconds > 0 else ""
        return (f'<div style="font-size:{self.look.text_px}px"><b>{method}</b> at temperature '
                f"{self.temperature_slider.value:g}, "
                f"{budget}: {len(result.tokens)} tokens in {result.cycles} cycles, τ = {result.tau:.2f}{rate}"
                f"<br><b>cycle {self.cycle_slider.value} of {len(self.records)}</b>: "
                f"{html.escape(cycle_summary(self.record, self.setup.tokenizer))}</div>")

