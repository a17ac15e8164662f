"""Notebook 06's ablation: every compared pair differs in exactly its factor, as planned in the
registry and as recorded in the shipped manifests; the check can fail."""
import copy

import pytest

from lab import ablation
from lab.cli import build_parser
from lab.experiments import EXPERIMENTS
from lab.options import from_args
from lab.train.options import Eagle3Options


# head name prefix -> its experiment
EXPERIMENT = {"ablation": "eagle3-ablation", "lever": "eagle3-levers", "levers2": "eagle3-levers2"}
ALL_PAIRS = ablation.PAIRS + ablation.LEVER_PAIRS + ablation.LEVERS2_PAIRS


def planned_manifest(name: str) -> dict:
    """A manifest as the registry's command for `name` would record it: its options, and the
    manifest of the head it continues under init (what the trainer writes)."""
    steps = EXPERIMENTS[EXPERIMENT[name.split("-")[0]]].steps
    step = next(s for s in steps if s.out == f"data/eagle/{name}.json")
    args = build_parser().parse_args(step.commands[0].split())
    options = from_args(Eagle3Options, args)
    init = {"manifest": planned_manifest(options.init)} if options.init else None
    return {"options": vars(options), "init": init}


@pytest.mark.parametrize("a, b, factor", ALL_PAIRS)
def test_each_planned_pair_differs_in_its_factor_alone(a, b, factor):
    assert ablation.differences(planned_manifest(a), planned_manifest(b)) == set(factor.split("+"))


@pytest.mark.parametrize("a, b, factor", ALL_PAIRS)
def test_each_recorded_pair_differs_in_its_factor_alone(a, b, factor):
    manifests = ablation.manifests(((a, b, factor),))
    assert ablation.differences(manifests[a], manifests[b]) == set(factor.split("+"))


def test_table2_rows_and_fig4_neighbours_are_all_compared():
    compared = {(a, b) for a, b, _ in ablation.PAIRS}
    rows = [name for _, name in ablation.TABLE2]
    assert set(zip(rows, rows[1:])) <= compared
    fig4 = ablation.FIG4
    for objective in ("feature loss", "token loss only"):
        assert (fig4[(objective, "plain")], fig4[(objective, "TTT")]) in compared
    for stage in ("plain", "TTT"):
        assert (fig4[("feature loss", stage)], fig4[("token loss only", stage)]) in compared


def test_a_second_difference_is_caught_and_names_are_not_a_factor():
    a = planned_manifest("ablation-token-plain")
    b = copy.deepcopy(a)
    b["options"]["name"], b["options"]["resume"] = "another-name", not a["options"]["resume"]
    b["options"]["snapshot_every"] = 200  # saving the head along the way does not change the run
    assert ablation.differences(a, b) == set()
    b["init"]["manifest"]["options"]["lr"] = 5e-4  # a first stage trained at another rate
    b["options"]["feature_loss"] = 10.0
    assert ablation.differences(a, b) == {"lr", "feature_loss"}
    assert ablation.differences(a, planned_manifest("ablation-token-s1")) == {"stages"}


def test_cost_and_chain_tau_add_up_over_stages():
    first = {"steps": 400, "optimiser": {"batch_sequences": 8}, "cpu_budget_minutes": 3.0, "init": None}
    second = {"steps": 400, "optimiser": {"batch_sequences": 8}, "cpu_budget_minutes": 12.0,
              "init": {"manifest": first}}
    assert ablation.cost(second) == {"steps": 800, "sequence_draws": 6400, "cpu_minutes": 15.0,
                                     "cpu_minutes_by_stage": [3.0, 12.0]}
    assert ablation.chain_tau({"chain_acceptance_by_depth": {"rate": [0.5, 0.25, 0.125]}}) == 1.875


@pytest.mark.parametrize("experiment, pairs, tau_file", [("eagle3-ablation", ablation.PAIRS, "eagle3_ablation_tau"),
                                                         ("eagle3-levers", ablation.LEVER_PAIRS, "eagle3_levers_tau"),
                                                         ("eagle3-levers2", ablation.LEVERS2_PAIRS,
                                                          "eagle3_levers2_tau")])
def test_every_compared_head_is_a_run_experiment_and_ships_its_manifest(experiment, pairs, tau_file):
    outs = {step.out for step in EXPERIMENTS[experiment].steps}
    for name in ablation.manifests(pairs):
        assert f"data/eagle/{name}.json" in outs
    assert f"data/results/{tau_file}.json" in outs
