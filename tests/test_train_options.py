"""`python -m lab train WHAT`: every recorded training command still parses, into the options the
run had (one check over all of them, naming each that fails); each trainer's flags come from its
options dataclass."""
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from lab.cli import build_parser
from lab.errors import LabError
from lab.experiments import EXPERIMENTS
from lab.options import from_args
from lab.train.options import TRAINERS, DraftOptions, Eagle1Options, Eagle3Options, JudgeOptions

DATA = Path(__file__).resolve().parent.parent / "data"
RECORDED = re.compile(r'"command": "python -m lab (train [^"]*)"')


def recorded_commands(data: Path = DATA) -> list[str]:
    """Every `train ...` command a manifest under `data` records or an experiment runs."""
    found = {m for path in data.rglob("*.json") for m in RECORDED.findall(path.read_text(errors="replace"))}
    found |= {c for e in EXPERIMENTS.values() for step in e.steps for c in step.commands if c.startswith("train ")}
    return sorted(found)


def parsed(command: str):
    args = build_parser().parse_args(shlex.split(command))
    return from_args(args.options, args)


def parse_problems(commands: list[str]) -> list[str]:
    """Every command that no longer parses (argparse's exit or the options' own refusal), or parses
    into another trainer's options."""
    found = []
    for command in commands:
        why = io.StringIO()
        try:
            with contextlib.redirect_stderr(why):  # argparse prints its reason, then exits
                options = parsed(command)
        except SystemExit:
            reason = (why.getvalue().strip().splitlines() or ["(argparse gave no reason)"])[-1]
            found.append(f"{command!r}: refused by the command line: {reason}")
            continue
        except LabError as error:
            found.append(f"{command!r}: {error}")
            continue
        expected = TRAINERS[command.split()[1]][0]
        if type(options) is not expected:
            found.append(f"{command!r}: parsed into {type(options).__name__}, not {expected.__name__}")
    return found


def test_there_are_recorded_commands_of_every_trainer():
    trainers = {c.split()[1] for c in recorded_commands()}
    assert trainers == set(TRAINERS), f"recorded: {sorted(trainers)}; trainers: {sorted(TRAINERS)}"


def test_every_recorded_train_command_parses():
    found = parse_problems(recorded_commands())
    assert not found, "\n".join(found)


def test_a_recorded_command_that_no_longer_parses_is_reported(tmp_path):
    # a manifest planted under a data folder of its own: found by recorded_commands, then reported
    bad = ["train eagle1 --ttt-steps 1", "train draft --no-such-flag 3", "train eagle3 --heldout-every -1"]
    for i, command in enumerate(bad):
        (tmp_path / f"head{i}.json").write_text(json.dumps({"command": f"python -m lab {command}"}))
    assert set(bad) <= set(recorded_commands(tmp_path))
    found = parse_problems(bad)  # the registry's own commands are parsed by the test above
    assert len(found) == len(bad), found
    for command in bad:
        assert any(p.startswith(repr(command)) for p in found), (command, found)
    assert any("unrecognized arguments: --no-such-flag 3" in p for p in found)
    assert any("--heldout-every must be 0" in p for p in found)


def test_recorded_commands_give_the_options_they_ran_with():
    assert parsed("train draft --layers 2 --minutes 6") == DraftOptions(layers=2)
    assert parsed("train eagle1 --init eagle1 --replies 400000 --minutes 45 --lr 5e-4") == Eagle1Options(
        init="eagle1", replies=400000, minutes=45.0, lr=5e-4)
    assert parsed("train eagle3 --fp32 --resume --name eagle3-s1 --ttt-steps 1 --max-steps 400 --taps top "
                  "--feature-loss 10") == Eagle3Options(
        name="eagle3-s1", ttt_steps=1, max_steps=400, taps="top", feature_loss=10.0, fp32=True, resume=True)
    assert parsed("train judge --mined 131 --mine-with draft,eagle1 --with-logits --out data/judge/x.json") == \
        JudgeOptions(mined=131, mine_with="draft,eagle1", with_logits=True, out="data/judge/x.json")


def test_the_defaults_are_each_trainers_own():
    budgets = {what: (parsed(f"train {what}").minutes, parsed(f"train {what}").lr)
               for what in ("draft", "eagle1", "eagle3")}
    assert budgets == {"draft": (6.0, 2e-3), "eagle1": (30.0, 1e-3), "eagle3": (60.0, 1e-3)}
    assert parsed("train eagle3").device == parsed("train eagle1").device == "cpu"


def test_a_flag_of_another_trainer_or_contradictory_options_are_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "eagle1", "--ttt-steps", "1"])
    with pytest.raises(LabError, match="--heldout-every must be 0"):
        parsed("train eagle3 --heldout-every -1")
