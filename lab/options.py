"""Options written once: a command's or trainer's options are one dataclass of `opt(default, "help")`
fields, whose names give the flags (`max_new_tokens` -> `--max-new-tokens`) and whose annotations the
parsing (`bool` a switch). `add_options` makes the flags, `from_args` the dataclass back.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from typing import Any


def opt(default: Any, help: str, *, choices: tuple | list | None = None, positional: bool = False,
        nargs: str | None = None, parse: Callable[[str], Any] | None = None, metavar: str | None = None,
        required: bool = False) -> Any:
    """A dataclass field carrying what its command-line flag needs."""
    meta = {"help": help, "choices": choices, "positional": positional, "nargs": nargs, "parse": parse,
            "metavar": metavar, "required": required or None}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _parser_of(annotation: Any) -> Callable[[str], Any] | None:
    """int, float or str from an annotation such as `int | None` (None for a switch)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = args[0]
    if kind is bool:
        return None
    return kind if kind in (int, float) else str


def add_options(parser: argparse.ArgumentParser, cls: type) -> argparse.ArgumentParser:
    """Every field of the dataclass `cls` as an argument of `parser`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta, default = f.metadata, (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        parse = meta.get("parse") or _parser_of(hints[f.name])
        extra = {k: meta[k] for k in ("choices", "nargs", "metavar", "required") if meta.get(k) is not None}
        shown = meta["help"] + (f" (default {default})" if default not in (None, False, "", []) else "")
        if meta.get("positional"):
            parser.add_argument(f.name, type=parse, default=default, help=shown, **extra)
        elif parse is None:
            parser.add_argument("--" + f.name.replace("_", "-"), action="store_true", help=shown)
        else:
            parser.add_argument("--" + f.name.replace("_", "-"), type=parse, default=default, help=shown, **extra)
    return parser


def from_args(cls: type, args: argparse.Namespace) -> Any:
    """The dataclass `cls` from parsed arguments (fields only; other attributes are left out)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def recorded(options: Any) -> dict:
    """The options as a manifest records them: every field, by name."""
    return dataclasses.asdict(options)


def flags(options: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The command-line arguments that give `options` back: each field that differs from its
    default (positional ones always), less the fields named in `skip`."""
    words = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name in skip or (value == default and not f.metadata.get("positional")):
            continue
        text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
        if f.metadata.get("positional"):
            words.append(text)
        elif isinstance(value, bool):
            words.append("--" + f.name.replace("_", "-"))
        else:
            words += ["--" + f.name.replace("_", "-"), text]
    return words
