"""One exception type for problems the user can fix; the CLI prints it as one line."""


class LabError(RuntimeError):
    """A clear, one-line, actionable error (missing wheel, unknown dataset, bad checkpoint...)."""
