"""The one error type of bad input, and the message that names a bad choice."""
from __future__ import annotations

import difflib
from typing import Any

from fl.core.plugin_calls import UserError


class ConfigError(ValueError, UserError):
    """A configuration mistake; the message is one line meant for the user (exit code 2)."""


def suggest(word: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def choices_msg(key: str, value: Any, choices) -> str:
    choices = sorted(str(c) for c in choices)
    return f"{key}={value!r} is not valid{suggest(value, choices)}; choices: {', '.join(choices)}"
