"""Where things live: the repository, the shipped artifacts and the gitignored cache."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"          # small shipped artifacts (token ids, drafts, manifests, results)
FIGURES_DIR = ROOT / "figures"
KERNEL_BENCH_DIR = DATA_DIR / "kernel_bench"  # one file per GPU: python -m lab.kernels.bench
INSTRUCTOR_DIR = ROOT / "instructor"  # the chapters whole: solutions, and the notes for whoever teaches them
NOTEBOOKS_DIR = ROOT / "notebooks"    # what students open: generated from INSTRUCTOR_DIR, solutions stubbed
CACHE_DIR = Path(os.environ.get("LAB_CACHE", ROOT / ".cache"))  # big rebuildable caches, gitignored
# The EAGLE-3 head that decoding, tuning and export use by default (data/eagle/NAME.safetensors)
EAGLE3_SHIPPED = "eagle3-full"


def shipped_head(kind: str) -> str:
    """The head file a kind uses when none is named: EAGLE3_SHIPPED for eagle3, else the kind itself."""
    return EAGLE3_SHIPPED if kind == "eagle3" else kind


def fast_mode() -> bool:
    """`LAB_FAST=1` shrinks every notebook's and command's sizes so CI can run them all."""
    return os.environ.get("LAB_FAST", "0") not in ("", "0", "false", "False")


def figure_path(name: str) -> Path:
    """Where a notebook saves a figure: figures/, or in fast mode a gitignored folder that spares them."""
    folder = CACHE_DIR / "figures-fast" if fast_mode() else FIGURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def results_file(name: str, fast: bool | None = None) -> Path:
    """Where a resumable command keeps its results: data/results/NAME, or in fast mode (`fast`, else
    LAB_FAST) a gitignored file."""
    fast = fast_mode() if fast is None else fast
    return CACHE_DIR / "results-fast" / name if fast else DATA_DIR / "results" / name
