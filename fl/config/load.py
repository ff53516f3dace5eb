"""From `conf=NAME key=value ...` to a typed, checked run config.

A config file may `include:` others (conf/NAME.yaml: a paper protocol, a data block in conf/data/, a real
config its synthetic twin overlays); they are merged first, in order, then the file, then the command-line
overrides, then typed against the schema (the method's and the evaluators' blocks included) and checked.
Bad input raises `ConfigError` with a one-line message naming the key (and file) and what would be valid.
"""
from __future__ import annotations

import difflib
import functools
from dataclasses import field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from fl.config.arms import expand_arms
from fl.config.errors import ConfigError
from fl.config.schema import Config
from fl.core import registry

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
DEFAULT_CONF = "quickstart"

# Keys that may change when resuming; everything else must match the checkpointed run.
RESUMABLE_KEYS = ("trainer.rounds", "fabric.", "logger.", "resume")

# Keys that moved, old -> new: a config or override that still uses the old one is refused, naming the new.
MOVED_KEYS = {
    **{f"data.{old}": f"data.partition.{new}" for old, new in (
        ("dirichlet_alpha", "alpha"), ("dirichlet_balance", "balance"), ("min_client_size", "min_client_size"),
        ("samples_per_client", "samples_per_client"), ("classes_per_client", "classes_per_client"),
        ("class_assignment", "class_assignment"), ("shards_per_client", "shards_per_client"),
        ("clients_per_domain", "clients_per_domain"), ("within_domain", "within_domain"),
        ("partition_labels", "labels"), ("partition_seed", "seed"))},
    **{f"data.{old}": f"data.target.{new}" for old, new in (
        ("target_val_size", "val_size"), ("target_domain", "domain"), ("target_drop_labels", "drop_labels"),
        ("clients_follow_target", "clients_follow"))},
    **{f"data.{k}": f"data.embedded.{k}" for k in ("num_classes", "num_domains", "samples_per_class", "channels",
                                                    "noise")},
    "trainer.adaptability_every": "evaluators.adaptability.every",
    "trainer.kl_tau": "evaluators.adaptability.kl_tau",
    "method.proj_dim": "model.proj_dim",  # FedDRM's projections and its baselines' share one width
}
# Groups that were single values: `data.partition=dirichlet` is now `data.partition.name=dirichlet`.
BECAME_GROUPS = {"data.partition": "data.partition.name", "data.target": "data.target.distribution"}


