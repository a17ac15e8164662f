"""`python -m lab.figures`: a notebook run is timed and the figures it wrote are recorded."""
import json
import re

import nbformat
import pytest

import lab.figures as figures
from lab.errors import LabError


@pytest.fixture
def private_figures(tmp_path, monkeypatch):
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "old.png").write_bytes(b"untouched")
    monkeypatch.setattr(figures, "FIGURES_DIR", folder)
    monkeypatch.setattr(figures, "MANIFEST", folder / "manifest.json")
    monkeypatch.setattr(figures, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.delenv("LAB_FAST", raising=False)
    return folder


def test_a_run_records_its_time_and_only_the_figures_it_wrote(private_figures, tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"from pathlib import Path\nPath({str(private_figures / 'new.png')!r}).write_bytes(b'png')"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(0.5)")])
    path = tmp_path / "99_probe.ipynb"
    nbformat.write(notebook, path)
    figures.run([path], timeout=120)
    entry = json.loads((private_figures / "manifest.json").read_text())["notebooks"]["99_probe"]
    assert entry["figures"] == ["new.png"] and entry["seconds"] > 0 and entry["commit"]
    slowest = entry["slowest_cells"]  # the sleeping cell first, timed from nbclient's stamps
    assert slowest[0]["cell"] == 1 and 0.5 <= slowest[0]["seconds"] < 5 and slowest[1]["seconds"] < 0.5
    assert (tmp_path / "cache" / "executed" / "99_probe.ipynb").exists()


def test_fast_mode_and_missing_notebooks_are_refused(private_figures, tmp_path, monkeypatch):
    with pytest.raises(LabError, match="no such notebook"):
        figures.run([tmp_path / "missing.ipynb"])
    monkeypatch.setenv("LAB_FAST", "1")
    with pytest.raises(LabError, match="LAB_FAST"):
        figures.run([tmp_path / "missing.ipynb"])


def test_every_figure_the_readme_shows_was_made_by_a_recorded_run():
    """A figure in the README is one somebody can remake: a notebook run or the browser test's
    screenshots recorded in figures/manifest.json, or a benchmark whose JSON names it."""
    from lab.paths import ROOT
    from lab.results import bench_files
    shown = set(re.findall(r"figures/([\w.-]+\.png)", (ROOT / "README.md").read_text()))
    benches = {json.loads(p.read_text()).get("config", {}).get("figure") for p in bench_files()}
    made = figures.recorded_figures() | {f.removeprefix("figures/") for f in benches if f}
    assert shown and shown <= made, f"not made by any recorded run: {sorted(shown - made)}"
