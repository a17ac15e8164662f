"""The target model and its forwards: loading it and the drafts that share its embedding (`load`),
the KV-cached forward that scores many positions at once (`engine`, transformers: the float32
reference) and the batch-invariant bfloat16 forward (`exact`, its per-row arithmetic in C)."""
