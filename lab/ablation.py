"""Notebook 06's one-factor comparisons: how each head is trained (the (file, command) runs of the
experiments `eagle3-ablation`, `eagle3-levers`, `eagle3-levers2` and `eagle3-draws`, two stages of
`train eagle3` a head, then `tau`), the pairs the chapter compares and the options each pair may
differ in (`differences` checks it, at every stage), and what each head cost.
"""
from __future__ import annotations

from .drafters.heads import head_manifest, warm_start_chain

# The ablation: one trainer and head class, one schedule (400 plain steps, then 400 that are training-time
# test or plain); only the manifests ship (the weights stay where they were trained; `tau` reads them there).
ABLATION = "train eagle3 --max-steps 400 --heldout-every 25 --resume"
ABLATION_STAGE1 = {"feature": "--taps top --feature-loss 10", "token": "--taps top", "fused": "--taps fused"}
ABLATION_STAGE2 = {"feature-plain": ("feature", "--ttt-steps 1"), "token-plain": ("token", "--ttt-steps 1"),
                   "feature-ttt": ("feature", "--ttt-steps 7"), "token-ttt": ("token", "--ttt-steps 7"),
                   "fused-ttt": ("fused", "--ttt-steps 7")}
ABLATION_RUNS = (*((f"data/eagle/ablation-{first}-s1.json", f"{ABLATION} --name ablation-{first}-s1 --ttt-steps 1 "
                    f"{options}") for first, options in ABLATION_STAGE1.items()),
                 *((f"data/eagle/ablation-{name}.json", f"{ABLATION} --name ablation-{name} --init ablation-{first}-s1 "
                    f"{ABLATION_STAGE1[first]} {ttt}") for name, (first, ttt) in ABLATION_STAGE2.items()),
                 ("data/results/eagle3_ablation_tau.json", "tau " + " ".join(f"ablation-{n}" for n in ABLATION_STAGE2)
                  + " eagle3-full eagle1 --json data/results/eagle3_ablation_tau.json"))

# EAGLE-3's levers at a scale 2 cores train in an hour: a first stage of 200 plain steps, then 200 of
# training-time test of S steps; float32 products (a CPU without bfloat16 matrix instructions emulates
# bfloat16 autocast, several times slower). tau of each second stage at a depth-2 tree (the depth this
# CPU's tunings choose) and at the fixed tree.
LEVER = "train eagle3 --heldout-every 50 --resume --fp32"
TAU_TREES = (("_depth2", "2,4,6"), ("", "4,6,24"))


def _lever_runs(prefix: str, stage1: dict[str, str], stage2: dict[str, tuple[str, int, str]], tau: str) -> tuple:
    """stage1: name -> options; stage2: name -> (first stage, S, options); then data/results/TAU*.json."""
    heads = " ".join(f"{prefix}-{name}" for name in stage2)
    return (*((f"data/eagle/{prefix}-{name}.json", f"{LEVER} --max-steps 200 --ttt-steps 1 --name {prefix}-{name}"
               f"{options}") for name, options in stage1.items()),
            *((f"data/eagle/{prefix}-{name}.json", f"{LEVER} --max-steps 200 --ttt-steps {s} --name {prefix}-{name} "
               f"--init {prefix}-{first}{options}") for name, (first, s, options) in stage2.items()),
            *((f"data/results/{tau}{suffix}.json", f"tau {heads} --tree {tree} --json data/results/{tau}{suffix}.json")
              for suffix, tree in TAU_TREES))


# the first set: TTT as deep as the trees drafted on this CPU (2 steps against 7), then normed taps
LEVER_RUNS = _lever_runs("lever", {"s1": " --taps fused", "normed-s1": " --taps fused-normed"},
                         {"s7": ("s1", 7, " --taps fused"), "s2": ("s1", 2, " --taps fused"),
                          "normed-s2": ("normed-s1", 2, " --taps fused-normed")}, "eagle3_levers_tau")
# the second: a first stage with EAGLE-1's feature loss (then TTT without it), and ShareGPT's replies instead
# of the target's own answers as the TTT stage's text, beside a baseline trained with the same recipe
LEVERS2_RUNS = _lever_runs("levers2", {"s1": "", "feature-s1": " --feature-loss 10"},
                           {"s2": ("s1", 2, ""), "feature-s2": ("feature-s1", 2, ""),
                            "replies-s2": ("s1", 2, " --train-prompts 0 --replies 200000")},
                           "eagle3_levers2_tau")

# tau against sequence draws along one run per kind: 600 steps of 8 sequences, the head saved every 150; the
# shipped heads scored on the same positions
DRAWS_STEPS, DRAWS_EVERY = 600, 150
DRAWS = {"eagle3": "train eagle3 --ttt-steps 2 --fp32", "eagle1": "train eagle1"}
SHIPPED_HEADS = ("eagle1", "eagle3-full", "eagle1-gpu", "eagle3-gpu")  # where the long runs reached
DRAWS_HEADS = tuple(f"draws-{kind}-step{n}" for kind in DRAWS for n in range(DRAWS_EVERY, DRAWS_STEPS + 1, DRAWS_EVERY))
DRAWS_RUNS = (*((f"data/eagle/draws-{kind}.json", f"{command} --name draws-{kind} --max-steps {DRAWS_STEPS} "
                 f"--snapshot-every {DRAWS_EVERY} --eval-prompts 0") for kind, command in DRAWS.items()),
              ("data/results/eagle3_draws_tau.json", f"tau {' '.join(DRAWS_HEADS + SHIPPED_HEADS)} --tree 2,4,6 "
                                                     "--json data/results/eagle3_draws_tau.json"))

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
# the second set: the feature loss in the first stage alone; the TTT stage's text (two options name it)
LEVERS2_PAIRS = (("levers2-s2", "levers2-feature-s2", "feature_loss"),
                 ("levers2-s2", "levers2-replies-s2", "train_prompts+replies"))

# options that name or record a run rather than shape it: a head's own name, the head it continues, resuming,
# saving snapshots along the way
NOT_A_FACTOR = ("name", "init", "resume", "snapshot_every")


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
