"""Choosing an EAGLE tree for this machine (`python -m lab tune tree`): the cost model.

The chosen tree has the best predicted speed-up t_AR / t_spec, both sides built from the same
interleaved timings so that a machine drifting between measurements does not enter the ratio:

    t_AR   = p + T(1) + loop              t_spec = p + (T(n) + draft + commit + loop) / tau

p is prefill per new token; T(1) AR's unmasked forward and T(n) the tree-masked forward over n new
positions, made non-decreasing (`monotone`); draft the drafting time; commit the head's update with
the accepted tokens' features; loop the time per cycle outside the forward; tau the tokens per cycle.
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
