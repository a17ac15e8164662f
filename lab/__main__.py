"""`python -m lab ...`: the command line of lab/cli.py (`doctor` answers without importing it: seconds)."""
import sys

if sys.argv[1:] == ["doctor"]:
    from .doctor import report
    print(report())
    sys.exit(0)

from .cli import main  # noqa: E402

sys.exit(main())
