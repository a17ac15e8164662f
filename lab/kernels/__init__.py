"""Triton kernels for verification: the rules of lab/verify/lossless.py on the same explicit random
inputs, bit for bit. Nothing here imports transformers, so it runs on a GPU machine's own Python; on
a CPU set TRITON_INTERPRET=1 before importing it."""
import importlib.util

if importlib.util.find_spec("triton") is None:  # its wheels are Linux-only (pyproject.toml's marker)
    raise ImportError("lab.kernels needs Triton, which installs on Linux only: run chapter 09 on Linux, or in WSL2 "
                      "on Windows (`python -m lab doctor` says what this machine has)")

from .chain import verify_chain_batched, verify_chain_greedy_batched
from .tree import verify_tree_batched, verify_tree_greedy_batched

__all__ = ["verify_chain_batched", "verify_chain_greedy_batched", "verify_tree_batched", "verify_tree_greedy_batched"]
