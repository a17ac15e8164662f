"""How the lab compiles its C engines: one portable build command for every C file under csrc/.
gcc or clang (CC, else the first of gcc, clang, cc on the PATH), optimised for this CPU (`-march=native`
on x86-64, `-mcpu=native` elsewhere, or a named x86-64 level), floating-point contraction off so that
gcc and clang compute the same bits, and OpenMP where the compiler links it (single-threaded otherwise,
said once). Each library is built once per source, compiler, flags and CPU into .cache/kernels/,
through a temporary file renamed into place."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..artifacts import cpu_flags
from ..errors import LabError
from ..paths import CACHE_DIR

COMPILERS = ("gcc", "clang", "cc")


@dataclass(frozen=True)
class Compiler:
    path: str      # the executable
    version: str   # its first line of `--version`
    is_clang: bool

    @property
    def name(self) -> str:
        return "clang" if self.is_clang else "gcc"


def find_compiler(name: str | None = None) -> Compiler:
    """The C compiler `name` (a command), else CC, else the first of COMPILERS on the PATH; LabError if none."""
    wanted = [name] if name else ([os.environ["CC"]] if os.environ.get("CC") else list(COMPILERS))
    for candidate in wanted:
        path = shutil.which(candidate)
        if path is None:
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        first = out.splitlines()[0] if out else candidate
        return Compiler(path, first, "clang" in out.lower())  # macOS's `gcc` is Apple clang
    raise LabError(f"the lab's C engines need a C compiler ({' or '.join(wanted)} not found): install gcc or clang "
                   "(Debian: apt-get install gcc; macOS: xcode-select --install), or use --dtype float32")


def arch_flags(march: str | None = None) -> list[str]:
    """Code generation for this CPU, or for `march` (an x86-64 level such as `x86-64` or `x86-64-v3`), by default
    the environment's LAB_MARCH: `LAB_MARCH=x86-64-v3` runs on an AVX-512 machine what an AVX2 laptop runs."""
    march = march or os.environ.get("LAB_MARCH")
    if march:
        return [f"-march={march}"]
    return ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]


@cache
def openmp_flags(compiler: Compiler) -> tuple[str, ...]:
    """("-fopenmp",) where `compiler` compiles and links an OpenMP program, else () (single-threaded)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n")
        done = subprocess.run([compiler.path, "-fopenmp", str(probe), "-o", str(Path(tmp) / "probe")],
                              capture_output=True, text=True)
    if done.returncode == 0:
        return ("-fopenmp",)
    print(f"[build] {compiler.name} links no OpenMP here: the C engines run on one thread "
          "(install libomp-dev for clang, or gcc, for all cores)", file=sys.stderr)
    return ()


def build_command(source: Path, out: Path, compiler: Compiler, openmp: bool = True, march: str | None = None
                  ) -> list[str]:
    """The command that compiles `source` into the shared library `out`."""
    threads = list(openmp_flags(compiler)) if openmp else []
    return [compiler.path, "-O3", *arch_flags(march), "-ffp-contract=off", *threads, "-shared", "-fPIC",
            str(source), "-o", str(out), "-lm"]


def compile_library(source: Path, signatures: dict[str, list], compiler: str | None = None, openmp: bool = True,
                    march: str | None = None) -> ctypes.CDLL:
    """`source` built with `build_command` (once per source, compiler, flags and CPU) and loaded, each function
    of `signatures` (name -> ctypes argument types) declared to return nothing."""
    cc = find_compiler(compiler)
    probe = build_command(source, Path("out.so"), cc, openmp, march)[1:]
    key = hashlib.sha256(source.read_bytes() + cc.version.encode() + " ".join(probe).encode()
                         + " ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    out = CACHE_DIR / "kernels" / f"{source.stem}-{cc.name}-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        done = subprocess.run(build_command(source, tmp, cc, openmp, march), capture_output=True, text=True)
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[-200:])
            raise LabError(f"compiling {source.name} with {cc.name} failed: {first.strip()}")
        tmp.rename(out)
    # where torch has loaded its libgomp already, a gcc-built library binds to the same OpenMP runtime
    lib = ctypes.CDLL(str(out))
    for name, args in signatures.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, None
    return lib
