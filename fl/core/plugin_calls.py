"""A plug-in's fault reported as that plug-in's: an exception raised inside a dataset, partition, client transform or
aggregator names the key that chose it, the file and line where it was raised, its type and its message, in one line
(exit 1: a fault in code, not in the config). A ConfigError a plug-in raises on purpose stays a configuration error
(exit 2), as the ones fl finds itself do."""
from __future__ import annotations

import contextlib
import inspect
import traceback

import fl.core.plugins as plugins


class UserError(Exception):
    """The base of errors whose message is already one line naming a mistake in the input (fl.config's
    ConfigError): raised inside a plug-in on purpose, it passes `blamed` unchanged."""


class PluginFault(RuntimeError):
    """A fault in a plug-in's code: an exception inside it, or a result that breaks its contract (exit 1)."""


def raised_at(err: BaseException, fn) -> str:
    """`path:line` where `err` was raised within `fn`'s file (the innermost such frame), else where `fn` is."""
    try:
        home = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        home = None
    frames = traceback.extract_tb(err.__traceback__)
    inside = [f for f in frames if home is not None and f.filename == home]
    if inside:
        return f"{plugins.short_path(inside[-1].filename)}:{inside[-1].lineno}"
    return plugins.code_location(fn)


@contextlib.contextmanager
def blamed(key: str, name: str, fn):
    """Around a call into plug-in `fn`, chosen by `key=name`: an exception it raises becomes a PluginFault naming
    it. A UserError such as ConfigError (the plug-in's own word on the config) and PluginFault pass unchanged."""
    try:
        yield
    except (UserError, PluginFault):
        raise
    except Exception as err:
        message = (str(err).splitlines() or [""])[0][:300]
        raise PluginFault(f"{key}={name!r} ({raised_at(err, fn)}) raised {type(err).__name__}"
                          + (f": {message}" if message else "")) from err
