"""`make book`: the rendered course. From one clean commit it redraws the inspector's screenshots,
executes every chapter in `instructor/` at full size (recording each figure in figures/manifest.json),
and renders the executed chapters, without their solution cells, into `book/` as static HTML
(nbconvert's lab template), with the course page and an exported inspector session. The benchmark
figures that need a machine the book may not run on are re-plotted from their stored result files.

nbconvert rather than Jupyter Book: it is already installed, needs no Node toolchain, and a folder of
HTML pages with an index is all a reader needs."""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat

from .artifacts import atomic_write, git_commit, machine, repo_path
from .data import mt_bench
from .errors import LabError
from .experiments import EXPERIMENTS
from .figures import load_manifest, record, run
from .paths import CACHE_DIR, FIGURES_DIR, INSTRUCTOR_DIR, ROOT
from .viz.inspector import DraftTreeInspector
from .viz.plots import plot_bench
from .viz.session import export_html

BOOK_DIR = ROOT / "book"
MAX_BYTES = 30 * 2**20
_FIGURE_NAME = re.compile(r'figure_path\(\s*"([^"]+)"')


def refuse_dirty_tree() -> str:
    """The commit the book is built from; LabError when the working tree differs from it."""
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    if dirty.strip():
        raise LabError("the working tree has changes (git status): commit or stash them, so that every page and "
                       "figure of the book comes from one commit")
    return git_commit()


def _heading(source: str) -> str | None:
    lines = [line.lstrip("#").strip() for line in source.splitlines() if line.startswith("#")]
    return lines[0] if lines else None


def alt_texts(notebook) -> list[str]:
    """One description per PNG output, in page order: the section it sits in and the figure file the
    cell writes (nbconvert's template gives images no alt text of its own)."""
    section, alts = notebook.metadata.get("title", "chapter"), []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            section = _heading(cell.source) or section
            continue
        names = _FIGURE_NAME.findall(cell.source)
        images = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        for i, _ in enumerate(images):
            name = names[i] if i < len(names) else None
            alts.append(f"Figure from the section “{section}”" + (f" (figures/{name})" if name else ""))
    return alts


def chapter_html(notebook) -> str:
    """An executed chapter as one HTML page: solution cells removed, every image described."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    config = Config()
    config.TagRemovePreprocessor.enabled = True
    config.TagRemovePreprocessor.remove_cell_tags = {"solution"}
    exporter = HTMLExporter(config=config, template_name="lab")
    kept = nbformat.from_dict(notebook)
    kept.cells = [c for c in kept.cells if "solution" not in c.metadata.get("tags", [])]
    body, _ = exporter.from_notebook_node(kept)
    alts = iter(alt_texts(kept))
    body, count = re.subn(r'<img alt="No description has been provided for this image" class="" '
                          r'src="data:image/png', lambda m: f'<img alt="{html.escape(next(alts))}" src="data:image/png',
                          body)
    if next(alts, None) is not None:
        raise LabError(f"{count} images on the page but more PNG outputs in the chapter: the alt texts would shift")
    return body


def title(notebook) -> str:
    first = next((c for c in notebook.cells if c.cell_type == "markdown"), None)
    return (first and _heading(first.source)) or "chapter"


def index_html(chapters: list[tuple[str, str]], commit: str) -> str:
    """The front page: the chapters in order, then how the book was made."""
    items = "\n".join(f'<li><a href="{html.escape(page)}">{html.escape(name)}</a></li>' for page, name in chapters)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>The Speculative Decoding Lab</title>
<style>body {{ font: 17px/1.5 system-ui, sans-serif; max-width: 46em; margin: 2em auto; padding: 0 1em; }}</style>
</head><body>
<h1>The Speculative Decoding Lab</h1>
<p>A course on fast decoding for language models, every chapter executed at full size on a laptop-class CPU.
The chapters are read-only here, with their outputs and without the exercises' solutions; to run them,
open <code>notebooks/</code> (<code>make lab</code>). Objectives, plan, notation and reading:
<a href="course.html">the course page</a>.</p>
<ol>
{items}
</ol>
<p>One drafting cycle at a time, without a kernel: <a href="inspector.html">an exported inspector session</a>
(EAGLE-2 on an MT-Bench prompt; the arrow keys step through the phases).</p>
<p><small>Built by <code>make book</code> from commit <code>{html.escape(commit)}</code>;
figures/manifest.json records each figure's run.</small></p>
</body></html>
"""


def course_html() -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    body = markdown2html_mistune((ROOT / "docs" / "course.md").read_text())
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>The course</title><style>body '
            '{ font: 17px/1.5 system-ui, sans-serif; max-width: 56em; margin: 2em auto; padding: 0 1em; } '
            'td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; } table { border-collapse: collapse; }'
            f'</style></head><body>\n{body}\n</body></html>\n')


def inspector_page(path: Path) -> None:
    """The inspector cell of chapter 05, decoded again and exported as a page that needs no kernel."""
    export_html(DraftTreeInspector(mt_bench(1)[0].text, method="eagle2", max_new_tokens=64), path)


