"""The target model and its forwards: loading it (and the draft models that share its embedding)
from the offline wheels (`load`), the forward with a KV cache that scores many positions at once
(`engine`: transformers, the float32 reference), and the batch-invariant bfloat16 forward whose
per-row arithmetic lives in C (`exact`, `csrc/exact_ops.c`)."""
