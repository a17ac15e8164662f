"""Notebook 06's one-factor comparisons: the five heads `python -m lab run eagle3-ablation` trains and
the three of `python -m lab run eagle3-levers` (two stages of `train eagle3` each), the pairs the
chapter compares and the one option each pair may differ in (`differences` checks it, at every
stage), and what each head cost.
"""
from __future__ import annotations

from .drafters.heads import head_manifest, warm_start_chain

# (objective, second stage) -> head: the paper's Fig. 4 as a 2 x 2, all on the top tap
FIG4 = {("feature loss", "plain"): "ablation-feature-plain", ("feature loss", "TTT"): "ablation-feature-ttt",
        ("token loss only", "plain"): "ablation-token-plain", ("token loss only", "TTT"): "ablation-token-ttt"}

# the paper's Table 2, one change a row; the first row is EAGLE-2's objective in EAGLE-3's head class
TABLE2 = (("feature loss, no TTT", "ablation-feature-plain"),
          ("no feature loss", "ablation-token-plain"),
          ("+ training-time test", "ablation-token-ttt"),
          ("+ three fused taps", "ablation-fused-ttt"))

# The paper's rows beside ours (LLaMA-3.1-8B, MT-Bench, T = 0: tau, speed-up; ../shared/REFERENCE.md):
# its "remove the feature constraint" row already trains with TTT, so our second row has no partner.
PAPER_TABLE2 = {"feature loss, no TTT": ("EAGLE-2", 4.05, 3.16), "no feature loss": None,
                "+ training-time test": ("+ remove feature constraint", 5.37, 3.82),
                "+ three fused taps": ("+ fused features (EAGLE-3)", 6.13, 4.40)}

# (head a, head b, the one recorded option they differ in)
PAIRS = (("ablation-feature-plain", "ablation-token-plain", "feature_loss"),
         ("ablation-feature-ttt", "ablation-token-ttt", "feature_loss"),
         ("ablation-feature-plain", "ablation-feature-ttt", "ttt_steps"),
         ("ablation-token-plain", "ablation-token-ttt", "ttt_steps"),
         ("ablation-token-ttt", "ablation-fused-ttt", "taps"))

# EAGLE-3's levers, small (experiment eagle3-levers): training-time test as deep as the trees drafted on
# this CPU (2 steps against 7, from the same first stage), then each tap RMS-normalised before the fusion
LEVER_PAIRS = (("lever-s7", "lever-s2", "ttt_steps"),
               ("lever-s2", "lever-normed-s2", "taps"))

# options that name a run rather than shape it: a head's own name, the head it continues, resuming
NOT_A_FACTOR = ("name", "init", "resume")


def recipe(manifest: dict) -> list[dict]:
    """The recorded options of every stage of a head, first stage first, without `NOT_A_FACTOR`."""
    return [{k: v for k, v in m["options"].items() if k not in NOT_A_FACTOR}
            for m in reversed(warm_start_chain(manifest))]


def differences(a: dict, b: dict) -> set[str]:
    """The options in which two heads' recipes differ at any stage ({"stages"} if their stages differ)."""
    ra, rb = recipe(a), recipe(b)
    if len(ra) != len(rb):
        return {"stages"}
    return {k for sa, sb in zip(ra, rb) for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)}


def cost(manifest: dict) -> dict:
    """Steps, sequence draws and CPU-minutes of a head, in all and by stage (first stage first)."""
    chain = list(reversed(warm_start_chain(manifest)))
    minutes = [m.get("cpu_budget_minutes", 0.0) for m in chain]
    return {"steps": sum(m["steps"] for m in chain),
            "sequence_draws": sum(m["steps"] * m["optimiser"]["batch_sequences"] for m in chain),
            "cpu_minutes": sum(minutes), "cpu_minutes_by_stage": minutes}


def verdicts(manifest: dict) -> list[str]:
    """Each stage's verdict on its validation curve (lab.train.loop.converged), first stage first."""
    out = []
    for m in reversed(warm_start_chain(manifest)):
        v = m.get("validation_loss")
        out.append("not tracked" if v is None else f"{v['verdict']} ({v['relative_change']:.1%})")
    return out


def chain_tau(evaluation: dict) -> float:
    """Tokens per target forward of a chain of the evaluated depths: 1 + sum_d P(depths 1..d right)."""
    return 1.0 + sum(evaluation["chain_acceptance_by_depth"]["rate"])


def manifests(pairs: tuple = PAIRS) -> dict[str, dict]:
    """The manifest of every head in `pairs`, by name (for the ablation: Fig. 4's four, then the fused head)."""
    names = dict.fromkeys(name for a, b, _ in pairs for name in (a, b))
    return {name: head_manifest(name) for name in names}
