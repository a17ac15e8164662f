"""Notebook 06's ablation: every compared pair differs in exactly its factor, as planned in the
registry and as recorded in the shipped manifests; the check can fail. Each check loops over every
pair (or head) and names every offender in one message."""
import copy
import json
from collections.abc import Callable

from lab import ablation
from lab.cli import build_parser
from lab.drafters.heads import head_manifest
from lab.errors import LabError
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


def pair_problems(pairs: tuple, manifest_of: Callable[[str], dict]) -> list[str]:
    """Every pair whose heads (manifests from `manifest_of`) differ in more or less than its factor,
    or whose head has no manifest to compare."""
    found = []
    for a, b, factor in pairs:
        try:
            differ = ablation.differences(manifest_of(a), manifest_of(b))
        except (LabError, KeyError, StopIteration, FileNotFoundError) as error:  # not planned, or not shipped
            found.append(f"{a} vs {b}: no manifest to compare ({type(error).__name__}: {error})")
            continue
        if differ != set(factor.split("+")):
            found.append(f"{a} vs {b}: differ in {sorted(differ)}, not in {factor} alone")
    return found


def test_each_planned_pair_differs_in_its_factor_alone():
    found = pair_problems(ALL_PAIRS, planned_manifest)
    assert not found, "\n".join(found)


def test_each_recorded_pair_differs_in_its_factor_alone():
    # the manifests the trainer wrote, as notebook 06 reads them (ablation.manifests reads each so)
    found = pair_problems(ALL_PAIRS, head_manifest)
    assert not found, "\n".join(found)


def test_a_pair_that_differs_in_another_factor_or_lacks_a_manifest_is_reported(tmp_path):
    # planned: a pair filed under the wrong factor, and a head no experiment plans
    wrong = (("ablation-token-plain", "ablation-token-ttt", "feature_loss"),
             ("ablation-token-plain", "ablation-nowhere", "taps"))
    found = pair_problems(wrong, planned_manifest)
    assert len(found) == 2, found
    assert "differ in ['ttt_steps'], not in feature_loss alone" in found[0]
    assert "ablation-nowhere: no manifest" in found[1]
    # recorded: copies of two shipped manifests under tmp_path, the second trained at another rate too
    for name in ("ablation-token-plain", "ablation-token-ttt"):
        (tmp_path / f"{name}.json").write_text(json.dumps(head_manifest(name)))
    changed = json.loads((tmp_path / "ablation-token-ttt.json").read_text())
    changed["options"]["lr"] = 5e-4
    (tmp_path / "ablation-token-ttt.json").write_text(json.dumps(changed))
    found = pair_problems(wrong, lambda name: json.loads((tmp_path / f"{name}.json").read_text()))
    assert len(found) == 2, found
    assert "differ in ['lr', 'ttt_steps'], not in feature_loss alone" in found[0]
    assert "ablation-nowhere: no manifest" in found[1]


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


# each experiment of the comparison, its pairs, and the tau file it writes
GROUPS = (("eagle3-ablation", ablation.PAIRS, "eagle3_ablation_tau"),
          ("eagle3-levers", ablation.LEVER_PAIRS, "eagle3_levers_tau"),
          ("eagle3-levers2", ablation.LEVERS2_PAIRS, "eagle3_levers2_tau"))


def test_every_compared_head_is_a_run_experiment_and_ships_its_manifest():
    found = []
    for experiment, pairs, tau_file in GROUPS:
        outs = {step.out for step in EXPERIMENTS[experiment].steps}
        names = list(dict.fromkeys(name for a, b, _ in pairs for name in (a, b)))
        shipped = True
        for name in names:
            if f"data/eagle/{name}.json" not in outs:
                found.append(f"{name}: compared, but experiment {experiment} does not make it")
            try:
                head_manifest(name)
            except LabError as error:
                found.append(f"{name}: {error}")
                shipped = False
        # and the reader notebook 06 calls gives every compared head (it stops at the first missing one)
        if shipped and list(ablation.manifests(pairs)) != names:
            found.append(f"{experiment}: ablation.manifests gives {list(ablation.manifests(pairs))}, not {names}")
        if f"data/results/{tau_file}.json" not in outs:
            found.append(f"{experiment}: does not write data/results/{tau_file}.json")
    assert not found, "\n".join(found)
