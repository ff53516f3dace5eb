"""What `python -m fl.train` prints without running: --help, --help with a method, --list KIND."""
from __future__ import annotations

import sys
from dataclasses import MISSING, fields, is_dataclass

from fl.config import CONF_DIR, available_confs, choices_msg
from fl.config.blocks import plugin_choices
from fl.config.errors import ConfigError
from fl.core import registry
from fl.core.metric_directions import declared, describe

USAGE = """usage: python -m fl.train [conf=NAME] [key=value ...] [resume=RUN_DIR]
       python -m fl.train --list KIND [plugins=[...]]  (KIND: methods, configs, datasets, partitions,
                                                        client_transforms, aggregators, models, evaluators)
       python -m fl.train method.name=NAME --help      (that method's hyperparameters)
       python -m fl.train data.name=NAME --help        (that dataset's settings; also data.partition.name=NAME,
                                                        data.client_transform.name=NAME, server.aggregator.name=NAME)
       python -m fl.train trainer.evaluators=[NAME,...] --help  (those evaluators' settings and metrics)
       python -m fl.train [conf=NAME] [key=value ...] --print-config

Runs a federated experiment: conf=NAME loads conf/NAME.yaml (default: quickstart), key=value overrides any
config key, e.g.  python -m fl.train conf=fedprox_embedded method.mu=0.1 trainer.rounds=50 seed=3;
plugins=[module, ...] imports modules of your own that register more (README, "Extending fl").
A run writes outputs/<run>/ (config.yaml, metrics.jsonl, summary.json, checkpoints/); resume=<run dir>
continues it. Exit codes: 0 done, 1 a training fault, 2 bad configuration or data (nothing written),
130 interrupted. The README's config tree and docs/data.md list every config key."""

KINDS = ("methods", "configs", "datasets", "partitions", "client_transforms", "aggregators", "models", "evaluators")


def _first_line(text: str | None, width: int = 110) -> str:
    """The first paragraph of a docstring on one line, cut at a word boundary."""
    para = " ".join((text or "").strip().split("\n\n")[0].split())
    return para if len(para) <= width else para[:width].rsplit(" ", 1)[0] + " ..."


def _describe(builder) -> str:
    """A builder's docstring, else its module's (a module of one dataset or model says what it is)."""
    return _first_line(builder.__doc__) or _first_line(sys.modules[builder.__module__].__doc__)


def method_description(spec) -> str:
    """What a method is: its config class's own docstring when it has one (fedacd_base, FedACD's ablation), else
    the docstring of the module that defines its config, which is the method's own module (fedpals trains
    with FedProx's client class, so the client's module would call it FedProx)."""
    cls = spec.config_cls
    own = vars(cls).get("__doc__") or ""
    if own.startswith(f"{cls.__name__}("):  # the signature @dataclass writes when the class has no docstring
        own = ""
    return _first_line(own) or _first_line(sys.modules[cls.__module__].__doc__)


def _conf_description(name: str) -> str:
    """A config's first comment line (every shipped config opens with what it is)."""
    for line in (CONF_DIR / f"{name}.yaml").read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def list_items(kind: str) -> str:
    """One line per registered item of `kind`: its name and what it is."""
    registry.load_plugins()
    if kind == "methods":
        items = {n: method_description(s) for n, s in registry.METHODS.items()}
    elif kind == "configs":
        items = {n: _conf_description(n) for n in available_confs()}
    elif kind in ("datasets", "partitions", "client_transforms", "aggregators"):
        table = {"datasets": registry.DATASETS, "partitions": registry.PARTITIONS,
                 "client_transforms": registry.CLIENT_TRANSFORMS, "aggregators": registry.AGGREGATORS}[kind]
        items = {n: _describe(p.fn) for n, p in table.items()}
    elif kind == "models":
        items = {n: _describe(f) for n, f in registry.MODELS.items()}
    elif kind == "evaluators":
        items = {n: _describe(c) for n, c in registry.EVALUATORS.items()}
    else:
        raise ConfigError(choices_msg("--list", kind, KINDS))
    width = max(map(len, items), default=0)
    return "\n".join(f"{n:{width}s}  {d}" for n, d in sorted(items.items()))


