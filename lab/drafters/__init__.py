"""Drafters: what proposes tokens for the target to verify, one module each.

A drafter has two methods:
  * propose(context, k, sampling, rng) -> (draft tokens, q) where q [k, V] holds the
    probabilities the drafts were sampled from (None when drafts are one-hot, e.g. greedy),
    or a `DraftTree` of deterministic top-k children (at most k deep);
  * commit(context, features) after prefill and after each verification, with the full
    accepted context, so the drafter can keep its own cache consistent; `features` holds the
    target's hidden states (the layers in the drafter's `feature_layers`, if it has any) at
    the positions the target has just scored.
A drafter may also have observe(proposal, logits), called after each verification with the
target's logits at every node it proposed (Lookahead learns n-grams from its window's nodes).
AR decoding is simply the drafter that proposes nothing.

  model.py        NoDraft (AR), ModelDraft and TreeModelDraft (a small LM as a chain or a tree)
  eagle1.py       the EAGLE-1 head (and notebook 04's variants): features and the next token -> the next feature
  eagle3.py       the EAGLE-3 head: three fused taps -> tokens, and the serving engines' file layout
  heads.py        any head's file: one save, one load (the kind read from the file), its manifest
  eagle_draft.py  EagleDraft: either head as a static or dynamic tree, or its top-1 chain
  lookahead.py    Lookahead: a Jacobi window scored beside the drafts, and the n-grams it yields
  lookup.py       PromptLookup: drafts copied from the context (prompt lookup), a chain or a tree
  reference.py    ReferenceDraft: a known text as drafts (Judge Decoding's expert drafts; tests)
"""
from .eagle_draft import EagleDraft, draft_vocabulary, static_shape, static_tree
from .lookahead import Lookahead
from .lookup import PromptLookup
from .model import ModelDraft, NoDraft, TreeModelDraft, frontier_mask
from .reference import ReferenceDraft

__all__ = ["EagleDraft", "Lookahead", "ModelDraft", "NoDraft", "PromptLookup", "ReferenceDraft", "TreeModelDraft",
           "draft_vocabulary", "frontier_mask", "static_shape", "static_tree"]
