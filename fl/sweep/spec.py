"""W&B sweep files (W&B's own format): parsing, validation, expansion into points, and generation.

The file is read with PyYAML, as `wandb sweep` reads it, so a file this module accepts means the same to
W&B. Every mistake raises `ConfigError` with one line naming the bad field.

Arms: a comparison gives each method its own settings (FedAvg-FT's finetune.after_round, FedAS's protocol keys)
as a categorical parameter `arm` naming the arm, and one constant parameter `arms.<name>` per arm holding its
overrides, e.g. `arms.fedavg_ft: {value: method.name=fedavg finetune.after_round=26}`. W&B crosses `arm` with the
other parameters and seeds and passes every parameter to fl.train, which puts the chosen arm's overrides where
`arm=` stood (fl/config/arms.py); offline, `Sweep.point_argv` does the same.
"""
from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from fl.config import ARM, ARMS, ConfigError, arm_overrides, load_config, search_spaces
from fl.config.errors import suggest
from fl.core import registry
from fl.core.metric_directions import GOALS as GOAL_OF
from fl.core.metric_directions import describe, lookup
from fl.core.run_metrics import run_directions
from fl.core.seeding import derive_seed
from fl.report.aliases import current_name
from fl.report.tables import DEFAULT_METRIC

METHODS = ("grid", "random", "bayes")
GOALS = ("maximize", "minimize")
ARG_MACROS = ("${args_no_hyphens}", "${args}", "${args_no_boolean_flags}")
IGNORED_MACROS = ("${env}", "${interpreter}", "${program}")
# distribution -> the keys it needs; W&B's names (https://docs.wandb.ai/guides/sweeps/sweep-config-keys)
DISTRIBUTIONS = {
    "constant": ("value",), "categorical": ("values",), "int_uniform": ("min", "max"),
    "uniform": ("min", "max"), "q_uniform": ("min", "max"), "log_uniform_values": ("min", "max"),
    "q_log_uniform_values": ("min", "max"), "inv_log_uniform_values": ("min", "max"),
    "log_uniform": ("min", "max"), "q_log_uniform": ("min", "max"), "normal": ("mu", "sigma"),
    "q_normal": ("mu", "sigma"), "log_normal": ("mu", "sigma"), "q_log_normal": ("mu", "sigma"),
}
SPEC_KEYS = {"values", "value", "distribution", "min", "max", "q", "mu", "sigma", "probabilities", "parameters"}


@dataclass
class Sweep:
    name: str
    method: str                      # grid or random (bayes runs as random offline)
    requested_method: str
    metric: Optional[str]
    goal: str
    fixed_args: list[str]            # literal fl.train arguments of the command, e.g. conf=NAME
    params: dict[str, dict]          # flattened parameter name -> spec (seed and arm included if the file has them)
    run_cap: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    arms: dict[str, list[str]] = field(default_factory=dict)  # arm name -> its overrides (the arms.<name> constants)

    def point_argv(self, point: dict) -> list[str]:
        """fl.train's arguments for a point: the command's own, then the point's parameters with `arm=NAME`
        replaced by that arm's overrides (what fl.train makes of W&B's `arm=NAME arms.NAME=...`)."""
        argv = list(self.fixed_args)
        for key, value in point.items():
            argv += self.arms[value] if key == ARM and self.arms else [f"{key}={format_value(value)}"]
        return argv

    def wandb_args(self, point: dict) -> list[str]:
        """What W&B's agent passes for a point (`${args_no_hyphens}`): every parameter, the arms' definitions
        included, after the command's own arguments."""
        return [*self.fixed_args, *point_args(point),
                *[f"{ARMS}{name}={' '.join(words)}" for name, words in self.arms.items()]]


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} not found")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: cannot parse YAML: {str(err).splitlines()[0]}") from None
    return parse_sweep(doc, default_name=path.stem)


