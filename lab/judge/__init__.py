"""Judge Decoding (Bachmann et al., ICLR 2025) at the lab's scale: token labels from planted
errors, linear probes on the target's hidden states, the judge head, and the sweep that
measures what the lossy rules cost in answers.

Standard verification rejects a draft token merely because the target would have said something
else. The paper's observation: the target's own embedding of a token says whether the token is
*wrong* in context, which is a different question. A linear head on that embedding ("correct in
context?") is OR-ed with standard verification; the output is no longer the target's, so quality
has to be measured (`sweep`: answers checked by a program, `tasks`, HumanEval's in a sandbox, `sandbox`).

Labels come from correct answers with one error planted automatically (`label_tokens`): tokens
before the first changed token are correct, the changed token is wrong, what follows is ignored;
and from real draft mismatches whose effect on a checked answer was tried (both in `labels`); the
probe and the head's file are `probe`; the rules themselves are lab/verify/lossy.py.
"""
