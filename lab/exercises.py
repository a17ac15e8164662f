"""`make exercises`: the student chapters in `notebooks/` and the objectives on docs/course.md, generated
from the whole chapters in `instructor/`.

A cell tagged `solution` holds only functions, checked by a `lab.check` call in the next cell; the
student copy keeps their signatures and docstrings, stubs their bodies and drops every output.
A small tool of our own rather than nbgrader: the one thing needed is "stub these functions", and
nbgrader's solution markers, database and grading server would be more to learn than this file.
`python -m lab.exercises --check` fails when a committed copy is out of date."""
from __future__ import annotations

import argparse
import ast
import copy
import sys
from pathlib import Path

import nbformat

from .artifacts import atomic_write
from .errors import LabError
from .paths import INSTRUCTOR_DIR, NOTEBOOKS_DIR, ROOT

SOLUTION_TAG, EXERCISE_TAG = "solution", "exercise"
OBJECTIVES = "## Objectives"
COURSE_PAGE = ROOT / "docs" / "course.md"
STUB = 'raise NotImplementedError("exercise: write this function, then run the check in the next cell")'


def stub_functions(source: str) -> str:
    """Every top-level function of `source` with its body replaced by the stub (signature and
    docstring kept); LabError if the cell holds anything but functions."""
    tree = ast.parse(source)
    lines = source.splitlines()
    kept = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            raise LabError(f"a `{SOLUTION_TAG}` cell may hold only functions; line {node.lineno} is a "
                           f"{type(node).__name__}: move it to another cell")
        first = node.body[0]
        has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
            first.value.value, str)
        start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
        end = first.end_lineno if has_doc else first.lineno - 1
        indent = " " * first.col_offset
        kept.append("\n".join(lines[start:end] + [indent + STUB]))
    return "\n\n\n".join(kept)


def solution_cells(notebook) -> list:
    return [c for c in notebook.cells if c.cell_type == "code" and SOLUTION_TAG in c.metadata.get("tags", [])]


def slide_type(cell) -> str:
    """RISE's slide type for a cell: a new slide at each chapter or section heading, a sub-slide at
    each sub-section, otherwise the cell continues the slide it is on."""
    if cell.cell_type == "markdown" and cell.source.startswith(("# ", "## ")):
        return "slide"
    return "subslide" if cell.cell_type == "markdown" and cell.source.startswith("### ") else "-"


def student_copy(notebook):
    """The notebook with every solution cell stubbed and tagged `exercise`, outputs dropped, and
    slide types set so that it presents as slides in JupyterLab (jupyterlab-rise)."""
    out = copy.deepcopy(notebook)
    for cell in out.cells:
        cell.metadata["slideshow"] = {"slide_type": slide_type(cell)}
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        tags = cell.metadata.get("tags", [])
        if SOLUTION_TAG in tags:
            cell.source = stub_functions(cell.source)
            cell.metadata["tags"] = [EXERCISE_TAG if t == SOLUTION_TAG else t for t in tags]
    return out


def objectives(path: Path) -> list[str]:
    """The chapter's title and the bullets of its objectives cell (LabError when it has none)."""
    notebook = nbformat.read(path, as_version=4)
    cell = next((c for c in notebook.cells[:3] if c.cell_type == "markdown" and c.source.startswith(OBJECTIVES)),
                None)
    if cell is None:
        raise LabError(f"{path.name} has no objectives cell (markdown starting '{OBJECTIVES}') among its first "
                       "three cells: add one")
    title = notebook.cells[0].source.splitlines()[0].lstrip("# ")
    bullets = []
    for line in cell.source.splitlines():
        if line.startswith("- "):
            bullets.append(line)
        elif bullets and line[:1].isspace() and line.strip():  # a bullet wrapped onto the next line
            bullets[-1] += " " + line.strip()
    return [f"**{title}**", ""] + bullets + [""]


def course_page(source_dir: Path = INSTRUCTOR_DIR, page: Path = COURSE_PAGE) -> str:
    """docs/course.md with its objectives block rebuilt from the chapters' objectives cells."""
    lines = [line for path in sorted(source_dir.glob("*.ipynb")) for line in objectives(path)]
    text = page.read_text()
    start, end = "<!-- objectives:start -->", "<!-- objectives:end -->"
    if start not in text or end not in text:
        raise LabError(f"{page.name} lacks the markers {start} ... {end}: put them back where the objectives go")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n" + "\n".join(lines) + f"{end}{rest.split(end, 1)[1]}"


def render(path: Path) -> str:
    """The student copy of the chapter at `path` as text."""
    return nbformat.writes(student_copy(nbformat.read(path, as_version=4))) + "\n"


def stale(source_dir: Path = INSTRUCTOR_DIR, out_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """Copies that are missing, differ from a fresh render, or have no chapter any more."""
    wanted = {p.name: render(p) for p in sorted(source_dir.glob("*.ipynb"))}
    problems = [name for name, text in wanted.items()
                if not (out_dir / name).exists() or (out_dir / name).read_text() != text]
    problems += [p.name for p in sorted(out_dir.glob("*.ipynb")) if p.name not in wanted]
    if source_dir == INSTRUCTOR_DIR and COURSE_PAGE.read_text() != course_page():
        problems.append(COURSE_PAGE.name)
    return problems


def write(source_dir: Path = INSTRUCTOR_DIR, out_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Write every student copy (atomically) and remove copies whose chapter is gone."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chapters = sorted(source_dir.glob("*.ipynb"))
    for stray in set(out_dir.glob("*.ipynb")) - {out_dir / p.name for p in chapters}:
        stray.unlink()
    written = []
    for path in chapters:
        text = render(path)
        target = out_dir / path.name
        atomic_write(target, lambda tmp, text=text: tmp.write_text(text))
        written.append(target)
    if source_dir == INSTRUCTOR_DIR:
        text = course_page()
        atomic_write(COURSE_PAGE, lambda tmp: tmp.write_text(text))
        written.append(COURSE_PAGE)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.exercises", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed student copy is out of date")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale()
            if problems:
                sys.exit(f"error: student copies out of date: {', '.join(problems)}; run `make exercises`")
            print("student copies are up to date")
        else:
            for path in write():
                print(path.relative_to(ROOT))
    except LabError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