def parse_sweep(doc: Any, default_name: str = "sweep") -> Sweep:
    if not isinstance(doc, dict):
        raise ConfigError("sweep file: expected a mapping with program/command, method, metric, parameters")
    requested = doc.get("method")
    if requested not in METHODS:
        raise ConfigError(f"method: {requested!r} is not valid; choices: {', '.join(METHODS)}")
    notes = []
    method = requested
    if requested == "bayes":
        method = "random"
        notes.append("method: bayes needs W&B's sweep controller; offline it runs as random search over "
                     "the same space")
    metric, goal = _metric(doc.get("metric"), required=requested == "bayes")
    fixed = _command_args(doc.get("command"), doc.get("program"))
    params = doc.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ConfigError("parameters: expected a non-empty mapping of name -> {values|value|distribution...}")
    flat = _flatten(params, "parameters", "")
    flat, arms = _arms(flat)
    for name, spec in flat.items():
        check_spec(name, spec)
        if method == "grid":
            grid_values(name, spec)  # raises for continuous distributions
    run_cap = doc.get("run_cap")
    if run_cap is not None and (not isinstance(run_cap, int) or isinstance(run_cap, bool) or run_cap < 1):
        raise ConfigError(f"run_cap: {run_cap!r} must be a positive integer")
    name = doc.get("name") or default_name
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ConfigError(f"name: {name!r} must be a non-empty string without '/'")
    return Sweep(name, method, requested, metric, goal, fixed, flat, run_cap, notes, arms)


def _arms(flat: dict[str, dict]) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """The parameters without the arms' definitions, and the arms (name -> overrides). An arm is defined by a
    constant `arms.<name>: {value: "key=value ..."}`; `arm` lists the arms the sweep runs, each defined once, and no
    arm sets a key the grid also sweeps (which one would win would depend on the argument order)."""
    defined = {k[len(ARMS):]: spec for k, spec in flat.items() if k.startswith(ARMS)}
    rest = {k: spec for k, spec in flat.items() if not k.startswith(ARMS)}
    if not defined and ARM not in rest:
        return rest, {}
    if ARM not in rest:
        raise ConfigError(f"parameters.{ARMS}{next(iter(defined))}: arms are defined but no parameter '{ARM}' "
                          "names the ones to run (arm: {values: [...]})")
    arms = {}
    for name, spec in defined.items():
        if set(spec) != {"value"} or not isinstance(spec["value"], str):
            raise ConfigError(f"parameters.{ARMS}{name}: expected {{value: 'key=value ...'}} (the arm's overrides "
                              "as one string)")
        arms[name] = arm_overrides(name, spec["value"])
    check_spec(ARM, rest[ARM])
    listed = rest[ARM].get("values", [rest[ARM].get("value")])
    missing = [a for a in listed if a not in arms]
    if missing:
        raise ConfigError(f"parameters.{ARM}: {missing[0]!r} has no definition parameters.{ARMS}{missing[0]} "
                          f"(defined: {', '.join(sorted(arms)) or 'none'})")
    unused = [a for a in arms if a not in listed]
    if unused:
        raise ConfigError(f"parameters.{ARMS}{unused[0]}: defined but not among parameters.{ARM}'s values")
    for name, words in arms.items():
        clash = next((w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in rest), None)
        if clash:
            raise ConfigError(f"parameters.{ARMS}{name}: sets {clash}, which the sweep also varies; set it in the "
                              "arms or in the grid, not both")
    return rest, arms


def _metric(metric: Any, required: bool) -> tuple[Optional[str], str]:
    if metric is None:
        if required:
            raise ConfigError("metric: method bayes needs a metric {name, goal}")
        return None, "maximize"
    if not isinstance(metric, dict) or not isinstance(metric.get("name"), str) or not metric["name"]:
        raise ConfigError(f"metric: expected {{name: <logged key>, goal: maximize|minimize}}, got {metric!r}")
    goal = metric.get("goal", "minimize")  # W&B's default goal
    if goal not in GOALS:
        raise ConfigError(f"metric.goal: {goal!r} is not valid; choices: {', '.join(GOALS)}")
    return metric["name"], goal


