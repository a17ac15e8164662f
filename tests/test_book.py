"""The rendered book: solution cells never reach a page, every image is described, a dirty tree
and figures no run of the commit wrote are refused."""
import json

import nbformat
import pytest

from lab import book
from lab.errors import LabError


def _chapter():
    cells = [nbformat.v4.new_markdown_cell("# 99 · A chapter"),
             nbformat.v4.new_markdown_cell("## A section"),
             nbformat.v4.new_code_cell("def secret_answer():\n    return 42", metadata={"tags": ["solution"]}),
             nbformat.v4.new_code_cell('fig.savefig(figure_path("99_curve.png"))')]
    cells[3].outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "x"})]
    return nbformat.v4.new_notebook(cells=cells)


def test_a_page_drops_the_solution_cells_and_describes_each_image():
    page = book.chapter_html(_chapter())
    assert "secret_answer" not in page and "A section" in page
    assert '<img alt="Figure from the section “A section” (figures/99_curve.png)"' in page
    assert book.title(_chapter()) == "99 · A chapter"


def test_a_dirty_tree_is_refused(monkeypatch):
    class Dirty:
        stdout = " M lab/book.py\n"
    monkeypatch.setattr(book.subprocess, "run", lambda *a, **k: Dirty())
    with pytest.raises(LabError, match="commit or stash"):
        book.refuse_dirty_tree()


def test_a_figure_from_another_commit_is_named(tmp_path, monkeypatch):
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "b.png").write_bytes(b"")
    manifest = {"notebooks": {"99": {"figures": ["a.png"], "commit": "c1"},
                              "98": {"figures": ["b.png"], "commit": "c0"}}}
    monkeypatch.setattr(book, "FIGURES_DIR", tmp_path)
    monkeypatch.setattr(book, "load_manifest", lambda: json.loads(json.dumps(manifest)))
    with pytest.raises(LabError, match="figures no run of c1 wrote: b.png"):
        book.check_figures("c1")
    manifest["notebooks"]["98"]["commit"] = "c1"
    book.check_figures("c1")


def test_a_benchmark_figure_is_replotted_from_its_result_file(tmp_path, monkeypatch):
    from lab.experiments import Experiment, Step
    result = {"methods": {"ar": {"tokens_per_s": 10.0, "tau": 1.0, "speedup": 1.0},
                          "eagle2": {"tokens_per_s": 15.0, "tau": 2.1, "speedup": 1.5}},
              "config": {"dataset": "mt_bench", "limit": 2}, "machine": {"cpu": "a CPU", "cores": 2}}
    (tmp_path / "r.json").write_text(json.dumps(result))
    recorded = {}
    monkeypatch.setattr(book, "ROOT", tmp_path)
    monkeypatch.setattr(book, "EXPERIMENTS", {"x": Experiment("x", 1, (Step(("bench --json r.json --figure f.png",),
                                                                             "r.json"),
                                                                        Step(("bench --json gone.json --figure g.png",),
                                                                             "gone.json")))})
    monkeypatch.setattr(book, "record", lambda section, name, entry, command: recorded.update({name: entry}))
    assert book.replot_stored_figures() == ["f.png"]
    assert (tmp_path / "f.png").stat().st_size > 0 and recorded["f.png"]["source"] == "r.json"


def test_the_chapter_pages_share_one_style_sheet():
    page = book.chapter_html(_chapter())
    theme, pages = book.shared_theme({"a.html": page, "b.html": page})
    assert theme.count('<style type="text/css">') >= 1 and '<style type="text/css">' not in pages["a.html"]
    assert f'<link rel="stylesheet" href="{book.STYLESHEET}">' in pages["b.html"] and "A section" in pages["b.html"]
    with pytest.raises(LabError, match="different style sheets"):
        other = page.replace('<style type="text/css">', '<style type="text/css">x', 1)
        book.shared_theme({"a.html": page, "b.html": other})
