"""Drafters: what proposes tokens for the target to verify, one module each. A drafter has a `name`
and the methods lab/decode.py calls:
  * begin(prompt) before each prompt;
  * propose(context, k, sampling, rng) -> (draft tokens, q), q [k, V] the probabilities the drafts
    were sampled from (None for one-hot drafts, e.g. greedy), or a `DraftTree` of deterministic
    top-k children whose candidate nodes are at most k deep;
  * commit(context, features) after prefill and after each verification, with the accepted context
    and the target's hidden states (its `feature_layers`, if any) at the positions just scored;
  * optionally observe(proposal, logits) after each verification, with the target's logits at every
    scored node (Lookahead learns n-grams from its window).
AR decoding is the drafter that proposes nothing."""
from .eagle_draft import EagleDraft, draft_vocabulary, static_shape, static_tree
from .lookahead import Lookahead
from .lookup import PromptLookup
from .model import ModelDraft, NoDraft, TreeModelDraft, frontier_mask
from .reference import ReferenceDraft

__all__ = ["EagleDraft", "Lookahead", "ModelDraft", "NoDraft", "PromptLookup", "ReferenceDraft", "TreeModelDraft",
           "draft_vocabulary", "frontier_mask", "static_shape", "static_tree"]