def _command_args(command: Any, program: Any) -> list[str]:
    """The literal fl.train arguments of the command (everything after fl.train that is not a macro)."""
    if command is None:  # W&B's default: ${env} ${interpreter} ${program} ${args}
        if program not in ("fl.train", "fl/train.py"):
            raise ConfigError(f"program: {program!r}; without a command the program must be fl/train.py "
                              "(or give command: [${env}, python, -m, fl.train, conf=NAME, ${args_no_hyphens}])")
        return []
    if not isinstance(command, list) or not all(isinstance(t, str) for t in command):
        raise ConfigError("command: expected a list of strings, e.g. [${env}, python, -m, fl.train, conf=NAME, "
                          "${args_no_hyphens}]")
    starts = [i for i, t in enumerate(command) if t in ("fl.train", "fl/train.py")
              or (t == "${program}" and program in ("fl.train", "fl/train.py"))]
    if not starts:
        raise ConfigError("command: does not run fl.train (expected ... python -m fl.train conf=NAME "
                          "${args_no_hyphens})")
    rest = command[starts[0] + 1:]
    if not any(t in ARG_MACROS for t in rest):
        raise ConfigError("command: has no ${args_no_hyphens} after fl.train, so the parameters would never "
                          "reach the run")
    fixed = []
    for token in rest:
        if token in ARG_MACROS or token in IGNORED_MACROS:
            continue
        if token.startswith("${"):
            raise ConfigError(f"command: macro {token} is not supported by fl.train; use ${{args_no_hyphens}}")
        if "=" not in token.lstrip("-"):
            raise ConfigError(f"command: argument {token!r} after fl.train is not key=value")
        fixed.append(token.lstrip("-"))
    return fixed


def _flatten(params: dict, where: str, prefix: str) -> dict[str, dict]:
    """W&B's nested form {method: {parameters: {lam: {...}}}} becomes method.lam."""
    flat = {}
    for key, spec in params.items():
        name = f"{prefix}{key}"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}.{name}: expected a mapping such as {{values: [...]}}, got {spec!r}")
        if "parameters" in spec:
            if set(spec) != {"parameters"} or not isinstance(spec["parameters"], dict):
                raise ConfigError(f"{where}.{name}: a nested block holds only 'parameters'")
            flat.update(_flatten(spec["parameters"], where, f"{name}."))
        else:
            flat[name] = spec
    return flat


def _number(name: str, spec: dict, key: str) -> float:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        hint = " (YAML 1.1 reads 1e-4 as text; write 1.0e-4)" if isinstance(value, str) else ""
        raise ConfigError(f"parameters.{name}.{key}: {value!r} is not a number{hint}")
    return value


def distribution(name: str, spec: dict) -> str:
    """W&B's inference: values -> categorical, value -> constant, int min/max -> int_uniform, else uniform."""
    if "distribution" in spec:
        return spec["distribution"]
    if "values" in spec:
        return "categorical"
    if "value" in spec:
        return "constant"
    if "min" in spec and "max" in spec:
        ints = all(isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in ("min", "max"))
        return "int_uniform" if ints else "uniform"
    raise ConfigError(f"parameters.{name}: needs values, value, or a distribution with min/max")


def check_spec(name: str, spec: dict) -> None:
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ConfigError(f"parameters.{name}: unknown field {sorted(unknown)[0]!r}; "
                          f"valid: {', '.join(sorted(SPEC_KEYS))}")
    dist = distribution(name, spec)
    if dist not in DISTRIBUTIONS:
        raise ConfigError(f"parameters.{name}.distribution: {dist!r} is not supported; choices: "
                          f"{', '.join(DISTRIBUTIONS)}")
    for key in DISTRIBUTIONS[dist]:
        if key not in spec:
            raise ConfigError(f"parameters.{name}: distribution {dist} needs '{key}'")
    if dist == "categorical":
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"parameters.{name}.values: expected a non-empty list, got {values!r}")
        probs = spec.get("probabilities")
        if probs is not None and (not isinstance(probs, list) or len(probs) != len(values)
                                  or any(not isinstance(p, (int, float)) or p < 0 for p in probs)
                                  or not math.isclose(sum(probs), 1.0, abs_tol=1e-6)):
            raise ConfigError(f"parameters.{name}.probabilities: expected {len(values)} non-negative numbers "
                              "summing to 1")
    elif dist != "constant":
        a, b = (_number(name, spec, k) for k in DISTRIBUTIONS[dist])
        if dist in ("normal", "q_normal", "log_normal", "q_log_normal"):
            if b <= 0:
                raise ConfigError(f"parameters.{name}.sigma: {b!r} must be > 0")
        elif a > b:
            raise ConfigError(f"parameters.{name}: min {a!r} > max {b!r}")
        if dist.endswith("_values") and a <= 0:
            raise ConfigError(f"parameters.{name}.min: {a!r} must be > 0 for {dist}")
        if dist == "int_uniform" and not all(isinstance(spec[k], int) for k in ("min", "max")):
            raise ConfigError(f"parameters.{name}: int_uniform needs integer min and max")
        if dist.startswith("q_") and "q" in spec and _number(name, spec, "q") <= 0:
                raise ConfigError(f"parameters.{name}.q: {spec['q']!r} must be > 0")


