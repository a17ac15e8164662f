"""The experiment registry behind `python -m lab run`: every result file can be rerun, by the
experiment that lists it or by the command recorded inside it, and that command writes that very
file (one check over every file, naming each that fails); a step whose file exists is skipped;
unknown names are one-line errors."""
import json
from pathlib import Path

import pytest

from lab.cli import main
from lab.errors import LabError
from lab.experiments import EXPERIMENTS, Experiment, Step, experiment_of, recorded_command, run
from lab.paths import ROOT

RESULTS = sorted((ROOT / "data" / "results").glob("*.json"))


def rerun_problems(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Every result file (under `root`) that cannot be rerun: the experiment that lists it does not
    hold the step that makes it, or it records no command, or a command that writes another file."""
    found = []
    for path in paths:
        relative = path.relative_to(root).as_posix()
        made_by = experiment_of(relative)
        if made_by:
            name, step = made_by
            if step not in EXPERIMENTS[name].steps or step.out != relative:
                found.append(f"{relative}: experiment {name} does not hold the step that makes it")
            continue
        try:
            command = recorded_command(path)
        except LabError as error:  # no command recorded and no experiment makes it
            found.append(f"{relative}: {error}")
            continue
        if command != json.loads(path.read_text())["command"]:
            found.append(f"{relative}: recorded_command gives {command!r}, not the command inside the file")
        if f"--json {relative}" not in command:
            found.append(f"{relative}: records a command that writes another file: {command!r}")
    return found


def test_every_result_file_reruns_by_its_experiment_or_its_recorded_command():
    assert RESULTS, "no result files under data/results"
    found = rerun_problems(RESULTS)
    assert not found, "\n".join(found)


def test_a_result_file_that_cannot_be_rerun_is_reported(tmp_path):
    # copies of a real result kept by its recorded command alone, under names no experiment lists
    real = next(p for p in RESULTS if experiment_of(p.relative_to(ROOT).as_posix()) is None)
    record = json.loads(real.read_text())
    results = tmp_path / "data" / "results"
    results.mkdir(parents=True)
    planted = {"elsewhere.json": {**record, "command": record["command"] + " --json data/results/other.json"},
               "silent.json": {k: v for k, v in record.items() if k != "command"},
               "good.json": {**record, "command": "bench --json data/results/good.json"}}
    for name, content in planted.items():
        (results / name).write_text(json.dumps(content))
    found = rerun_problems(sorted(results.glob("*.json")), root=tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("data/results/elsewhere.json: records a command that writes another file")
    assert found[1].startswith("data/results/silent.json:") and "records no command" in found[1]


def test_the_command_line_lists_and_dry_runs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["run", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in EXPERIMENTS)
    assert main(["run", "--rerun", "data/results/bench_eagle_tree24.json", "--dry-run"]) == 0
    assert "--json data/results/bench_eagle_tree24.json" in capsys.readouterr().out
    assert main(["run", "no-such-experiment"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--list" in err


def test_a_step_whose_file_exists_is_skipped_and_force_redoes_it(monkeypatch, tmp_path):
    import lab.experiments as experiments
    monkeypatch.setattr(experiments, "ROOT", tmp_path)
    (tmp_path / "made.json").write_text("{}")
    monkeypatch.setitem(EXPERIMENTS, "toy", Experiment("a toy", 1, (
        Step(("bench --x",), "made.json"), Step(("bench --y",), "missing.json"),
        Step(("quality",), "made.json", resumes=True))))
    assert run("toy", dry_run=True) == ["python -m lab bench --y", "python -m lab quality"]
    assert run("toy", force=True, dry_run=True) == ["python -m lab bench --x", "python -m lab bench --y",
                                                    "python -m lab quality"]
    with pytest.raises(LabError, match="run --list"):
        run("nope")


def test_the_runner_stamps_the_experiment_into_what_each_step_made(monkeypatch, tmp_path):
    import json

    import lab.experiments as experiments
    monkeypatch.setattr(experiments, "ROOT", tmp_path)
    made = []

    def fake_run(command, cwd, check):  # each step "makes" its file, as a trainer writes a head and its manifest
        out = {"head": "h.safetensors", "result": "r.json"}[command[-1]]
        (tmp_path / out).write_text("weights")
        (tmp_path / out).with_suffix(".json").write_text(json.dumps({"command": command[-1]}))
        made.append(out)

    monkeypatch.setattr(experiments.subprocess, "run", fake_run)
    monkeypatch.setitem(EXPERIMENTS, "toy", Experiment("a toy", 1, (Step(("head",), "h.safetensors"),
                                                                     Step(("result",), "r.json"))))
    run("toy")
    assert made == ["h.safetensors", "r.json"]
    for name, command in (("h.json", "head"), ("r.json", "result")):
        assert json.loads((tmp_path / name).read_text()) == {"command": command, "experiment": "toy"}
    (tmp_path / "h.json").write_text(json.dumps({"command": "head"}))  # made before the runner stamped
    run("toy")  # both steps skipped, and the unstamped manifest stamped
    assert made == ["h.safetensors", "r.json"]
    assert json.loads((tmp_path / "h.json").read_text())["experiment"] == "toy"


def test_every_step_of_the_registry_names_a_file_under_data_or_figures():
    for name, experiment in EXPERIMENTS.items():
        assert experiment.steps and experiment.minutes > 0, name
        for step in experiment.steps:
            assert step.out.startswith(("data/", "figures/")) and step.commands, (name, step)
