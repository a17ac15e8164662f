"""`python -m lab doctor`: what this machine will run, one line each, and what to do about each missing
piece. It compiles the C engine (once; later runs find it built) and reads no model, so it takes seconds."""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .artifacts import cpu_fingerprint, cpu_flags, fingerprint_id
from .errors import LabError
from .paths import CACHE_DIR, ROOT
from .target import products
from .target.build import find_compiler, openmp_flags

# what the first run adds to the caches: the target dequantised to float32 safetensors (135M parameters x 4 bytes)
FIRST_RUN_BYTES = 540_000_000
ISA = (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX-512 VNNI", "avx512_vnni"), ("AVX-512 BF16", "avx512_bf16"),
       ("AMX", "amx_bf16"), ("NEON", "asimd"))


@dataclass
class Check:
    name: str
    ok: bool
    says: str
    todo: str = ""  # what to do where not ok

    def line(self) -> str:
        return f"[{'ok' if self.ok else '--'}] {self.name:10s} {self.says}" + (f"  -> {self.todo}" if self.todo else "")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def checks() -> list[Check]:
    """Every check, in the order `doctor` prints them."""
    flags, fingerprint = cpu_flags(), cpu_fingerprint()
    is_x86 = platform.machine() in ("x86_64", "AMD64")
    found = [name for name, flag in ISA if flag in flags]
    out = [Check("system", True, f"{platform.system()} {platform.release()} on {platform.machine()}, "
                                 f"Python {platform.python_version()}, torch {torch.__version__}"),
           Check("cpu", True, f"{fingerprint['cpu']}, {os.cpu_count()} cores, L3 {fingerprint['l3']} "
                              f"(tuning id {fingerprint_id(fingerprint)})"),
           Check("isa", bool(found), ", ".join(found) or "none of " + ", ".join(n for n, _ in ISA),
                 "" if found else "the C engines fall back to plain C: slower, the same bits")]
    threads = torch.get_num_threads()
    out.append(Check("threads", True, f"torch uses {threads} of {os.cpu_count()}"
                                      + (" (OMP_NUM_THREADS set)" if os.environ.get("OMP_NUM_THREADS") else "")))
    out += _engine_checks(is_x86)
    triton = importlib.util.find_spec("triton") is not None
    out.append(Check("triton", triton, "installed (chapter 09 runs its kernels, interpreted on a CPU)" if triton
                     else "not installed: Triton's wheels are Linux-only",
                     "" if triton else "run chapter 09 on Linux or in WSL2 (Windows); every other chapter runs here"))
    gpu = torch.cuda.is_available()
    out.append(Check("gpu", True, torch.cuda.get_device_name(0) if gpu
                     else "none: everything runs on the CPU (chapter 09's kernels under Triton's interpreter)"))
    chromium = next((shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)),
                    None)
    out.append(Check("chromium", chromium is not None, chromium or "not found: tests/test_browser.py will skip",
                     "" if chromium else "Debian/Ubuntu: `make setup-browser` (apt-get install chromium); "
                                         "only the browser tests need it"))
    out.append(_disk())
    return out


def _engine_checks(is_x86: bool) -> list[Check]:
    """The product path each engine takes here, and whether the C engine builds."""
    why_not = products.bf16_support()
    out = [Check("float32", True, "transformers engine: torch's own float32 products (the reference)"),
           Check("bfloat16", True, "exact engine: " + ("oneDNN's bfloat16 kernels" if why_not is None
                                                       else f"the lab's C kernel ({why_not})")),
           Check("q4_1", True, "exact engine on the GGUF's own blocks: integer block dots in "
                               + _quant_path(cpu_flags()) + " (lab/target/csrc/quant_ops.c)")]
    try:
        compiler = find_compiler()
    except LabError as err:
        return out + [Check("compiler", False, "no C compiler", str(err).split(": ", 1)[-1])]
    threads = "with OpenMP" if openmp_flags(compiler) else "without OpenMP: one thread"
    start = time.perf_counter()
    try:
        products.ops()
    except LabError as err:
        return out + [Check("compiler", False, f"{compiler.version}: the C engine does not build ({err})",
                            "install gcc (or clang) and rerun")]
    todo = "" if openmp_flags(compiler) else ("install gcc, or libomp for clang, for all cores" if is_x86
                                              else "brew install libomp, or gcc, for all cores")
    seconds = time.perf_counter() - start
    built = f"built in {seconds:.0f} s" if seconds > 0.5 else "built before"
    return out + [Check("compiler", bool(openmp_flags(compiler)),
                        f"{compiler.version}, {threads}; the C engine builds ({built})", todo)]


def _quant_path(flags: set[str]) -> str:
    """Which integer dot products quant_ops.c compiles to on this CPU (each gives the same bits)."""
    if {"avx512f", "avx512_vnni"} <= flags:
        return "AVX-512 VNNI"
    return "AVX2" if "avx2" in flags else "plain C (no x86 vector instructions)"


def _disk() -> Check:
    used = _size(CACHE_DIR)
    free = shutil.disk_usage(CACHE_DIR if CACHE_DIR.exists() else ROOT).free
    needed = 0 if used >= FIRST_RUN_BYTES else FIRST_RUN_BYTES + 500_000_000  # and room for features, checkpoints
    return Check("disk", free > needed, f"caches hold {used / 1e9:.2f} GB in {CACHE_DIR} (the first run adds the "
                                        f"float32 target, {FIRST_RUN_BYTES / 1e9:.2f} GB); {free / 1e9:.0f} GB free",
                 "" if free > needed else f"free {needed / 1e9:.1f} GB for the caches")


def report() -> str:
    """doctor's output: one line per check, then a summary line."""
    lines = [c.line() for c in checks()]
    missing = sum(line.startswith("[--]") for line in lines)
    lines.append(f"{missing} thing(s) to see to" if missing else "everything the course needs is here")
    return "\n".join(lines)
