"""environment.yml (conda users) and pyproject.toml (pip) pin the same versions."""
import re
import tomllib

from lab.paths import ROOT


def test_environment_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    conda = re.findall(r"^\s+- ([A-Za-z0-9_.\-]+==[^\s#]+)", (ROOT / "environment.yml").read_text(), re.M)
    assert sorted(conda) == sorted(project)
    assert "torch==2.13.0" in project and "triton==3.6.0" in project
