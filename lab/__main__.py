"""`python -m lab ...`: the command line of lab/cli.py."""
import sys

from .cli import main

sys.exit(main())
