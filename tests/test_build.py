"""The lab's portable C build (lab/target/build.py): gcc and clang, with OpenMP or without, compute the same bits
for the exact engine's operations, because floating-point contraction is off and each operation's order is fixed
by its source."""
import os
import platform
import shutil
from pathlib import Path

import pytest
import torch

import lab.target.build as build
import lab.target.products as products
from lab.target.exact import ExactEngine
from lab.target.load import tiny_target

needs_clang = pytest.mark.skipif(shutil.which("clang") is None and not os.environ.get("CI"),
                                 reason="clang is not installed (make test installs it with apt)")


def forward_bits(monkeypatch, lib) -> list[torch.Tensor]:
    """A tiny bfloat16 target's logits and hidden states through the exact engine with `lib` as its C library, its
    products in the lab's own kernel (`linear_bf16`) rather than oneDNN's: a prompt, then a masked tree."""
    monkeypatch.setattr(products, "_LIB", lib)
    monkeypatch.setattr(products, "bf16_support", lambda: "the lab's kernel, for this comparison")
    engine = ExactEngine(tiny_target(5).to(torch.bfloat16))
    g = torch.Generator().manual_seed(0)
    prompt = engine.forward(torch.randint(0, 49152, (37,), generator=g), hidden_layers=(0, 1, 2))
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]])
    scored = engine.forward(torch.randint(0, 49152, (5,), generator=g), mask=tree,
                            positions=torch.tensor([37, 38, 38, 39, 39]), hidden_layers=(1, 2))
    return [prompt.logits, *prompt.hidden.values(), scored.logits, *scored.hidden.values()]


@needs_clang
def test_clang_without_openmp_computes_the_gcc_builds_bits(monkeypatch):
    signatures = products.SIGNATURES
    gcc = build.compile_library(products.SOURCE, signatures, compiler="gcc")
    clang = build.compile_library(products.SOURCE, signatures, compiler="clang", openmp=False)
    assert build.openmp_flags(build.find_compiler("gcc"))  # the comparison is across the threading too
    with_gcc, with_clang = forward_bits(monkeypatch, gcc), forward_bits(monkeypatch, clang)
    assert all(torch.equal(a, b) for a, b in zip(with_gcc, with_clang))
    assert len(with_gcc) == 7 and with_gcc[0].abs().sum() > 0


def test_the_build_turns_contraction_off(tmp_path):
    """gcc's default (-ffp-contract=fast) fuses a multiply and an add into one rounding where clang's does not."""
    command = build.build_command(products.SOURCE, tmp_path / "x.so", build.find_compiler())
    assert "-ffp-contract=off" in command


def test_the_build_command_has_no_x86_only_flag_elsewhere(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    command = build.build_command(Path("x.c"), Path("x.so"), build.find_compiler(), openmp=False)
    assert "-mcpu=native" in command and not any(flag.startswith(("-march", "-mavx")) for flag in command)
    assert build.arch_flags("x86-64-v3") == ["-march=x86-64-v3"]
