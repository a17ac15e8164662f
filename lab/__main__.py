"""Command line: `python -m lab {bench,generate,data,train} ...` (see --help of each)."""
from __future__ import annotations

import argparse
import sys

from .errors import LabError


def _data(args: argparse.Namespace) -> None:
    from .train.regen import DEFAULT_TOKENS, build
    print(build(tokens=args.tokens or DEFAULT_TOKENS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="build the regenerated ShareGPT training set")
    data.add_argument("action", choices=["build"])
    data.add_argument("--tokens", type=int, default=None,
                      help="training response tokens to reach (default 150000, about 20 minutes on 2 cores)")
    data.set_defaults(run=_data)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
