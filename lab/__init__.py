"""The Speculative Decoding Lab: one decoding loop, many drafters, exact verification.

Modules are imported where used, so that light parts (`lab.kernels`) never pull in transformers."""
