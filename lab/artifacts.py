"""Writing results safely (to a temporary name, then renamed, so an interrupted job never leaves a
half-written file) and describing how they were made (the command, commit and machine of a manifest)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

from .errors import LabError
from .paths import ROOT

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: os.umask can only be read by setting it


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path), then rename tmp_path to path. Each writer gets its own temporary name, so
    two processes writing the same file cannot mix bytes: the last rename wins, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; the result should read like any file
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2) + "\n"))


def read_results(path: Path) -> dict | None:
    """A results file an earlier (perhaps interrupted) run wrote, None if there is none yet. Raises
    LabError on one that does not parse: `write_json` never half-writes, so it is not silently replaced."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise LabError(f"{path} is not valid JSON: move it away (or delete it) and rerun") from None


def resumable_runs(recorded: dict[str, dict], wanted: dict[str, Any], identity: Callable[[dict], Any],
                   keep_other: Callable[[str, dict], bool] = lambda name, record: True,
                   ) -> tuple[dict[str, dict], list[str], list[str]]:
    """Compare the recorded runs with those wanted now (name -> what the run depends on). Returns (kept:
    recorded runs whose `identity` is still the wanted one, plus unwanted ones `keep_other` accepts;
    todo: the wanted names left to run, in order; stale: the recorded names rerun or dropped)."""
    kept = {n: r for n, r in recorded.items()
            if (identity(r) == wanted[n] if n in wanted else keep_other(n, r))}
    return kept, [n for n in wanted if n not in kept], sorted(set(recorded) - set(kept))


def repo_path(path: Path) -> str:
    """A path inside the repository as the repository names it (for manifests); others unchanged."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def ignored_by_git(paths: list[Path]) -> set[Path]:
    """The paths .gitignore leaves out of the repository (weights that ship as a manifest alone)."""
    listed = subprocess.run(["git", "check-ignore", "--stdin"], input="\n".join(map(str, paths)), cwd=ROOT,
                            capture_output=True, text=True).stdout.splitlines()
    return {Path(line) for line in listed}


def git_commit() -> str:
    if os.environ.get("LAB_COMMIT"):  # a copy of the tree whose git metadata may be stale (a lent GPU machine)
        return os.environ["LAB_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        # outputs other runs write (benchmark JSON, figures) do not change the code that runs
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!data/results", ":!figures"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return sha + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpuinfo(key: str) -> str | None:
    """The first `key : value` of /proc/cpuinfo (None where there is none, or no such file)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.split(":", 1)[0].strip() == key), None)


def _sysctl(*args: str) -> str | None:
    """What macOS's `sysctl` prints for `args` (None elsewhere, or where it fails): macOS has no /proc."""
    if platform.system() != "Darwin":
        return None
    try:
        return subprocess.run(["sysctl", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


# macOS's hw.optional names for the instruction sets the fingerprint and `doctor` name
_MACOS_FLAGS = {"avx2_0": "avx2", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vnni": "avx512_vnni",
                "neon": "asimd", "arm.feat_bf16": "bf16", "arm.feat_i8mm": "i8mm", "arm.feat_dotprod": "asimddp"}


def cpu_flags() -> set[str]:
    """The instruction-set flags this CPU reports, by Linux's names: /proc/cpuinfo's `flags` (x86) or
    `Features` (arm64), else macOS's sysctl hw.optional; empty where none is reported."""
    listed = _cpuinfo("flags") or _cpuinfo("Features")
    if listed is not None:
        return set(listed.split())
    optional = _sysctl("hw.optional") or ""
    present = {ln.split(":")[0].removeprefix("hw.optional.").lower() for ln in optional.splitlines()
               if ln.rsplit(":", 1)[-1].strip() == "1"}
    return {name for key, name in _MACOS_FLAGS.items() if key in present}


def _l3() -> str:
    try:
        return (Path("/sys/devices/system/cpu/cpu0/cache/index3/size")).read_text().strip()
    except OSError:
        size = _sysctl("-n", "hw.l3cachesize")
        return f"{int(size) // 1024}K" if size and size.isdigit() and int(size) > 0 else "unknown"


def cpu_name() -> str:
    return _cpuinfo("model name") or _sysctl("-n", "machdep.cpu.brand_string") or platform.processor() \
        or platform.machine()


def cpu_fingerprint() -> dict:
    """What decides which tree pays on a CPU (model, vector and matrix ISA, cores, L3); equal
    fingerprints share a tuning. On Linux x86-64 the fields read as they always have (stored tunings
    keep their ids); NEON is named on arm64."""
    flags = cpu_flags()
    isa = [name for name, flag in (("avx2", "avx2"), ("avx512", "avx512f"), ("avx512_bf16", "avx512_bf16"),
                                   ("amx", "amx_bf16"), ("neon", "asimd")) if flag in flags]
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "isa": isa, "l3": _l3()}


def fingerprint_id(fingerprint: dict) -> str:
    """A fingerprint as one short name, e.g. `amd-epyc_2c_l3-32768K_avx2-avx512-avx512_bf16`."""
    cpu = "-".join("".join(c if c.isalnum() else " " for c in fingerprint["cpu"].lower()).split())
    return f"{cpu}_{fingerprint['cores']}c_l3-{fingerprint['l3']}_{'-'.join(fingerprint['isa']) or 'none'}"


def machine() -> dict:
    fingerprint = cpu_fingerprint()
    return {"cpu": fingerprint["cpu"], "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "fingerprint": fingerprint}


def command_line() -> str:
    return " ".join(["python -m lab"] + sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py") \
        else " ".join(sys.argv)
