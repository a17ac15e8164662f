"""Training-side jobs: regenerating the training set with the target, distilling drafts."""
