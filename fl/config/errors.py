"""The one error type of bad input."""


class ConfigError(ValueError):
    """A configuration mistake; the message is one line meant for the user (exit code 2)."""
