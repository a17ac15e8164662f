"""lab.options: a dataclass of options becomes a command line and comes back whole."""
import argparse
from dataclasses import dataclass

import pytest

from lab.options import add_options, from_args, opt, recorded


@dataclass
class Example:
    name: str = opt("eagle1", "which head", positional=True, nargs="?")
    max_new_tokens: int = opt(128, "tokens to write")
    lr: float | None = opt(None, "learning rate")
    dtype: str = opt("float32", "the target's dtype", choices=["float32", "bfloat16"])
    fp32: bool = opt(False, "a switch")
    names: list = opt([], "several", nargs="*")


def parser() -> argparse.ArgumentParser:
    return add_options(argparse.ArgumentParser(prog="t", exit_on_error=False), Example)


def test_flags_come_from_the_field_names_types_and_defaults():
    args = parser().parse_args(["eagle3", "--max-new-tokens", "64", "--lr", "5e-4", "--fp32",
                                "--dtype", "bfloat16", "--names", "a", "b"])
    assert from_args(Example, args) == Example("eagle3", 64, 5e-4, "bfloat16", True, ["a", "b"])


def test_defaults_are_the_dataclass_defaults_and_are_recorded_whole():
    options = from_args(Example, parser().parse_args([]))
    assert options == Example()
    assert recorded(options) == {"name": "eagle1", "max_new_tokens": 128, "lr": None, "dtype": "float32",
                                 "fp32": False, "names": []}


def test_a_wrong_choice_or_type_is_refused_and_help_shows_the_default():
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parser().parse_args(["--dtype", "float16"])
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parser().parse_args(["--max-new-tokens", "many"])
    assert "(default 128)" in parser().format_help()