def grid_values(name: str, spec: dict) -> list:
    """The values a grid search visits; continuous distributions have none (W&B refuses them too)."""
    dist = distribution(name, spec)
    if dist == "categorical":
        return list(spec["values"])
    if dist == "constant":
        return [spec["value"]]
    if dist == "int_uniform":
        return list(range(spec["min"], spec["max"] + 1))
    if dist == "q_uniform":
        q = spec.get("q", 1)
        n = int(math.floor((spec["max"] - spec["min"]) / q + 1e-9))
        return [_round_q(spec["min"] + i * q, q) for i in range(n + 1)]
    raise ConfigError(f"parameters.{name}: method grid needs values, value, int_uniform or q_uniform; "
                      f"got distribution {dist} (use method: random)")


def _round_q(x: float, q: float):
    v = round(x / q) * q
    return int(round(v)) if float(q).is_integer() else round(v, 12)


def sample(name: str, spec: dict, rng: random.Random):
    dist = distribution(name, spec)
    if dist == "constant":
        return spec["value"]
    if dist == "categorical":
        return rng.choices(spec["values"], weights=spec.get("probabilities"))[0]
    if dist == "int_uniform":
        return rng.randint(spec["min"], spec["max"])
    q = spec.get("q", 1)
    lo, hi = spec.get("min"), spec.get("max")
    draw = {
        "uniform": lambda: rng.uniform(lo, hi), "q_uniform": lambda: rng.uniform(lo, hi),
        "log_uniform_values": lambda: math.exp(rng.uniform(math.log(lo), math.log(hi))),
        "q_log_uniform_values": lambda: math.exp(rng.uniform(math.log(lo), math.log(hi))),
        "inv_log_uniform_values": lambda: 1.0 / math.exp(rng.uniform(math.log(1 / hi), math.log(1 / lo))),
        "log_uniform": lambda: math.exp(rng.uniform(lo, hi)), "q_log_uniform": lambda: math.exp(rng.uniform(lo, hi)),
        "normal": lambda: rng.gauss(spec["mu"], spec["sigma"]),
        "q_normal": lambda: rng.gauss(spec["mu"], spec["sigma"]),
        "log_normal": lambda: math.exp(rng.gauss(spec["mu"], spec["sigma"])),
        "q_log_normal": lambda: math.exp(rng.gauss(spec["mu"], spec["sigma"])),
    }[dist]
    value = draw()
    return _round_q(value, q) if dist.startswith("q_") else value


