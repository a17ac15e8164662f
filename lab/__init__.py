"""The Speculative Decoding Lab: one decoding loop, many drafters, exact verification.

Modules are imported where used (e.g. `from lab.decode import decode`) so that light parts,
such as `lab.kernels`, never pull in transformers."""
