"""Every file under data/: what it is, how the library finds it, and who loads it.

A file is under data/ only if a notebook, a test, the results page or a documented command reads it.
Each entry names its files (a glob; the first matching entry holds a file), the loader's path function
(`locate`, so a renamed loader or moved file shows at once) and its users (file, loading text).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .artifacts import ignored_by_git
from .bench.endtoend import RESULTS_FILE
from .costmodel import choice_path
from .data.regenerated import regen_files
from .drafters.heads import head_path
from .judge.probe import judge_path
from .judge.sweep import QUALITY_FILE
from .paths import DATA_DIR, KERNEL_BENCH_DIR, ROOT
from .results import bench_files
from .target.load import draft_path

NB02 = "instructor/02_rejection_sampling.ipynb"
NB03, NB04, NB05, NB06 = ("instructor/03_vanilla_speculative_decoding.ipynb", "instructor/04_eagle_feature_drift.ipynb",
                          "instructor/05_dynamic_draft_trees.ipynb", "instructor/06_training_time_test.ipynb")
NB07, NB08, NB09 = ("instructor/07_judge_decoding.ipynb", "instructor/08_end_to_end.ipynb",
                    "instructor/09_triton_verification_kernels.ipynb")
RESULTS_PAGE = ("lab/results.py", "DATA_DIR.rglob(\"*.json\")")  # the artifact catalogue reads every manifest


@dataclass(frozen=True)
class Entry:
    pattern: str                        # glob relative to data/
    what: str
    locate: Callable[[Path], Path | None]  # the loader's path for this file, from its name or content
    users: tuple[tuple[str, str], ...]  # (repository file, the text in it that loads the data)


def _head(path: Path) -> Path:
    return head_path(path.stem)


def _head_manifest(path: Path) -> Path:
    return head_path(path.stem).with_suffix(".json")


def _tree_choice(path: Path) -> Path:
    tuned = json.loads(path.read_text())
    return choice_path(tuned["dtype"], tuned["head"])


def _draft(path: Path) -> Path:
    layers = int(re.fullmatch(r"draft_(\d+)l", path.stem).group(1))
    return draft_path(layers).with_suffix(path.suffix)


def _regen(path: Path) -> Path:
    packed, manifest, _ = regen_files(sampled=path.stem.endswith("t1"))
    return packed if path.suffix == ".npz" else manifest


def _result(path: Path) -> Path | None:
    """The results page reads the benchmarks (`bench_files`), the judge's sweep and the end-to-end file."""
    return next((p for p in (*bench_files(), QUALITY_FILE, RESULTS_FILE) if p.name == path.name), None)


def _head_entry(names: str, what: str, *users: tuple[str, str]) -> Entry:
    return Entry(f"eagle/{names}.safetensors", what, _head, users)


FINDINGS_HEADS = ("ttt-top", "eagle3-s1", "eagle3-s3", "eagle3-cur", "eagle3-cur-even")

HEADS = (
    _head_entry("eagle1", "the shipped CPU-trained EAGLE-1 head",
                (NB05, 'load_head(target, "eagle1")'), (NB06, '"eagle1"'), ("tests/test_bench.py", '"eagle1"')),
    _head_entry("eagle1-gpu", "the EAGLE-1 head trained on the lent GPU: the demo's and the exact bar's head",
                ("Makefile", "--eagle-head eagle1-gpu")),
    _head_entry("eagle3-full", "the shipped EAGLE-3 head", (NB06, '"eagle3-full"'),
                ("tests/test_evaluate.py", "eagle3-full")),
    _head_entry("eagle3-gpu", "the EAGLE-3 head trained on the lent GPU, of the GPU heads' benchmark",
                ("lab/experiments.py", "--eagle3-head eagle3-gpu")),
    _head_entry("eagle3-curriculum", "the curriculum head of its benchmark",
                ("lab/experiments.py", '_eagle3_benches("eagle3-curriculum"')),
    _head_entry("eagle3", "the EAGLE-3 head trained on the 0.6M-token set, of its tuned tree",
                ("lab/experiments.py", "--head eagle3 --name eagle3")),
    _head_entry("medusa", "the Medusa heads of notebook 03b and its benchmark",
                ("instructor/03b_drafting_without_a_draft_model.ipynb", 'load_head(target, "medusa")'),
                ("lab/experiments.py", "_head(\"medusa\", \"train medusa")),
    _head_entry("*-greedy", "notebook 04's three variants trained on greedy answers",
                (NB04, 'load_head(target, f"{v}-{text}")')),
    _head_entry("*-sampled", "notebook 04's three variants trained on answers sampled at T = 1",
                (NB04, 'load_head(target, f"{v}-{text}")')),
    *(_head_entry(name, "a head behind a finding, re-scored by the command docs/findings.md gives",
                  ("docs/findings.md", name)) for name in FINDINGS_HEADS),
)

ENTRIES: tuple[Entry, ...] = (
    *HEADS,
    Entry("eagle/tree_choice*.json", "a tuned tree (one per head and dtype)", _tree_choice,
          (("lab/costmodel/choice.py", "tuned = json.loads(path.read_text())"),
           ("tests/test_evaluate.py", "tree_choice"))),
    Entry("eagle/*.json", "a head's manifest (a head without weights ships its manifest alone)", _head_manifest,
          (RESULTS_PAGE, ("lab/drafters/heads.py", "def head_manifest("))),
    Entry("drafts/draft_*l.*", "a distilled draft model of notebook 03 and its manifest", _draft,
          ((NB03, "load_draft(target, n)"), ("tests/test_models.py", "load_draft("))),
    Entry("regen/*", "the regenerated training set (greedy, and sampled at T = 1) and its manifest", _regen,
          ((NB02, "load_regen()"), (NB04, "load_regen(sampled="))),
    Entry("judge/*.json", "a Judge Decoding head (a linear probe and its threshold)", lambda p: judge_path(p.stem),
          ((NB07, "load_judge("), ("lab/judge/sweep.py", "judge_path("))),
    Entry("results/*.json", "a benchmark or sweep result", _result,
          (RESULTS_PAGE, ("lab/results.py", "def bench_files("))),
    Entry("kernel_bench/*.json", "a Triton kernel benchmark on a lent GPU", lambda p: KERNEL_BENCH_DIR / p.name,
          ((NB09, 'DATA_DIR / "kernel_bench"'),)),
)


def entry_of(path: Path) -> Entry | None:
    """The first entry whose pattern matches `path` (a file under data/), None if none does."""
    relative = path.relative_to(DATA_DIR)
    return next((e for e in ENTRIES if relative.match(e.pattern)), None)


def data_files() -> list[Path]:
    """Every file under data/ that git would ship: not dot files, nor what .gitignore leaves out."""
    files = sorted(p for p in DATA_DIR.rglob("*") if p.is_file() and not p.name.startswith("."))
    ignored = ignored_by_git(files)
    return [p for p in files if p not in ignored]


def source_text(relative: str) -> str:
    """A repository file's text as a reader sees it: a notebook's cell sources, anything else whole."""
    path = ROOT / relative
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)
