"""`python -m lab doctor` says what this machine will run, one line each, and what to do about each missing
piece; the CPU fingerprint reads macOS's sysctl where there is no /proc/cpuinfo, and Linux ids stay as they were."""
import platform
import subprocess
import sys
import time

import pytest

import lab.artifacts as artifacts
import lab.doctor as doctor
from lab.paths import ROOT

NAMES = ["system", "cpu", "isa", "threads", "float32", "bfloat16", "q4_1", "compiler", "triton", "gpu", "chromium",
         "disk"]


def test_doctor_prints_one_line_per_check_in_seconds():
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lab", "doctor"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line[5:].split()[0] for line in lines[:-1]] == NAMES
    assert all(line.startswith(("[ok] ", "[--] ")) for line in lines[:-1])
    assert "tuning id " + artifacts.fingerprint_id(artifacts.cpu_fingerprint()) in done.stdout
    assert seconds < 60, f"doctor took {seconds:.0f} s"  # about 2 s once the C engine is built


def test_each_missing_piece_says_what_to_do(monkeypatch):
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    lines = {line[5:].split()[0]: line for line in doctor.report().splitlines()[:-1]}
    for name, advice in (("triton", "WSL2"), ("chromium", "make setup-browser")):
        assert lines[name].startswith("[--]") and "->" in lines[name] and advice in lines[name]
    assert "to see to" in doctor.report().splitlines()[-1]


def test_the_fingerprint_reads_sysctl_on_macos(monkeypatch):
    answers = {("-n", "machdep.cpu.brand_string"): "Apple M2", ("-n", "hw.l3cachesize"): "0",
               ("hw.optional",): "hw.optional.neon: 1\nhw.optional.arm.FEAT_BF16: 1\nhw.optional.avx2_0: 0"}
    monkeypatch.setattr(artifacts, "_cpuinfo", lambda key: None)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(artifacts.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 0, stdout=answers[tuple(cmd[1:])] + "\n"))
    monkeypatch.setattr(artifacts.Path, "read_text", lambda self: (_ for _ in ()).throw(OSError("no sysfs")))
    assert artifacts.cpu_flags() == {"asimd", "bf16"}
    fingerprint = artifacts.cpu_fingerprint()
    assert (fingerprint["cpu"], fingerprint["isa"], fingerprint["l3"]) == ("Apple M2", ["neon"], "unknown")


def test_linux_x86_fingerprint_ids_are_as_before():
    """The id as the code before macOS support computed it, from /proc/cpuinfo and sysfs directly."""
    if platform.system() != "Linux":
        pytest.skip("the stored tunings' ids were made on Linux")
    info = open("/proc/cpuinfo").read().splitlines()
    first = {}
    for line in info:
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    flags = set(first.get("flags", "").split())
    isa = [n for n, f in (("avx2", "avx2"), ("avx512", "avx512f"), ("avx512_bf16", "avx512_bf16"),
                          ("amx", "amx_bf16")) if f in flags]
    l3 = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()
    cpu = "-".join("".join(c if c.isalnum() else " " for c in first["model name"].lower()).split())
    assert artifacts.fingerprint_id(artifacts.cpu_fingerprint()) == \
        f"{cpu}_{artifacts.os.cpu_count()}c_l3-{l3}_{'-'.join(isa) or 'none'}"


def test_without_triton_the_kernels_say_in_one_line_where_they_run():
    blocked = "import sys; sys.modules['triton'] = None; import lab.kernels"  # as if it were not installed
    done = subprocess.run([sys.executable, "-c", blocked], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: lab.kernels needs Triton") and "WSL2" in last