def _suggest(word: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def choices_msg(key: str, value: Any, choices) -> str:
    choices = sorted(str(c) for c in choices)
    return f"{key}={value!r} is not valid{_suggest(value, choices)}; choices: {', '.join(choices)}"


def available_confs() -> list[str]:
    """Top-level configs; conf/data/ and conf/protocol/ hold the blocks they include."""
    return sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


def resolve_conf_path(name: str) -> Path:
    """`conf=NAME` names conf/NAME.yaml, or is a path to a YAML file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        if path.is_file():
            return path
        raise ConfigError(f"conf={name!r}: file not found")
    path = CONF_DIR / f"{name}.yaml"
    if path.is_file():
        return path
    raise ConfigError(f"conf={name!r} is not a config{_suggest(name, available_confs())}; "
                      f"choices: {', '.join(available_confs())} (or a path to a .yaml file)")


def _leaves(node: Any, prefix: str = "", resolve: bool = False) -> dict[str, Any]:
    """Dotted key -> value of the leaves (lists are leaves)."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=resolve)
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def _leaf_keys(node: Any) -> list[str]:
    """Dotted keys of the leaves (interpolations left unresolved)."""
    return list(_leaves(node))


def config_diff(old: Any, new: Any, ignore: tuple[str, ...] = RESUMABLE_KEYS) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for each resolved leaf that differs, keys starting with `ignore` aside;
    a key missing on one side shows as None there."""
    a, b = _leaves(old, resolve=True), _leaves(new, resolve=True)
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if not k.startswith(ignore) and a.get(k) != b.get(k)]


def refuse_moved_keys(node: DictConfig, where: str) -> None:
    """A key that moved (MOVED_KEYS) or a group set to a single value (BECAME_GROUPS) stops here, naming
    the key to use instead."""
    for key in _leaf_keys(node):
        for old, new in MOVED_KEYS.items():
            if key == old or key.startswith(old + "."):
                raise ConfigError(f"{where}: {old} moved to {new}")
        if key in BECAME_GROUPS:
            value = OmegaConf.select(node, key)
            raise ConfigError(f"{where}: {key} is a group now; write {BECAME_GROUPS[key]}={value!r}")


@functools.lru_cache(maxsize=1)
def _shape() -> DictConfig:
    """The schema's shape, built once: OmegaConf.structured(Config) costs ~0.1 s and every config file and command
    line is checked against it (a sweep plans hundreds). check_shapes only reads it."""
    shape = OmegaConf.structured(Config)
    OmegaConf.set_readonly(shape, True)
    return shape


def check_shapes(node: DictConfig, where: str) -> None:
    """A scalar where the schema has a group (`trainer=5`, `method: fedprox`) or a key under a list
    (`data.augment.flip=true`) stops here in one line, saying what to write instead."""
    shape, given = _shape(), OmegaConf.to_container(node, resolve=False)
    for key in _leaf_keys(node):
        parts, at, value = key.split("."), shape, given
        for i, part in enumerate(parts):
            here = ".".join(parts[:i + 1])
            if isinstance(at, ListConfig):
                raise ConfigError(f"{where}: {'.'.join(parts[:i])} is a list; write it whole, e.g. "
                                  f"{'.'.join(parts[:i])}=[{part}]")
            if not isinstance(at, DictConfig) or part not in at:
                break  # unknown keys are reported by the schema merge, with suggestions
            at, value = at[part], value[part]
            if isinstance(at, DictConfig) and not isinstance(value, dict):
                example = f"{here}.name={value}" if here == "method" else f"{here}.<key>=..."
                raise ConfigError(f"{where}: {here}={value!r} sets a group to a single value; set its keys, e.g. "
                                  f"{example} (valid keys: {', '.join(list(at.keys())[:8])})")


def load_conf_file(path: Path, seen: tuple = ()) -> DictConfig:
    """A YAML config; its `include: [NAME, ...]` files (conf/NAME.yaml) are merged first, in order."""
    if path in seen:
        raise ConfigError(f"include cycle: {' -> '.join(str(p) for p in seen + (path,))}")
    try:
        node = OmegaConf.load(path)
    except Exception as err:  # a YAML syntax error, reported in one line
        raise ConfigError(f"cannot parse {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of keys (seed: 0, trainer: ...), not a list")
    includes = node.pop("include", [])
    if not isinstance(includes, (str, list, ListConfig)) or not all(isinstance(i, str) for i in
                                                              ([includes] if isinstance(includes, str) else includes)):
        raise ConfigError(f"{path}: include must be a list of config names, e.g. include: [protocol/feddrm]; "
                          f"got {includes!r}")
    refuse_moved_keys(node, str(path))
    check_shapes(node, str(path))
    parts = []
    for name in [includes] if isinstance(includes, str) else includes:
        inc = CONF_DIR / f"{name}.yaml"
        if not inc.is_file():
            raise ConfigError(f"{path}: include {name!r} not found (expected {inc})")
        parts.append(load_conf_file(inc, seen + (path,)))
    if not parts:
        return node
    merged = OmegaConf.merge(*parts)
    own, inherited = (OmegaConf.select(n, "method.name", default=None) for n in (node, merged))
    if own is not None and own != inherited and "method" in merged:
        merged.method = {"name": own}  # an included protocol's hyperparameters belong to its own method
    return OmegaConf.merge(merged, node)


def parse_argv(argv: list[str]) -> tuple[Optional[str], list[str]]:
    """Split CLI arguments into the conf name and OmegaConf dotlist overrides (a sweep arm, `arm=NAME` with its
    `arms.NAME=...`, becomes its overrides first: fl/config/arms.py)."""
    conf, overrides = None, []
    for arg in expand_arms(argv):
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"argument {arg!r} is not key=value (e.g. conf=quickstart trainer.rounds=5)")
        if arg.split("=", 1)[0].startswith(".") or ".." in arg.split("=", 1)[0]:
            raise ConfigError(f"argument {arg!r}: a key is dotted names without a leading or empty part "
                              "(e.g. trainer.rounds=2)")
        if arg.startswith("conf="):
            conf = arg.split("=", 1)[1]
        else:
            overrides.append(arg.lstrip("-"))
    return conf, overrides


def _method_config_cls(name: Any):
    if not isinstance(name, str) or name not in registry.METHODS:
        raise ConfigError(choices_msg("method.name", name, registry.METHODS))
    return registry.METHODS[name].config_cls


def _evaluator_settings():
    """One typed block per registered evaluator: evaluators.<name>."""
    blocks = [(name, cls.Settings, field(default_factory=cls.Settings)) for name, cls in registry.EVALUATORS.items()]
    return make_dataclass("EvaluatorSettings", blocks)()


def schema(method_name: Any) -> DictConfig:
    """The structured config of a run of `method_name`: the core groups, its method block, the evaluators'."""
    return OmegaConf.structured(Config(method=_method_config_cls(method_name)(), evaluators=_evaluator_settings()))


def _merge(method_name: Any, *sources) -> DictConfig:
    base = schema(method_name)
    try:
        return OmegaConf.merge(base, *sources)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(err, base, sources)) from None