def expand(sweep: Sweep, count: Optional[int] = None, seed: int = 0, exclude: tuple = ("seed",)) -> list[dict]:
    """The sweep's points (parameters other than `exclude`), in a fixed order. Grid: the cartesian product
    (deduplicated); random: `count` draws (default: run_cap) from a generator seeded by `seed` via
    fl.seeding, so the same command expands to the same points and a resumed sweep finds its runs."""
    params = {k: v for k, v in sweep.params.items() if k not in exclude}
    if sweep.method == "grid":
        names = list(params)
        combos = itertools.product(*(grid_values(n, params[n]) for n in names))
        points, seen = [], set()
        for combo in combos:
            point = dict(zip(names, combo))
            key = json.dumps(point, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                points.append(point)
        return points
    n = count or sweep.run_cap
    if n is None:
        raise ConfigError("run_cap: random search needs a number of points; set run_cap in the file or pass "
                          "--count N")
    rng = random.Random(derive_seed(seed, 0, -1, f"sweep/{sweep.name}"))
    return [{name: sample(name, spec, rng) for name, spec in params.items()} for _ in range(n)]


def format_value(value: Any) -> str:
    """A dotlist value OmegaConf reads back as the same type (null, true/false, lists as JSON)."""
    if value is None or isinstance(value, (bool, list, dict)):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def point_args(point: dict) -> list[str]:
    return [f"{k}={format_value(v)}" for k, v in point.items()]


# the validation share a made sweep adds when its config has none, so that its val/ metric is logged
MADE_VAL_FRACTION = 0.1


def check_metric(metric: Optional[str], goal: str, cfg, where: str) -> None:
    """A sweep's metric is one a run of `cfg` logs, and its goal the direction the metric's logger declares
    (fl/core/metric_directions.py): otherwise every point would be scored on nothing, or the worst chosen."""
    if metric is None:
        return
    logged = run_directions(cfg)
    known, direction = lookup(current_name(metric), logged)  # a file written before a rename reads its new name
    if not known:
        names = sorted(k for k, d in logged.items() if d is not None and not k.endswith("*"))
        hint = " (val/ metrics need data.val_fraction > 0)" if metric.startswith("val/") and not (
            cfg.data.val_fraction) else ""
        raise ConfigError(f"{where}metric.name={metric!r} is not a metric these runs log{hint}"
                          f"{suggest(metric, names)}")
    if direction is None:
        raise ConfigError(f"{where}metric.name={metric!r} is a diagnostic, declared neither higher nor lower better; "
                          "a sweep selects on a metric that is better one way")
    if goal != GOAL_OF[direction]:
        raise ConfigError(f"{where}metric.goal={goal!r} is against {metric}, whose logger declares "
                          f"{describe(direction)}: use goal: {GOAL_OF[direction]}")


def make_sweep(conf: str, params: list[str], method: Optional[str] = None, metric: Optional[str] = None,
               goal: Optional[str] = None, seeds: Optional[list[int]] = None, run_cap: int = 20,
               overrides: Sequence[str] = ()) -> dict:
    """A W&B sweep file over `params` (method.X keys) of conf's method (or `overrides`' method.name=X: they are fixed
    arguments of its command), from its declared search ranges. The default metric is a validation metric, as a
    sweep selects on validation and reports test: the target's validation accuracy when the data has a target
    (FedPALS tunes lambda on it), else val/ of the metric the method's paper leads with (its registration's
    headline), else of the mean client accuracy; a config without validation splits gets data.val_fraction=0.1 in
    the command. The goal is the metric's declared direction."""
    fixed = [f"conf={conf}", *overrides]
    cfg = load_config([*fixed, "logger.wandb.mode=disabled"])
    if metric is None:
        has_target = cfg.data.target.distribution is not None or cfg.data.target.domain is not None
        headline = registry.METHODS[cfg.method.name].headline or DEFAULT_METRIC
        metric = "val/target_acc" if has_target else "val/" + headline.split("/", 1)[1]
    if metric.startswith("val/") and metric != "val/target_acc" and not cfg.data.val_fraction:
        fixed.append(f"data.val_fraction={MADE_VAL_FRACTION}")
        cfg = load_config([*fixed, "logger.wandb.mode=disabled"])
    direction = lookup(metric, run_directions(cfg))[1]
    goal = goal or GOAL_OF.get(direction, "maximize")
    check_metric(metric, goal, cfg, "")
    spaces = search_spaces(registry.METHODS[cfg.method.name].config_cls)
    space = {}
    for p in params:
        if p not in spaces:
            have = ", ".join(spaces) or "none"
            raise ConfigError(f"params: {p!r} has no search range in {cfg.method.name}'s config; declared: {have}")
        space[p] = dict(spaces[p])
    if seeds:
        space["seed"] = {"values": list(seeds)}
    discrete = all(distribution(k, v) in ("categorical", "constant", "int_uniform", "q_uniform")
                   for k, v in space.items())
    method = method or ("grid" if discrete else "random")
    doc = {
        "name": f"{Path(conf).stem}-{'-'.join(p.split('.')[-1] for p in params)}",
        "program": "fl.train",
        "command": ["${env}", "python", "-m", "fl.train", *fixed, "${args_no_hyphens}"],
        "method": method,
        "metric": {"name": metric, "goal": goal},
        "parameters": space,
    }
    if method != "grid":
        doc["run_cap"] = run_cap
    parse_sweep(doc)  # the file we write must be one we accept
    return doc
