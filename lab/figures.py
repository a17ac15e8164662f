"""`make figures`: execute notebooks at full size, time each, and record which figures it wrote.

`python -m lab.figures [NOTEBOOK ...]` runs notebooks (default: all) with nbclient and updates each
one's entry in `figures/manifest.json` (seconds, slowest cells, figures written, command, commit,
machine, date), so that every figure can be traced to the run that drew it."""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from .artifacts import command_line, git_commit, machine, repo_path, write_json
from .errors import LabError
from .paths import CACHE_DIR, FIGURES_DIR, INSTRUCTOR_DIR, fast_mode

MANIFEST = FIGURES_DIR / "manifest.json"


def _figure_times() -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in FIGURES_DIR.glob("*.png")}


def slowest_cells(notebook, n: int = 3) -> list[dict]:
    """The `n` code cells that took longest, from the execution timestamps nbclient records."""
    timed = []
    for index, cell in enumerate(notebook.cells):
        stamps = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type == "code" and "iopub.execute_input" in stamps and "shell.execute_reply" in stamps:
            begin, end = (datetime.fromisoformat(stamps[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            timed.append({"cell": index, "id": cell.get("id"), "seconds": round((end - begin).total_seconds(), 1)})
    return sorted(timed, key=lambda c: -c["seconds"])[:n]


def run_notebook(path: Path, timeout: int = 3600) -> dict:
    """Execute one notebook in its own folder: its wall seconds, slowest cells and the figures it wrote."""
    import nbformat
    from nbclient import NotebookClient
    before = _figure_times()
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    out = CACHE_DIR / "executed"
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out / path.name)
    written = sorted(p.name for p, t in _figure_times().items() if before.get(p) != t)
    return {"seconds": round(seconds, 1), "slowest_cells": slowest_cells(notebook), "figures": written}


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"notebooks": {}}


def record(section: str, name: str, entry: dict, command: str | None = None) -> dict:
    """Merge one run's entry, with its command, commit, machine and date, into the manifest's `section`."""
    manifest = load_manifest()
    manifest.setdefault(section, {})[name] = {
        **entry, "command": command or command_line(), "commit": git_commit(), "machine": machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(MANIFEST, manifest)
    return manifest


def recorded_figures() -> set[str]:
    """Every figure file some recorded run wrote: the notebooks and the screenshots."""
    return {f for section in load_manifest().values() for entry in section.values() for f in entry["figures"]}


def run(paths: list[Path], timeout: int = 3600) -> dict:
    """Run `paths` in order; after each, merge its entry into figures/manifest.json (written
    atomically, so an interrupted run keeps the notebooks that finished)."""
    if fast_mode():
        raise LabError("LAB_FAST is set: `make figures` draws full-size figures; unset it (fast-mode figures go "
                       "to .cache/figures-fast and are not recorded)")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise LabError(f"no such notebook: {', '.join(missing)} (the chapters live in instructor/)")
    manifest = load_manifest()
    for path in paths:
        print(f"running {repo_path(path)} ...", flush=True)
        entry = run_notebook(path, timeout)
        manifest = record("notebooks", path.stem, entry)
        print(f"  {entry['seconds']:.0f} s, figures: {', '.join(entry['figures']) or 'none'}", flush=True)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.figures", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files (default: every instructor/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell (default 3600)")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.notebooks] or sorted(INSTRUCTOR_DIR.glob("*.ipynb"))
    try:
        run(paths, args.timeout)
    except LabError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
