"""User-facing errors: the CLI prints their message and exits non-zero, without a traceback."""


class SpecbenchError(Exception):
    """A mistake in the user's input or environment, with a message that says what to do."""

    exit_code = 2
