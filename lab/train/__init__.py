"""Training-side jobs: the regenerated training set, draft distillation, head and judge training."""
