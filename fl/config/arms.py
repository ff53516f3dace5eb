"""Sweep arms on the command line: `arm=NAME arms.NAME='key=value ...' arms.OTHER='...'`.

A sweep file may list arms (fl/sweep/spec.py): each a method with its own overrides, crossed with the shared grid
and seeds. W&B's sweep engine sees one categorical parameter, `arm`, and one constant per arm, `arms.<name>`, whose
value is that arm's overrides as one string; its agent passes all of them to `fl.train` (`${args_no_hyphens}`).
Here they become the chosen arm's overrides, in the place `arm=` had, and the other arms' definitions are dropped.
"""
from __future__ import annotations

import shlex

from fl.config.errors import ConfigError

ARM = "arm"
ARMS = "arms."


def arm_overrides(name: str, text: str) -> list[str]:
    """The `key=value` overrides of arm `name`, from its definition (shell words: quote a value with spaces)."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise ConfigError(f"arms.{name}={text!r}: {err}") from None
    if not words:
        raise ConfigError(f"arms.{name}: an arm needs at least one key=value override")
    for word in words:
        key, sep, _ = word.partition("=")
        if not sep or not key or key.startswith("-"):
            raise ConfigError(f"arms.{name}: {word!r} is not key=value (e.g. arms.{name}='method.name=fedavg "
                              "finetune.after_round=26')")
        if key in ("seed", ARM) or key.startswith((ARMS, "logger.")):
            raise ConfigError(f"arms.{name}: an arm may not set {key} (seeds and logging belong to the sweep)")
    return words


def expand_arms(argv: list[str]) -> list[str]:
    """`argv` with `arm=NAME` replaced, in place, by the overrides of `arms.NAME=...`, and every `arms.*` argument
    removed. Without `arm=` and `arms.*` it is `argv` unchanged."""
    chosen = [a.split("=", 1)[1] for a in argv if a.lstrip("-").startswith(f"{ARM}=")]
    defined = {}
    for a in argv:
        key, sep, value = a.lstrip("-").partition("=")
        if sep and key.startswith(ARMS):
            defined[key[len(ARMS):]] = value
    if not chosen and not defined:
        return list(argv)
    if len(chosen) != 1:
        raise ConfigError(f"arms.{', arms.'.join(sorted(defined))} given without arm=NAME" if not chosen
                          else f"arm= given {len(chosen)} times ({', '.join(chosen)}); give one")
    name = chosen[0]
    if name not in defined:
        known = ", ".join(sorted(defined)) or "none"
        raise ConfigError(f"arm={name!r} has no definition arms.{name}='key=value ...' among the arguments "
                          f"(defined: {known})")
    out = []
    for a in argv:
        key = a.lstrip("-").partition("=")[0]
        if key == ARM:
            out += arm_overrides(name, defined[name])
        elif not key.startswith(ARMS):
            out.append(a)
    return out
