"""Prepared sessions: an inspector's decoding saved to a JSON file and loaded back without decoding
(a lecturer prepares before class), and the same session exported as one self-contained HTML page
that steps through every cycle's phases with buttons or the arrow keys, no kernel needed."""
from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

from ..artifacts import atomic_write, write_json
from ..bench import Setup
from ..errors import LabError
from ..trees import DraftTree
from .cycles import CycleRecord, cycle_summary
from .drawing import cycle_svg, generated_html
from .inspector import DraftTreeInspector
from .phases import PHASES, drafted_depth, phase_html

SESSION_KIND = "inspector-session"


def save_session(inspector: DraftTreeInspector, path: Path | str) -> Path:
    """Write the inspector's prompt, settings and recorded cycles to `path` (JSON, atomically)."""
    path = Path(path)
    write_json(path, {"kind": SESSION_KIND, "prompt": inspector.prompt_box.value,
                      "method": inspector.method_picker.value, "temperature": inspector.temperature_slider.value,
                      "tree": [inspector.depth_slider.value, inspector.top_k_slider.value,
                               inspector.total_slider.value],
                      "max_new_tokens": inspector.max_new_tokens, "seed": inspector.seed_box.value,
                      "records": [dataclasses.asdict(r) for r in inspector.records]})
    return path


def load_session(path: Path | str, setup: Setup | None = None) -> DraftTreeInspector:
    """An inspector showing the session saved at `path`, as recorded (changing a control decodes again).
    Raises LabError for a file that is not a saved session."""
    path = Path(path)
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LabError(f"cannot read the session {path}: {err}; save one with lab.viz.session.save_session")
    if not isinstance(saved, dict) or saved.get("kind") != SESSION_KIND:
        raise LabError(f"{path} is not a saved inspector session: save one with lab.viz.session.save_session")
    records = [CycleRecord(**{**r, "tree": DraftTree(**r["tree"]), "best": [tuple(b) for b in r["best"]],
                              "residual": None if r["residual"] is None else [tuple(t) for t in r["residual"]],
                              "expanded": None if r["expanded"] is None else DraftTree(**r["expanded"])})
               for r in saved["records"]]
    return DraftTreeInspector(saved["prompt"], saved["method"], saved["temperature"], tuple(saved["tree"]),
                              saved["max_new_tokens"], saved["seed"], setup, recorded=records)


def _frames(inspector: DraftTreeInspector) -> list[dict]:
    """Every cycle's views, drawn once: the whole tree, each drafting level, the mask, verification and
    the commit, with the summary line and the text so far."""
    tokenizer, look, frames = inspector.setup.tokenizer, inspector.look, []
    for index, record in enumerate(inspector.records):
        deepest = drafted_depth(record)
        views = [("tree", cycle_svg(record, tokenizer, look=look))]
        views += [("drafting", phase_html("drafting", record, tokenizer, level=level, look=look))
                  for level in range(min(1, deepest), deepest + 1)]
        views += [(phase, phase_html(phase, record, tokenizer, look=look)) for phase in PHASES[1:]]
        frames.append({"summary": f"cycle {index + 1} of {len(inspector.records)}: "
                                  + cycle_summary(record, tokenizer),
                       "views": views, "text": generated_html(inspector.records, index, tokenizer, look)})
    return frames


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%(title)s</title>
<style>body{font-family:sans-serif;margin:16px;color:#000}button{font-size:%(px)spx;margin-right:8px}
#where{font-size:%(px)spx;margin:8px 0}</style></head>
<body><h1 style="font-size:%(h)spx">%(title)s</h1>
<div><button id="back" aria-label="previous phase">◀ back</button>
<button id="next" aria-label="next phase">step ▶</button></div>
<div id="where" aria-live="polite"></div><div id="view" class="lab-view"></div><div id="text"></div>
<script>
const frames = %(frames)s;
let cycle = 0, view = 0;
function show() {
  const frame = frames[cycle], [name, markup] = frame.views[view];
  document.getElementById("where").textContent = frame.summary + " · " + name;
  document.getElementById("view").innerHTML = markup;
  document.getElementById("text").innerHTML = frame.text;
}
function step(by) {
  view += by;
  if (view >= frames[cycle].views.length) { if (cycle + 1 < frames.length) { cycle += 1; view = 1; } else view -= 1; }
  if (view < 0) { if (cycle > 0) { cycle -= 1; view = frames[cycle].views.length - 1; } else view = 0; }
  show();
}
document.getElementById("next").onclick = () => step(1);
document.getElementById("back").onclick = () => step(-1);
document.addEventListener("keydown", (e) => {
  if (e.key === "ArrowRight") step(1);
  if (e.key === "ArrowLeft") step(-1);
});
show();
</script></body></html>
"""


def session_html(inspector: DraftTreeInspector) -> str:
    """The session as one HTML page that needs nothing else: every view drawn in advance."""
    title = html.escape(f"{inspector.method_picker.value} at temperature {inspector.temperature_slider.value:g}: "
                        f"{inspector.prompt_box.value}")
    frames = json.dumps(_frames(inspector)).replace("</", "<\\/")  # no early </script>
    return _PAGE % {"title": title, "frames": frames, "px": inspector.look.text_px + 2,
                    "h": inspector.look.text_px + 8}


def export_html(inspector: DraftTreeInspector, path: Path | str) -> Path:
    """Write `session_html` to `path` atomically."""
    path = Path(path)
    atomic_write(path, lambda tmp: tmp.write_text(session_html(inspector)))
    return path
