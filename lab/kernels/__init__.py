"""Triton kernels for the verification step: the fast path for the rules in `lab/verify/lossless.py`.

They consume the same explicit random inputs as the reference and must agree with it bit for
bit. This package imports nothing from transformers, so it runs on a GPU machine's own Python.
On a CPU, set TRITON_INTERPRET=1 before importing it (tests/conftest.py does).
"""
from .chain import verify_chain_batched, verify_chain_greedy_batched
from .tree import verify_tree_batched, verify_tree_greedy_batched

__all__ = ["verify_chain_batched", "verify_chain_greedy_batched", "verify_tree_batched", "verify_tree_greedy_batched"]