def _given(key: str, sources) -> str:
    """The value `key` was given (the last source that sets it), written as on the command line."""
    value = absent = object()
    for src in sources:
        try:
            found = OmegaConf.select(src, key, default=absent, throw_on_resolution_failure=False)
        except OmegaConfBaseException:
            continue
        value = found if found is not absent else value
    if value is absent:
        return "?"
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    return "null" if value is None else repr(value)


def _omegaconf_message(err: OmegaConfBaseException, schema_node: DictConfig, sources=()) -> str:
    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, ConfigKeyError) or "not in" in str(err):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema_node, parent) if parent else schema_node
        valid = list(node.keys()) if isinstance(node, DictConfig) else []
        where = f"under '{parent}'" if parent else "at the top level"
        hint = _suggest(leaf, valid, f"{parent}." if parent else "")
        if not valid:
            return f"unknown key '{key}': '{parent}' has no settings"
        return f"unknown key '{key}'{hint}; valid keys {where}: {', '.join(valid)}"
    if isinstance(err, ValidationError):
        expected = ""
        node_type = None
        try:
            parent, _, leaf = key.rpartition(".")
            cls = OmegaConf.get_type(OmegaConf.select(schema_node, parent) if parent else schema_node)
            node_type = {f.name: f.type for f in fields(cls)}.get(leaf)
        except Exception:  # best effort: the type is a hint only
            pass
        if node_type is not None:
            expected = f"; expected {node_type}" if isinstance(node_type, str) else f"; expected {node_type.__name__}"
        return f"{key}={_given(key, sources)} has the wrong type{expected}"
    return f"{key}: {str(err).splitlines()[0]}"


FLOAT32_MAX = 3.4028234663852886e38


def _check_node(node: DictConfig, prefix: str) -> None:
    cls = OmegaConf.get_type(node)
    if not is_dataclass(cls):
        return
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        value = node[f.name]
        if isinstance(value, DictConfig):
            _check_node(value, key + ".")
            continue
        meta = f.metadata
        if not meta or value is None:
            continue
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise ConfigError(choices_msg(key, value, meta["choices"]))
        for bound, ok, sym in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                               ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
            b = meta.get(bound)
            if b is not None and not ok(value, b):
                raise ConfigError(f"{key}={value!r} is out of range; it must be {sym} {b}")
        if isinstance(value, float) and not abs(value) <= FLOAT32_MAX:
            raise ConfigError(f"{key}={value!r} is not a finite float32 (|x| <= {FLOAT32_MAX:.3g}), as tensors hold it")


