"""RESULTS.md is rendered from data/ and the committed page matches a fresh render. The checks over
data files loop over every file and name every offender in one message; planted copies of a real
benchmark show the per-benchmark check can fail."""
import json
from pathlib import Path

import pytest

from lab.bench import format_table
from lab.paths import DATA_DIR, ROOT
from lab.results import RESULTS_DIR, bench_files, render_readme, render_results, rerun_line

PAGE = render_results()
BENCHES = [p for p in sorted(RESULTS_DIR.glob("*.json"))
           if "methods" in json.loads(p.read_text())]


def section(stem: str, page: str = PAGE) -> str | None:
    """The text of one benchmark's section, up to the next heading; None if it has none."""
    parts = page.split(f"\n### {stem}\n", 1)
    return parts[1].split("\n#", 1)[0] if len(parts) == 2 else None


def section_problems(paths: list[Path], page: str = PAGE) -> list[str]:
    """Every benchmark file without a section of its own in `page`, or whose section lacks its
    recorded command or its table as format_table renders it now."""
    found = []
    for path in paths:
        result = json.loads(path.read_text())
        text = section(path.stem, page)
        if text is None:
            found.append(f"{path}: no section '### {path.stem}' on the results page")
            continue
        if result["command"] not in text:
            found.append(f"{path}: its section lacks its command {result['command']!r}")
        if format_table(result) not in text:
            found.append(f"{path}: its section's table is not the file's table (stale page or file)")
    return found


def test_every_benchmark_has_a_section_with_its_command_and_table():
    assert BENCHES, "no benchmark files under data/results"
    found = section_problems(BENCHES)
    assert not found, "\n".join(found)


def test_a_benchmark_missing_from_the_page_or_out_of_step_with_it_is_reported(tmp_path):
    # copies of a real benchmark, each out of step with the committed page in one way
    real = RESULTS_DIR / "bench_eagle.json"
    result = json.loads(real.read_text())
    slower = json.loads(real.read_text())
    first = next(iter(slower["methods"].values()))
    first["tokens_per_s"] += 1.0
    planted = {"unlisted/bench_nowhere.json": result, "command/bench_eagle.json": {**result, "command": "bench --x"},
               "table/bench_eagle.json": slower, "good/bench_eagle.json": result}
    for name, content in planted.items():
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_text(json.dumps(content))
    found = section_problems([tmp_path / name for name in planted])
    assert len(found) == 3, found
    assert "unlisted" in found[0] and "no section '### bench_nowhere'" in found[0]
    assert "command" in found[1] and "lacks its command 'bench --x'" in found[1]
    assert "table" in found[2] and "table is not the file's table" in found[2]


def test_every_manifest_artifact_is_catalogued():
    catalogue = PAGE.split("\n## Artifacts\n", 1)[1]
    artifacts = [(p, m["artifact"]) for p in sorted(DATA_DIR.rglob("*.json"))
                 if "artifact" in (m := json.loads(p.read_text()))]
    assert artifacts
    missing = [f"{p}: artifact {a!r} not in the catalogue" for p, a in artifacts if f"`{a}`" not in catalogue]
    assert not missing, "\n".join(missing)


def test_every_tree_choice_is_listed():
    listed = PAGE.split("\n## EAGLE tree choices\n", 1)[1]
    choices = sorted(DATA_DIR.glob("eagle/tree_choice*.json"))
    assert choices, "no tree choices under data/eagle"
    missing = [str(p) for p in choices if f"`data/eagle/{p.name}`" not in listed]
    assert not missing, "tree choices missing from the page:\n" + "\n".join(missing)


def test_committed_page_is_up_to_date():
    committed = (ROOT / "RESULTS.md").read_text() if (ROOT / "RESULTS.md").exists() else ""
    assert committed == PAGE, "RESULTS.md is stale: run `python -m lab.results` (or `make results`)"


def test_committed_readme_block_is_up_to_date():
    readme = (ROOT / "README.md").read_text()
    assert render_readme(readme) == readme, "README.md's notebook times are stale: run `python -m lab.results`"


def test_a_readme_without_the_markers_is_refused_in_one_line():
    from lab.errors import LabError
    with pytest.raises(LabError, match="lacks the markers"):
        render_readme("# a README without the generated block\n")


def test_every_benchmark_section_says_how_to_make_it_again():
    # PAGE is rendered from the files alone (no clock, no git), so a second render would be the same text
    missing = [f"{p.name}: {rerun_line(p)}" for p in bench_files() if rerun_line(p) not in PAGE]
    assert not missing, "rerun lines missing from the page:\n" + "\n".join(missing)
    assert "make run E=bench-exact`" in rerun_line(RESULTS_DIR / "bench_exact_bf16.json")
    assert rerun_line(RESULTS_DIR / "bench_eagle_rerun.json").startswith("`python -m lab run --rerun")
