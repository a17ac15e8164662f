"""Whether the lab's pinned dependencies install on another platform (macOS on Apple silicon first), checked
from this machine with pip's platform options: every pin, then every dependency they declare for that
platform (markers evaluated for it, not for this machine, which pip itself does not do), until nothing new
appears. pip's dry run reads the index's metadata files, so no wheel is downloaded."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .paths import ROOT

PLATFORMS = {  # name: (pip's --platform tags, the marker environment of such a machine)
    "macos-arm64": (["macosx_14_0_arm64", "macosx_13_0_arm64", "macosx_12_0_arm64", "macosx_11_0_arm64"],
                    {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64",
                     "os_name": "posix", "implementation_name": "cpython",
                     "platform_python_implementation": "CPython"}),
}
UNREACHABLE = ("NewConnectionError", "Network is unreachable", "Temporary failure in name resolution",
               "Could not fetch URL", "ProxyError", "ConnectTimeout")


class IndexUnreachable(Exception):
    """pip reached no package index."""


@dataclass
class Resolved:
    name: str
    wanted: str            # the requirement as declared (pin or range, from the lab or a dependency)
    file: str | None       # the wheel pip would install there, None where it found none
    needed_by: str         # "lab" or the package that declared it


def pinned_requirements() -> list[Requirement]:
    """pyproject.toml's dependencies."""
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def _marker_environment(platform: str, python: str) -> dict[str, str]:
    return {**PLATFORMS[platform][1], "python_version": python, "python_full_version": f"{python}.0",
            "implementation_version": f"{python}.0", "platform_release": "", "platform_version": "", "extra": ""}


def _applies(requirement: Requirement, environment: dict[str, str]) -> bool:
    return requirement.marker is None or Marker(str(requirement.marker)).evaluate(environment)


def _pip_dry_run(requirements: list[str], platform: str, python: str) -> dict[str, dict]:
    """pip's report of what it would install for `requirements` (no dependencies) on `platform`: name -> entry.
    Requirements it finds no wheel for are left out. Raises IndexUnreachable when no index answered."""
    tags = [arg for tag in PLATFORMS[platform][0] for arg in ("--platform", tag)]
    with tempfile.TemporaryDirectory() as tmp:
        listed, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"

        def run(asked: list[str]) -> dict[str, dict] | None:
            listed.write_text("\n".join(asked) + "\n")
            done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                                   "--ignore-installed", "--only-binary=:all:", *tags, "--python-version", python,
                                   "--implementation", "cp",
                                   "--target", str(Path(tmp) / "target"), "--report", str(report), "--quiet",
                                   "-r", str(listed)], capture_output=True, text=True)
            if any(sign in done.stderr for sign in UNREACHABLE):
                raise IndexUnreachable(next(ln for ln in done.stderr.splitlines()
                                            if any(sign in ln for sign in UNREACHABLE)).strip())
            if done.returncode != 0:
                return None
            return {canonicalize_name(e["metadata"]["name"]): e for e in json.loads(report.read_text())["install"]}
        together = run(requirements)
        if together is not None:
            return together
        # one missing wheel fails the whole call: ask one at a time to find which
        return {name: entry for r in requirements for name, entry in (run([r]) or {}).items()}


def resolve(platform: str = "macos-arm64", python: str = "3.11") -> list[Resolved]:
    """Every pin and every dependency they declare for `platform` and `python`, each with the wheel pip finds
    there (None where none). Raises IndexUnreachable when no package index can be reached."""
    environment = _marker_environment(platform, python)
    wanted: dict[str, tuple[Requirement, str]] = {}
    frontier = [(r, "lab") for r in pinned_requirements() if _applies(r, environment)]
    rows: list[Resolved] = []
    while frontier:
        fresh = []
        for r, by in frontier:  # the first declaration of a name is the one checked
            if canonicalize_name(r.name) not in wanted:
                wanted[canonicalize_name(r.name)] = (r, by)
                fresh.append((r, by))
        asked = {canonicalize_name(r.name): f"{r.name}{r.specifier}" for r, _ in fresh}
        found = _pip_dry_run(list(asked.values()), platform, python)
        frontier = []
        for (r, by) in fresh:
            entry = found.get(canonicalize_name(r.name))
            rows.append(Resolved(r.name, asked[canonicalize_name(r.name)],
                                 entry["download_info"]["url"].rsplit("/", 1)[-1] if entry else None, by))
            for declared in (entry or {}).get("metadata", {}).get("requires_dist", []):
                dependency = Requirement(declared)
                if _applies(dependency, environment):
                    frontier.append((dependency, r.name))
    return rows


def format_resolution(rows: list[Resolved], platform: str, python: str) -> str:
    """A markdown table: the pins first, then the dependencies, the ones without a wheel marked."""
    lines = [f"Resolution for {platform}, Python {python} ({len(rows)} packages, "
             f"{sum(r.file is None for r in rows)} without a wheel):", "",
             "| package | wanted | wheel there | needed by |", "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r.needed_by != "lab", r.file is not None, r.name.lower())):
        lines.append(f"| {r.name} | {r.wanted} | {r.file or '**none**'} | {r.needed_by} |")
    return "\n".join(lines)
