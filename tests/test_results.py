"""RESULTS.md is rendered from data/ and the committed page matches a fresh render."""
import json

import pytest

from lab.bench import format_table
from lab.paths import DATA_DIR, ROOT
from lab.results import RESULTS_DIR, bench_files, render_readme, render_results

PAGE = render_results()
BENCHES = [p for p in sorted(RESULTS_DIR.glob("*.json"))
           if "methods" in json.loads(p.read_text())]


def section(stem: str) -> str:
    """The text of one benchmark's section, up to the next heading."""
    return PAGE.split(f"\n### {stem}\n", 1)[1].split("\n#", 1)[0]


def test_there_are_benchmarks_to_list():
    assert BENCHES


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.name)
def test_every_benchmark_has_a_section_with_its_command_and_table(path):
    result = json.loads(path.read_text())
    text = section(path.stem)
    assert result["command"] in text
    assert format_table(result) in text


def test_every_manifest_artifact_is_catalogued():
    catalogue = PAGE.split("\n## Artifacts\n", 1)[1]
    artifacts = [m["artifact"] for m in (json.loads(p.read_text()) for p in DATA_DIR.rglob("*.json"))
                 if "artifact" in m]
    assert artifacts
    for artifact in artifacts:
        assert f"`{artifact}`" in catalogue


def test_every_tree_choice_is_listed():
    for path in DATA_DIR.glob("eagle/tree_choice*.json"):
        assert f"`data/eagle/{path.name}`" in PAGE.split("\n## EAGLE tree choices\n", 1)[1]


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
    from lab.results import rerun_line
    text = render_results()
    for path in bench_files():
        assert rerun_line(path) in text, path.name
    assert "make run E=bench-exact`" in rerun_line(RESULTS_DIR / "bench_exact_bf16.json")
    assert rerun_line(RESULTS_DIR / "bench_eagle_rerun.json").startswith("`python -m lab run --rerun")

