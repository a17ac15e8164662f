"""The course frame: every chapter opens with objectives and ends with a summary, the course page
carries the plan, the hardware note and the notation, the claims a review found wrong stay gone,
no chapter or book page reads like a work log, the student copies present as slides, and the
rendered book has a page per chapter without a solution."""
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from lab.exercises import OBJECTIVES, solution_cells
from lab.figures import load_manifest
from lab.paths import INSTRUCTOR_DIR, NOTEBOOKS_DIR, ROOT

CHAPTERS = sorted(INSTRUCTOR_DIR.glob("*.ipynb"))
BOOK = ROOT / "book"

# Sentences found wrong or overstated (a review of the chapters), by the file that held them; compared
# with runs of white space made one space, so a reflowed line cannot hide one.
CORRECTED = {
    "README.md": ["decoding is bound by memory bandwidth"],
    "docs/notebooks.md": ["measures every claim it makes"],
    "instructor/01_autoregressive_cost.ipynb": ["Exactness costs nothing in speed", "with AMX the curve is flatter"],
    "instructor/04_eagle_feature_drift.ipynb": ["shows what it buys",
                                                "because a feature head's step costs more than a token head's"],
    "instructor/05_dynamic_draft_trees.ipynb": ["is memory-bound on a CPU", "makes the same move for the same reason"],
    "instructor/07_judge_decoding.ipynb": ["about 6.3 standard vs 19.7 judge", "The embedding says far more"],
    "instructor/08_end_to_end.ipynb": ["roughly 10^5 tokens", "sit at the small end of that curve",
                                       "so the speed-up is close to τ", "Only the points the paper states are shown"],
    "instructor/09_triton_verification_kernels.ipynb": ["Tree attention beats SDPA with a dense mask at every size"],
}
# What reads like a work log: a session or run named, a date, a commit-like hash (hex with a letter and a digit).
WORK_LOG = [r"\bsession \d+", r"\b20\d\d-\d\d-\d\d\b", r"\btoday\b", r"\byesterday\b", r"\bthe next (lent|run)\b",
            r"\blent (GPU|machine)\b", r"(?<![.\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?!\w|[-+]\d)"]


def _text(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    return path.read_text()


def log_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(re.search(p, line, re.I) for p in WORK_LOG)]


def page_text(page: str) -> str:
    """What a reader sees on a book page: no style, script, image data or tags."""
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", page, flags=re.S | re.I)
    return re.sub(r"<[^>]+>", " ", page)


@pytest.mark.parametrize("name", sorted(CORRECTED))
def test_the_corrected_claims_stay_gone(name):
    text = " ".join(_text(ROOT / name).split())
    assert [s for s in CORRECTED[name] if s in text] == []


def test_the_claims_check_sees_through_a_reflowed_line():
    assert "Exactness costs nothing in speed" in " ".join("Exactness costs\n   nothing in speed".split())


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_opens_with_objectives_and_ends_with_a_summary(path):
    notebook = nbformat.read(path, as_version=4)
    markdown = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    objectives = next((s for s in markdown[:3] if s.startswith(OBJECTIVES)), "")
    assert 3 <= sum(line.startswith("- ") for line in objectives.splitlines()) <= 5, "3-5 objectives"
    summaries = [i for i, s in enumerate(markdown) if s.startswith("## Summary")]
    after = [line for s in markdown[summaries[-1] + 1:] for line in s.splitlines() if line.startswith("## ")] \
        if summaries else None
    assert after is not None and set(after) <= {"## Exercises"}, "a '## Summary' after every section but the exercises"
    assert log_lines("\n".join(markdown)) == []


def stated_minutes(objectives: str) -> int | None:
    """The bound a chapter's objectives cell states for its full-size run ("under N minutes")."""
    match = re.search(r"\*\*Time:\*\* under (\d+) minutes? at full size", objectives)
    return int(match.group(1)) if match else None


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_states_a_time_its_last_full_size_run_kept(path):
    """The typed bound is checked against the run recorded in figures/manifest.json (by `make book`
    or `make figures`), so it cannot drift from the measurement."""
    notebook = nbformat.read(path, as_version=4)
    minutes = next(filter(None, (stated_minutes(c.source) for c in notebook.cells[:3])), None)
    assert minutes is not None, "the objectives cell states '**Time:** under N minutes at full size'"
    run = load_manifest()["notebooks"][path.stem]
    assert run["seconds"] <= 60 * minutes, f"the last full-size run took {run['seconds']:.0f} s"


def test_the_time_check_reads_the_bound():
    assert stated_minutes("**Time:** under 5 minutes at full size on a 2-core CPU") == 5
    assert stated_minutes("**Time:** under 1 minute at full size") == 1
    assert stated_minutes("**Time:** about 2 minutes to run here") is None


def test_the_scan_catches_a_work_log_and_spares_numbers():
    assert len(log_lines("We fixed it in session 31 (commit 0dab94a).\nOn 2026-12-04 it ran.")) == 2
    assert log_lines("1180000 tokens at 0.95; ids 4012345 and deadline; max |difference| 7.152557373046875e-07") == []
    assert len(log_lines("built from 0dab94a+uncommitted")) == 1


def test_the_course_page_has_the_plan_the_hardware_note_and_the_notation():
    text = (ROOT / "docs" / "course.md").read_text()
    for heading in ["## Prerequisites", "## What each chapter teaches", "## A plan", "## What students see",
                    "## Notation", "## Reading"]:
        assert heading in text
    assert text.count("| ") > 20 and "45-minute" in text
    for symbol in ["| γ |", "| N |", "| T(k) |", "| c |", "| β |", "| α |", "| τ |", "| n-α |", "| lossless |",
                   "| identical |", "| tokens per forward |", "| target forwards per answer |"]:
        assert symbol in text
    for path in CHAPTERS:  # the objectives block copies every chapter's objectives
        assert nbformat.read(path, as_version=4).cells[0].source.splitlines()[0].lstrip("# ") in text


def test_the_licences_and_the_citation_exist():
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "CC BY 4.0" in (ROOT / "LICENSE-CONTENT.md").read_text()
    assert yaml.safe_load((ROOT / "CITATION.cff").read_text())["license"] == "Apache-2.0"


def test_the_student_copies_present_as_slides():
    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        types = [c.metadata["slideshow"]["slide_type"] for c in cells]
        assert types[0] == "slide" and set(types) <= {"slide", "subslide", "-"}
        assert types.count("slide") >= 3


def test_the_book_has_a_page_per_chapter_without_solutions_or_history():
    built = json.loads((BOOK / "build.json").read_text())
    assert sum(p.stat().st_size for p in BOOK.iterdir()) <= 30 * 2**20
    for path in CHAPTERS:
        page = (BOOK / f"{path.stem}.html").read_text()
        for cell in solution_cells(nbformat.read(path, as_version=4)):
            for name in re.findall(r"^def (\w+)\(", cell.source, re.M):
                assert f"def {name}(" not in page, f"{path.stem}: the solution {name} is on the page"
        assert 'alt="No description' not in page
        assert log_lines(page_text(page)) == [], path.stem
    assert built["commit"] in (BOOK / "index.html").read_text()
    assert {"index.html", "course.html", "inspector.html"} <= set(built["pages"])