def settings_lines(prefix: str, settings: type, values=None) -> list[str]:
    """One entry per field of a typed settings class (a nested block's fields as block.key): `prefix.key=value`,
    its type, default, allowed range and help text. `values`: the config's block (else the defaults are shown)."""
    lines = []
    for f in fields(settings):
        if f.name == "name":
            continue
        default = f.default_factory() if f.default is MISSING else f.default
        value = values[f.name] if values is not None and f.name in values else default
        if is_dataclass(default):
            lines += settings_lines(f"{prefix}.{f.name}", type(default), value if values is not None else None)
            continue
        meta = f.metadata or {}
        bounds = [f"{op} {meta[key]}" for key, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                  if meta.get(key) is not None]
        if meta.get("choices"):
            bounds.append("one of " + ", ".join(map(str, meta["choices"])))
        type_name = f.type.__name__ if isinstance(f.type, type) else str(f.type).replace("typing.", "")
        rng = f"  [{', '.join(bounds)}]" if bounds else ""
        was = f", default {default!r}" if value != default else ""
        lines.append(f"  {prefix}.{f.name}={value!r}  ({type_name}{was}){rng}")
        if meta.get("help"):
            lines.append(f"      {meta['help']}")
    return lines


def data_plugin_help(block: str, name: str, values=None) -> str:
    """A dataset's (block "data"), partition's ("data.partition"), client transform's ("data.client_transform") or
    aggregator's ("server.aggregator") own settings, as method_help shows a method's; `values`: the config's block."""
    registry.load_plugins()
    table = {b: t for b, t, _ in plugin_choices()}[block]
    if name not in table:
        raise ConfigError(choices_msg(f"{block}.name", name, table))
    plugin = table[name]
    own = settings_lines(block, plugin.settings, values)
    return "\n".join([f"{block}.name={name}: {_describe(plugin.fn)}", "",
                      "settings:" if own else "settings: none of its own", *own])


def evaluator_help(name: str, values=None) -> str:
    """An evaluator's settings (evaluators.<name>.*) and the metrics it declares, with which way each is better;
    `values`: the config's evaluators.<name> block."""
    registry.load_plugins()
    if name not in registry.EVALUATORS:
        raise ConfigError(choices_msg("trainer.evaluators", name, registry.EVALUATORS))
    cls = registry.EVALUATORS[name]
    own = settings_lines(f"evaluators.{name}", cls.Settings, values)
    runs = "runs by default" if cls.default else "runs when trainer.evaluators names it"
    described = _describe(cls)
    lines = [f"evaluator {name}: {described} ({runs})" if described else f"evaluator {name} ({runs})", "",
             "settings:" if own else "settings: none of its own", *own, "",
             "metrics (per-client client/<i>/... aside):"]
    return "\n".join(lines + [f"  {k}  ({describe(d)})" for k, d in declared(cls).items()])


def method_help(name: str, values=None) -> str:
    """The method's hyperparameters (method.<name>=...): type, value (`values`, e.g. a config's method block,
    else the default), allowed range and help text."""
    registry.load_plugins()
    if name not in registry.METHODS:
        raise ConfigError(choices_msg("method.name", name, registry.METHODS))
    spec = registry.METHODS[name]
    own = settings_lines("method", spec.config_cls, values)
    lines = [f"method.name={name}: {method_description(spec)}",
             f"headline metric: {spec.headline or 'test/acc_mean_clients'}"]
    if spec.needs:
        lines.append(f"needs: {' '.join(spec.needs)} (or other values of these keys)")
    lines += ["", "hyperparameters:" if own else "hyperparameters: none of its own (it trains with the keys every "
              "method takes: optim.*, trainer.*, server.*; python -m fl.train --help)", *own]
    logged = {**{f"train/{k}": d for k, d in declared(spec.client_cls).items() if k != "loss"},
              **declared(spec.server_cls)}
    lines += ["", "metrics of its own (beside every method's test/*, train/loss, time/ and comm/):" if logged else
              "metrics of its own: none (it logs every method's test/*, train/loss, time/ and comm/)"]
    lines += [f"  {k}  ({describe(d)})" for k, d in logged.items()]
    return "\n".join(lines)
