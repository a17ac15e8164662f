"""Drafters: what proposes tokens for the target to verify, one module each.

A drafter has two methods:
  * propose(context, k, sampling, rng) -> (draft tokens, q) where q [k, V] holds the
    probabilities the drafts were sampled from (None when drafts are one-hot, e.g. greedy),
    or a `DraftTree` of deterministic top-k children (at most k deep);
  * commit(context, features) after prefill and after each verification, with the full
    accepted context, so the drafter can keep its own cache consistent; `features` holds the
    target's hidden states (the layers in the drafter's `feature_layers`, if it has any) at
    the positions the target has just scored.
AR decoding is simply the drafter that proposes nothing.

  model.py   NoDraft (AR), ModelDraft and TreeModelDraft (a small LM as a chain or a tree)
  eagle.py   EagleDraft: a feature-level head (EAGLE-1's or EAGLE-3's) as a static or dynamic tree
  reference.py  ReferenceDraft: a known text as drafts (Judge Decoding's expert drafts; tests)
"""
from .eagle import EagleDraft, draft_vocabulary, static_shape, static_tree
from .model import ModelDraft, NoDraft, TreeModelDraft, frontier_mask
from .reference import ReferenceDraft

__all__ = ["EagleDraft", "ModelDraft", "NoDraft", "ReferenceDraft", "TreeModelDraft", "draft_vocabulary",
           "frontier_mask", "static_shape", "static_tree"]