def replot_stored_figures() -> list[str]:
    """Redraw each figure a benchmark step writes beside its result file (`--figure` with `--json`) from
    that file, recording which file in figures/manifest.json; returns the figures drawn."""
    drawn = []
    for experiment in EXPERIMENTS.values():
        for step in experiment.steps:
            for command in step.commands:
                figure, result = re.search(r"--figure (\S+)", command), re.search(r"--json (\S+)", command)
                if figure and result and (ROOT / result.group(1)).exists():
                    plt.close(plot_bench(json.loads((ROOT / result.group(1)).read_text()), ROOT / figure.group(1)))
                    name = Path(figure.group(1)).name
                    record("stored results", name, {"figures": [name], "source": result.group(1)},
                           command="python -m lab.book (re-plotted from the result file)")
                    drawn.append(name)
    return drawn


def check_figures(commit: str) -> None:
    """Every PNG in figures/ was written by a run of this commit; LabError names the others."""
    runs = {name: entry for section in load_manifest().values() for entry in section.values()
            for name in entry["figures"] if entry["commit"] == commit}
    stale = sorted(p.name for p in FIGURES_DIR.glob("*.png") if p.name not in runs)
    if stale:
        raise LabError(f"figures no run of {commit} wrote: {', '.join(stale)}; delete them or make the chapter "
                       "that shows them draw them")


_THEME = re.compile(r'<style type="text/css">.*?</style>\n?', re.S)
STYLESHEET = "lab.css"


def shared_theme(pages: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The nbconvert theme every chapter page inlines, once, and the pages linking to it instead;
    LabError if the pages do not inline the same theme."""
    themes = {"".join(_THEME.findall(text)) for text in pages.values()}
    if len(themes) != 1:
        raise LabError("the chapter pages inline different style sheets: render them with one nbconvert template")
    link = f'<link rel="stylesheet" href="{STYLESHEET}">\n'
    return themes.pop(), {name: _THEME.sub("", text).replace("</head>", link + "</head>", 1)
                          for name, text in pages.items()}


def render(commit: str, out: Path = BOOK_DIR) -> int:
    """Write the book from the executed chapters in .cache/executed into `out` (built beside it, then
    swapped in whole); returns its size in bytes."""
    building = out.with_name(out.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    chapters, pages = [], {}
    for source in sorted(INSTRUCTOR_DIR.glob("*.ipynb")):
        executed = CACHE_DIR / "executed" / source.name
        if not executed.exists():
            raise LabError(f"{repo_path(executed)} is missing: run the chapter first (`make book` does)")
        notebook = nbformat.read(executed, as_version=4)
        page = source.stem + ".html"
        pages[page] = chapter_html(notebook)
        chapters.append((page, title(notebook)))
    theme, pages = shared_theme(pages)
    (building / STYLESHEET).write_text(theme)
    for page, text in pages.items():
        (building / page).write_text(text)
    (building / "course.html").write_text(course_html())
    (building / "index.html").write_text(index_html(chapters, commit))
    inspector_page(building / "inspector.html")
    size = sum(p.stat().st_size for p in building.iterdir())
    if size > MAX_BYTES:
        raise LabError(f"the book is {size / 2**20:.1f} MB, over {MAX_BYTES / 2**20:.0f} MB: shrink the largest page")
    shutil.rmtree(out, ignore_errors=True)
    building.rename(out)
    return size


def build(out: Path = BOOK_DIR) -> dict:
    """The whole `make book`: screenshots, every chapter at full size, the figure check, the pages;
    writes out/build.json (commit, machine, seconds, bytes)."""
    commit = refuse_dirty_tree()
    started = time.perf_counter()
    env = {**os.environ, "LAB_SCREENSHOTS": "1"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_browser.py"], cwd=ROOT, env=env, check=True)
    run(sorted(INSTRUCTOR_DIR.glob("*.ipynb")))
    replot_stored_figures()
    check_figures(commit)
    size = render(commit, out)
    summary = {"commit": commit, "machine": machine(), "seconds": round(time.perf_counter() - started, 1),
               "bytes": size, "pages": sorted(p.name for p in out.glob("*.html"))}
    atomic_write(out / "build.json", lambda tmp: tmp.write_text(json.dumps(summary, indent=1) + "\n"))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.book", description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true",
                        help="only render book/ again from the chapters `make book` executed (.cache/executed), "
                        "keeping the commit they ran at")
    args = parser.parse_args(argv)
    try:
        if args.render_only:
            built = json.loads((BOOK_DIR / "build.json").read_text())  # the commit the chapters ran at
            summary = {**built, "bytes": render(built["commit"])}
            atomic_write(BOOK_DIR / "build.json", lambda tmp: tmp.write_text(json.dumps(summary, indent=1) + "\n"))
            print(f"{summary['bytes'] / 2**20:.1f} MB in {repo_path(BOOK_DIR)}")
        else:
            summary = build()
            print(f"book/: {len(summary['pages'])} pages, {summary['bytes'] / 2**20:.1f} MB, "
                  f"{summary['seconds'] / 60:.1f} min, from {summary['commit']}")
    except (LabError, subprocess.CalledProcessError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
