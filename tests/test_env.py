"""environment.yml (conda users) and pyproject.toml (pip) pin the same versions, with the same platform markers;
and the pins install on macOS on Apple silicon (lab/platforms.py asks the package index)."""
import re
import tomllib

import pytest

from lab.paths import ROOT
from lab.platforms import IndexUnreachable, format_resolution, resolve


def test_environment_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    conda = [line.strip('"') for line in re.findall(r"^\s+- (\"[^\"]+\"|[A-Za-z0-9_.\-]+==[^\s#]+)",
                                                    (ROOT / "environment.yml").read_text(), re.M)]
    assert sorted(conda) == sorted(project)
    assert "torch==2.13.0" in project and "triton==3.6.0; sys_platform == 'linux'" in project


@pytest.mark.slow
def test_every_pin_and_dependency_has_a_wheel_for_macos_arm64():
    try:
        rows = resolve("macos-arm64", "3.11")
    except IndexUnreachable as err:
        pytest.skip(f"no package index reachable ({err}): the macOS resolution was not checked")
    missing = [r for r in rows if r.file is None]
    assert not missing, format_resolution(rows, "macos-arm64", "3.11")
    assert {"torch", "numpy", "transformers"} <= {r.name for r in rows if r.needed_by == "lab"}
    assert "triton" not in {r.name for r in rows}  # Linux-only by its marker


@pytest.mark.slow
def test_a_pin_without_a_macos_wheel_is_named():
    """The check above would catch it: Triton without its marker has no wheel for macOS, numpy beside it has."""
    from lab.platforms import _pip_dry_run
    try:
        found = _pip_dry_run(["triton==3.6.0", "numpy==2.3.5"], "macos-arm64", "3.11")
    except IndexUnreachable as err:
        pytest.skip(f"no package index reachable ({err}): the macOS resolution was not checked")
    assert set(found) == {"numpy"}