def validate(cfg: DictConfig) -> None:
    """Range / choice checks from the field metadata, names against the registries, the method's resolve."""
    _check_node(cfg, "")
    spec = registry.METHODS[cfg.method.name]
    if spec.resolve is not None:
        spec.resolve(cfg)
    if cfg.data.name not in registry.DATASETS:
        raise ConfigError(choices_msg("data.name", cfg.data.name, registry.DATASETS))
    for name in cfg.data.augment:
        if name not in registry.AUGMENTATIONS:
            raise ConfigError(choices_msg("data.augment", name, registry.AUGMENTATIONS))
    for name in cfg.trainer.evaluators or []:
        if name not in registry.EVALUATORS:
            raise ConfigError(choices_msg("trainer.evaluators", name, registry.EVALUATORS))
    if cfg.model.name not in registry.MODELS:
        raise ConfigError(choices_msg("model.name", cfg.model.name, registry.MODELS))
    name = cfg.logger.run_name
    if name is not None and (str(name) in ("", ".", "..") or any(c in str(name) for c in "/\\")):
        raise ConfigError(f"logger.run_name={str(name)!r} must be one folder name (no '/', not '..'); the run "
                          "directory is logger.output_dir/<run_name>: set logger.output_dir to move it")
    after = cfg.finetune.after_round
    if after is not None and after >= cfg.trainer.rounds:
        raise ConfigError(f"finetune.after_round={after} leaves no fine-tuning round: it must be < "
                          f"trainer.rounds={cfg.trainer.rounds}")
    if cfg.trainer.local_steps is None and cfg.trainer.local_epochs is None:
        raise ConfigError("trainer.local_epochs and trainer.local_steps are both null; set one of them")
    if cfg.fabric.strategy.startswith("ddp") and cfg.fabric.accelerator == "cpu" and cfg.fabric.precision not in (
            "32-true", "32", "64-true", "64", "bf16-mixed"):
        raise ConfigError(f"fabric.precision={cfg.fabric.precision!r} is not supported on CPU; "
                          "use 32-true, 64-true or bf16-mixed")


def _method_name(*sources) -> Any:
    name = "fedavg"
    for src in sources:
        picked = OmegaConf.select(src, "method.name", default=None)
        if picked is not None:
            name = picked
    return name


def load_config(argv: list[str]) -> DictConfig:
    """Build the run config from `conf=NAME key=value ...`; raises ConfigError on bad input."""
    registry.load_plugins()
    conf, overrides = parse_argv(argv)
    for arg in overrides:  # one at a time, so the message names the bad one
        try:
            OmegaConf.from_dotlist([arg])
        except Exception as err:  # YAML or OmegaConf grammar errors
            raise ConfigError(f"cannot parse {arg!r}: {str(err).splitlines()[0]} (lists are written "
                              "key=[a,b], strings with spaces key='a b')") from None
    cli = OmegaConf.from_dotlist(overrides)
    refuse_moved_keys(cli, "command line")
    check_shapes(cli, "command line")
    resume = OmegaConf.select(cli, "resume", default=None)
    if resume is not None:
        base = _resume_base(resume, conf, cli, argv)
    else:
        base = load_conf_file(resolve_conf_path(conf or DEFAULT_CONF))
        if OmegaConf.select(base, "resume", default=None) is not None:
            raise ConfigError(f"{resolve_conf_path(conf or DEFAULT_CONF)}: resume cannot be set in a config file; "
                              "pass resume=<run dir> on the command line")
    file_method, cli_method = _method_name(base), OmegaConf.select(cli, "method.name", default=None)
    if cli_method is not None and cli_method != file_method and "method" in base:
        base.method = {"name": cli_method}  # the file's hyperparameters belong to the file's method
    cfg = _merge(_method_name(base, cli), base, cli)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        where = "the command line" if key in _leaf_keys(cli) else (
            f"resume={resume}" if resume is not None else str(resolve_conf_path(conf or DEFAULT_CONF)))
        raise ConfigError(f"{key}: {str(err).splitlines()[0]} (set in {where})") from None
    if cfg.trainer.local_steps is not None:
        cfg.trainer.local_epochs = None  # steps win; keep the resolved config honest
    validate(cfg)
    return cfg


def _resume_base(resume: str, conf: Optional[str], cli: DictConfig, argv: list[str]) -> DictConfig:
    """The run's own config.yaml. The command may repeat the run's conf= and values (the original command
    with resume= appended); only a change to a key outside RESUMABLE_KEYS is refused."""
    saved_path = Path(resume) / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"resume={resume!r}: no config.yaml there; pass a run directory made by fl.train")
    saved = OmegaConf.load(saved_path)
    if conf is not None:  # the whole command, as a fresh run, must describe the same experiment
        changed = config_diff(saved, load_config([a for a in argv if not a.startswith("resume=")]))
    else:
        changed = config_diff(saved, OmegaConf.merge(saved, cli))
    if changed:
        key, old, new = changed[0]
        raise ConfigError(f"{key} cannot change when resuming: the run has {old!r}, this command {new!r} "
                          f"(only {', '.join(RESUMABLE_KEYS)} may)")
    return saved


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
