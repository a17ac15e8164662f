"""Choosing an EAGLE tree for this machine (`python -m lab tune tree`): the cost model.

The chosen tree has the best predicted speed-up t_AR / t_spec, both sides built from the same
kind of timings, so that a machine drifting between measurements does not enter the ratio:

    t_AR   = p + T(1) + loop              t_spec = p + (T(n) + draft + commit + loop) / tau

p is prefill per new token (paid once per answer, not per cycle); T(1) AR's own unmasked forward
and T(n) the tree-masked forward over n positions after a cached prefix, each the fastest of
interleaved rounds, T(n) made non-decreasing (`monotone`); draft the wall time of drafting the
tree; commit the head's update with the accepted tokens' true features, timed right after a
target forward as decoding runs it; loop the time per cycle outside the target's forward; tau
the mean tokens per cycle.

- `costs`: the T(n) rounds and curve, the verification pass a commit is timed after, the
  predicted speed-ups (one sequence, a batch).
- `tau`: tau counted on the target's own greedy continuations without its tree forward (greedy
  verification of a tree is a walk along the continuation): screened at uniform roots
  (`measure_trees`), then walked cycle by cycle as decoding does (`walk_tau`).
- `choice`: `tune`, the choice files it writes (each with its CPU's fingerprint) and their readers;
  `tree_for_machine`, the tree decoding uses on this machine.
"""
from .choice import (CHOICE_PATH, WALKED, TreeChoice, choice_path, choice_row, dtype_name, given_tree, load_choice,
                     machine_tuning, medusa_tree, quick_tune, tree_for_machine, tune, tuned_cycle_costs,
                     tuning_cache_path)
from .costs import (SPREAD_TOLERANCE, agreeing_rounds, batch_speedups, monotone, predicted_speedup, spread,
                    verification_pass)
from .tau import (DEPTHS, GREEDY, SIZES, TOP_KS, Continuation, draft_positions, greedy_continuations, measure_trees,
                  node_outcomes, tau_at_tree, walk_tau)

__all__ = ["CHOICE_PATH", "DEPTHS", "GREEDY", "SIZES", "SPREAD_TOLERANCE", "TOP_KS", "WALKED", "Continuation",
           "TreeChoice", "agreeing_rounds", "batch_speedups", "choice_path", "choice_row", "draft_positions",
           "dtype_name", "given_tree", "greedy_continuations", "load_choice", "machine_tuning", "measure_trees",
           "medusa_tree", "monotone", "node_outcomes", "predicted_speedup", "quick_tune", "spread", "tau_at_tree",
           "tree_for_machine", "tune", "tuned_cycle_costs", "tuning_cache_path", "verification_pass", "walk_tau"]
