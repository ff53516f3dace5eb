"""From `conf=NAME key=value ...` to a typed, checked run config.

A config file may `include:` others (conf/NAME.yaml: a paper protocol, a data block in conf/data/, a real
config its synthetic twin overlays); they are merged first, in order, then the file, then the command-line
overrides, then typed against the schema (the method's and the evaluators' blocks included) and checked.
Bad input raises `ConfigError` with a one-line message naming the key (and file) and what would be valid.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from fl.config.arms import expand_arms
from fl.config.blocks import check_choice, chosen, drop_replaced_settings, other_takers, schema, shared_schema
from fl.config.errors import ConfigError, choices_msg, suggest
from fl.core import registry
from fl.core.callbacks import CallbackError, EarlyStopping, callback_class
from fl.core.eval_schedule import last_k_rounds
from fl.core.metric_directions import describe, lookup
from fl.core.plugins import PluginNotFound
from fl.core.run_metrics import run_directions

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
DEFAULT_CONF = "quickstart"

# Keys that may change when resuming; everything else must match the checkpointed run (data.cache*: where the same
# images are read from).
RESUMABLE_KEYS = ("trainer.rounds", "trainer.on_divergence", "fabric.", "logger.", "resume", "data.cache")

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
    "data.client_transform_level": "data.client_transform.level",
    "data.client_transform_after_augment": "data.client_transform.after_augment",
    "trainer.adaptability_every": "evaluators.adaptability.every",
    "trainer.kl_tau": "evaluators.adaptability.kl_tau",
    "method.proj_dim": "model.proj_dim",  # FedDRM's projections and its baselines' share one width
    "server.trim_fraction": "server.aggregator.trim_fraction",  # the trimmed mean's own setting (fl/aggregators/)
}
# Groups that were single values: `data.partition=dirichlet` is now `data.partition.name=dirichlet`.
BECAME_GROUPS = {"data.partition": "data.partition.name", "data.target": "data.target.distribution",
                 "data.client_transform": "data.client_transform.name", "server.aggregator": "server.aggregator.name"}


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
    raise ConfigError(f"conf={name!r} is not a config{suggest(name, available_confs())}; "
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


class _Absent:
    """A key one side of a config_diff does not have (a key added to fl after the run was made)."""

    def __repr__(self) -> str:
        return "no such key"


ABSENT = _Absent()


def config_diff(old: Any, new: Any, ignore: tuple[str, ...] = RESUMABLE_KEYS) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for each resolved leaf that differs, keys starting with `ignore` aside;
    a key missing on one side shows as ABSENT there. A changed choice (a `.name` key) comes first: the settings
    that came or went with it are its consequence, and a message names the cause."""
    a, b = _leaves(old, resolve=True), _leaves(new, resolve=True)
    keys = sorted(a.keys() | b.keys(), key=lambda k: (not k.endswith(".name"), k))
    return [(k, a.get(k, ABSENT), b.get(k, ABSENT)) for k in keys
            if not k.startswith(ignore) and a.get(k, ABSENT) != b.get(k, ABSENT)]


def added_key_message(key: str, new: Any) -> str:
    """Why a run made before `key` existed is not continued: nothing says the key's default is what that run did."""
    return (f"resume: {key} did not exist when the run was made (this version of fl sets {key}={new!r}); a run "
            "continues only under the config it was made with, and nothing says this default is what it did: "
            "start a new run")


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
def _default_schema() -> DictConfig:
    """The schema of the default choices, built once (a config check costs ~0.1 s otherwise, and a sweep plans
    hundreds): the shape check_shapes reads; read-only, it is never changed."""
    shape = schema(chosen())
    OmegaConf.set_readonly(shape, True)
    return shape


def check_shapes(node: DictConfig, where: str) -> None:
    """A scalar where the schema has a group (`trainer=5`, `method: fedprox`) or a key under a list
    (`data.augment.flip=true`) stops here in one line, saying what to write instead."""
    shape, given = _default_schema(), OmegaConf.to_container(node, resolve=False)
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
                example = f"{here}.name={value}" if "name" in at else f"{here}.<key>=..."
                raise ConfigError(f"{where}: {here}={value!r} sets a group to a single value; set its keys, e.g. "
                                  f"{example} (valid keys: {', '.join(list(at.keys())[:8])})")


def load_conf_file(path: Path) -> DictConfig:
    """A YAML config; its `include: [NAME, ...]` files (conf/NAME.yaml) are merged first, in order. Read once per
    version of its files (a sweep or a reproduction loads the same configs hundreds of times, ~40 ms each): a copy of
    the one read last while every file it read holds the same bytes and no plug-in was registered since."""
    path = Path(path)
    plugins = tuple(tuple(table.values()) for table in registry.TABLES.values())
    hit = _READ.get(path)
    if hit is not None and hit[1] == plugins and all(_bytes(f) == held for f, held in hit[0]):
        return copy.deepcopy(hit[2])
    read: list[Path] = []
    node = _load_conf_file(path, (), read)
    _READ[path] = (tuple((f, _bytes(f)) for f in read), plugins, copy.deepcopy(node))
    return node


_READ: dict[Path, tuple] = {}  # path -> (the files read and their bytes, the plug-ins registered, the config)


def _bytes(path: Path) -> bytes | None:
    """A file's bytes (its modification time can stay the same through a quick rewrite), None once it is gone."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def _load_conf_file(path: Path, seen: tuple, read: list[Path]) -> DictConfig:
    read.append(path)
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
        parts.append(_load_conf_file(inc, seen + (path,), read))
    if not parts:
        return node
    merged = parts[0]
    for part in parts[1:]:  # a later include that names another dataset replaces the earlier one's
        drop_replaced_settings(merged, part)
        merged = OmegaConf.merge(merged, part)
    own, inherited = (OmegaConf.select(n, "method.name", default=None) for n in (node, merged))
    if own is not None and own != inherited and "method" in merged:
        merged.method = {"name": own, **variant_settings(merged.method, inherited, own)}
    drop_replaced_settings(merged, node)
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
            if not conf.strip():
                raise ConfigError(f"argument {arg!r} names no config; give conf=NAME (e.g. conf=quickstart), or leave "
                                  f"conf= out for the default ({DEFAULT_CONF})")
        else:
            overrides.append(arg.lstrip("-"))
    return conf, overrides


def _merge(*sources) -> DictConfig:
    """The sources typed against the schema of what they choose (method, dataset, partition)."""
    base = shared_schema(chosen(*sources))  # merge copies it
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


def _elsewhere(key: str, schema_node: DictConfig) -> str:
    """Where a misplaced key does live: another method's hyperparameter (`method.mu` with fedavg), or a key of
    another block of the same group (`data.partition.train_fraction` is `data.train_fraction`); "" if nowhere."""
    group, leaf = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
    if group in ("data", "server") and other_takers(key, schema_node):
        return other_takers(key, schema_node)
    if group == "method":
        takers = sorted(n for n, spec in registry.METHODS.items()
                        if leaf != "name" and leaf in {f.name for f in fields(spec.config_cls)})
        if takers:
            return (f": method.{leaf} is a hyperparameter of {', '.join(takers)}, not of "
                    f"method.name={OmegaConf.select(schema_node, 'method.name')}")
        return ""
    block = OmegaConf.select(schema_node, group) if "." in key else None
    homes = [f"{group}.{k}" for k in _leaf_keys(block) if k.rsplit(".", 1)[-1] == leaf] if isinstance(
        block, DictConfig) else []
    homes += [new for old, new in BECAME_GROUPS.items() if old == f"{group}.{leaf}" != key.rpartition(".")[0]]
    if not homes:
        return ""
    blocks = ", ".join(f"'{h.rpartition('.')[0]}'" for h in homes)
    return f": {leaf} is a key of {blocks}, not of '{key.rpartition('.')[0]}'; write {' or '.join(homes)}"


def _omegaconf_message(err: OmegaConfBaseException, schema_node: DictConfig, sources=()) -> str:
    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, ConfigKeyError) or "not in" in str(err):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema_node, parent) if parent else schema_node
        valid = list(node.keys()) if isinstance(node, DictConfig) else []
        where = f"under '{parent}'" if parent else "at the top level"
        hint = _elsewhere(key, schema_node) or suggest(leaf, valid, f"{parent}." if parent else "")
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


# Fabric strategies that Fabric accepts but fl.train cannot run, with why (they were accepted and failed or misled).
REFUSED_STRATEGIES = {
    **dict.fromkeys(("ddp_spawn", "ddp_fork", "ddp_notebook"), "it starts its processes from a function, and "
                    "fl.train runs as one script per process (Fabric launches copies of the command)"),
    "dp": "DataParallel splits one module's forward over the GPUs of one process, and fl.train calls its model "
          "itself, so it would train on one GPU",
}


def check_strategy(strategy: str) -> None:
    """A strategy fl.train cannot run stops here, before anything is written, naming those that work."""
    if strategy in REFUSED_STRATEGIES:
        raise ConfigError(f"fabric.strategy={strategy!r} is not supported: {REFUSED_STRATEGIES[strategy]}; use "
                          "fabric.strategy=ddp (one process per device: fabric.devices=N), auto (one device, or "
                          "ddp when fabric.devices > 1) or ddp_find_unused_parameters_true")


def validate(cfg: DictConfig) -> None:
    """Range / choice checks from the field metadata, names against the registries, the method's resolve."""
    check_strategy(cfg.fabric.strategy)
    _check_node(cfg, "")
    spec = registry.METHODS[cfg.method.name]
    if spec.resolve is not None:
        spec.resolve(cfg)
    stops = [("trainer.early_stop", cfg.trainer.early_stop)] if cfg.trainer.early_stop.metric is not None else []
    for i, entry in enumerate(cfg.callbacks):
        try:
            cls, _ = callback_class(entry)
        except CallbackError as err:
            raise ConfigError(f"callbacks[{i}]: {err}") from None
        if issubclass(cls, EarlyStopping):
            stops.append((f"callbacks[{i}]", entry))
    check_aggregator(cfg, spec)
    for name in cfg.data.augment:
        check_choice("data.augment", name, registry.AUGMENTATIONS)
    for name in cfg.trainer.evaluators or []:
        check_choice("trainer.evaluators", name, registry.EVALUATORS)
    check_choice("model.name", cfg.model.name, registry.MODELS)
    for where, node in stops:  # after the evaluators' names: they say what the run logs
        check_watched(cfg, where, node)
    name = cfg.logger.run_name
    if name is not None and (str(name) in ("", ".", "..") or any(c in str(name) for c in "/\\")):
        raise ConfigError(f"logger.run_name={str(name)!r} must be one folder name (no '/', not '..'); the run "
                          "directory is logger.output_dir/<run_name>: set logger.output_dir to move it")
    check_finetune_window(cfg)
    check_unused_settings(cfg, spec)
    check_compile_backend(cfg.trainer.compile_backend)
    if cfg.trainer.local_steps is None and cfg.trainer.local_epochs is None:
        raise ConfigError("trainer.local_epochs and trainer.local_steps are both null; set one of them")
    if cfg.fabric.strategy.startswith("ddp") and cfg.fabric.accelerator == "cpu" and cfg.fabric.precision not in (
            "32-true", "32", "64-true", "64", "bf16-mixed", "16-mixed"):
        raise ConfigError(f"fabric.precision={cfg.fabric.precision!r} is not supported on CPU; "
                          "use 32-true, 64-true, bf16-mixed or 16-mixed")


def check_compile_backend(backend: str) -> None:
    if backend == "inductor":
        return  # torch's default: no need to import Dynamo to know it
    from torch._dynamo import list_backends

    if backend not in list_backends(exclude_tags=()):
        raise ConfigError(f"trainer.compile_backend={backend!r} is not a torch.compile backend; valid: "
                          f"{', '.join(list_backends())}, or a debugging one such as eager or aot_eager "
                          "(torch._dynamo.list_backends(exclude_tags=()) lists every one)")


def check_finetune_window(cfg: DictConfig) -> None:
    """With local fine-tuning rounds (`finetune.after_round`), the summary's mean over the last K evaluations must
    average fine-tuned models only: a window reaching back before the fine-tuning mixes two different models into
    one number (the papers that fine-tune report the last rounds, all inside the fine-tuning)."""
    after = cfg.finetune.after_round
    if after is None:
        return
    t = cfg.trainer
    if after >= t.rounds:
        raise ConfigError(f"finetune.after_round={after} leaves no fine-tuning round: it must be < "
                          f"trainer.rounds={t.rounds}")
    window = last_k_rounds(cfg)
    if window[0] < after:
        inside = sum(r >= after for r in window)
        raise ConfigError(
            f"trainer.last_k={t.last_k} averages the evaluations after rounds {', '.join(str(r + 1) for r in window)} "
            f"(trainer.eval_every={t.eval_every}), but fine-tuning starts after round {after} "
            f"(finetune.after_round): the summary would mix models from before it; set trainer.last_k<={inside}, or "
            f"finetune.after_round<={window[0]}")


def check_watched(cfg: DictConfig, where: str, node: DictConfig) -> None:
    """Early stopping's metric (`node`: trainer.early_stop, or an EarlyStopping entry of `callbacks`) is one the run
    logs, known before it starts (fl/core/run_metrics.py), and declared better one way; its `mode`, left out, becomes
    that direction, and one against it is refused."""
    metric, mode = node.metric, node.get("mode")
    if metric.startswith("val/") and not cfg.data.val_fraction:
        raise ConfigError(f"{where}.metric={metric!r} needs validation splits: set data.val_fraction (e.g. 0.1)")
    logged = run_directions(cfg)
    known, direction = lookup(metric, logged)
    if not known:
        names = sorted(k for k, d in logged.items() if d is not None and not k.endswith("*"))
        raise ConfigError(f"{where}.metric={metric!r} is not a metric this run logs{suggest(metric, names)}; "
                          f"those of method.name={cfg.method.name} and its evaluators better one way: "
                          f"{', '.join(names)}")
    if direction is None:
        raise ConfigError(f"{where}.metric={metric!r} is a diagnostic, declared neither higher nor lower better; "
                          "early stopping needs a metric that is better one way")
    if mode is None:
        node.mode = direction
    elif mode != direction:
        raise ConfigError(f"{where}.mode={mode!r} is against {metric}, whose logger declares {describe(direction)} "
                          f"(mode {direction}); leave mode out, it follows the metric")


def check_aggregator(cfg: DictConfig, spec) -> None:
    """An aggregator other than the mean only where the method's server step takes the uploads' mean, and with
    settings that can work with the clients a round trains (when trainer.sampling=fixed fixes their number)."""
    block = cfg.server.aggregator
    own = spec.server_cls.own_aggregation(cfg.method) if block.name != "mean" else None
    if own:
        raise ConfigError(f"server.aggregator.name={block.name!r} cannot apply to method.name={cfg.method.name!r}: "
                          f"{own}; leave server.aggregator.name=mean")
    check = registry.AGGREGATORS[block.name].check
    if check is not None and cfg.trainer.sampling == "fixed":
        trained = cfg.data.num_clients - cfg.data.new_clients.count
        problem = check(block, max(1, min(trained, round(cfg.trainer.participation * trained))))
        if problem:
            raise ConfigError(problem)


def check_unused_settings(cfg: DictConfig, spec) -> None:
    """Settings that only take effect with another one, given without it: refused rather than silently ignored."""
    s, f = cfg.state, cfg.finetune
    if s.dir is not None and s.cache_mb is None:
        raise ConfigError(f"state.dir={s.dir!r} is used only with state.cache_mb (client states on disk); without it "
                          "they stay in memory: set state.cache_mb=MiB too, or leave state.dir out")
    if f.lr is not None and f.after_round is None and not spec.client_cls.finetunes_for_evaluation:
        raise ConfigError(f"finetune.lr={f.lr} is read only in fine-tuning rounds (finetune.after_round) and by "
                          f"methods that fine-tune before evaluating (fedavg_ft); method.name={cfg.method.name!r} "
                          "without finetune.after_round never reads it")
    if f.schedule != "constant" and (f.lr is None or f.after_round is None):
        missing = " and ".join(k for k, v in (("finetune.lr", f.lr), ("finetune.after_round", f.after_round))
                               if v is None)
        raise ConfigError(f"finetune.schedule={f.schedule!r} decays finetune.lr over the fine-tuning rounds "
                          f"(finetune.after_round on); set {missing}, or leave finetune.schedule out")


def _method_name(*sources) -> Any:
    name = "fedavg"
    for src in sources:
        picked = OmegaConf.select(src, "method.name", default=None)
        if picked is not None:
            name = picked
    return name


def load_config(argv: list[str], check: bool = True) -> DictConfig:
    """Build the run config from `conf=NAME key=value ...`; raises ConfigError on bad input. `check=False` stops
    after typing (unknown keys and wrong types are still refused) without the range, name and cross-key checks of
    `validate`: a method's help shows its hyperparameters for a config that could not run yet (FedPALS without a
    target)."""
    registry.load_plugins()
    conf, overrides = parse_argv(argv)
    try:
        cli = OmegaConf.from_dotlist(overrides)
    except Exception:
        for arg in overrides:  # one at a time, so the message names the bad one
            try:
                OmegaConf.from_dotlist([arg])
            except Exception as err:  # YAML or OmegaConf grammar errors
                raise ConfigError(f"cannot parse {arg!r}: {str(err).splitlines()[0]} (lists are written "
                                  "key=[a,b], strings with spaces key='a b')") from None
        raise
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
    import_config_plugins(base, cli)
    file_method, cli_method = _method_name(base), OmegaConf.select(cli, "method.name", default=None)
    if cli_method is not None and cli_method != file_method and "method" in base:
        base.method = {"name": cli_method, **variant_settings(base.method, file_method, cli_method)}
    drop_replaced_settings(base, cli)
    cfg = _merge(base, cli)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        where = "the command line" if key in _leaf_keys(cli) else (
            f"resume={resume}" if resume is not None else str(resolve_conf_path(conf or DEFAULT_CONF)))
        raise ConfigError(f"{key}: {str(err).splitlines()[0]} (set in {where})") from None
    if cfg.trainer.local_steps is not None:
        cfg.trainer.local_epochs = None  # steps win; keep the resolved config honest
    if check:
        validate(cfg)
        check_evaluator_settings(cfg, cli)
    return cfg


def variant_settings(block: DictConfig, old: Any, new: str) -> dict:
    """The file's method settings that `method.name=new` keeps: the file's hyperparameters belong to the file's
    method, except where `new` is a variant of it (its config subclasses the file method's, as FedACD_base's does
    FedACD's): then it keeps those of the fields it inherits unchanged, and its own redefined ones take its
    defaults."""
    if not (isinstance(old, str) and isinstance(new, str) and old in registry.METHODS and new in registry.METHODS):
        return {}  # a bad name is refused with the schema's message
    parent, child = (registry.METHODS[m].config_cls.__dataclass_fields__ for m in (old, new))
    if not issubclass(registry.METHODS[new].config_cls, registry.METHODS[old].config_cls):
        return {}
    return {k: v for k, v in block.items_ex(resolve=False) if k != "name" and k in child and child[k] is parent.get(k)}


def check_evaluator_settings(cfg: DictConfig, cli: DictConfig) -> None:
    """An evaluator's setting given on the command line for an evaluator the run does not run: refused (a config file
    may set one for the runs that enable it)."""
    given = OmegaConf.select(cli, "evaluators", default=None)
    running = registry.evaluator_names(cfg.trainer.evaluators)
    for name in given or {}:
        if name not in running:
            key = next(iter(_leaf_keys(cli.evaluators[name])), None)
            shown = f"evaluators.{name}.{key}" if key else f"evaluators.{name}"
            raise ConfigError(f"{shown}={OmegaConf.select(cli, shown)} is read only when the {name!r} evaluator "
                              f"runs; trainer.evaluators runs [{', '.join(running)}]: add {name} to it, or leave "
                              f"{shown} out")


def config_plugins(*sources) -> list[str]:
    """The `plugins` the sources name, the last that sets it winning (a list replaces a list, as in a merge)."""
    value = None
    for src in sources:
        given = OmegaConf.select(src, "plugins", default=None)
        value = value if given is None else given
    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"plugins={value!r} must be a list of module names, e.g. plugins=[mypackage.fl_plugin]")
    return value


def import_config_plugins(*sources) -> None:
    """Import the modules `plugins` names before anything of the config is checked: what they register can then be
    chosen (method.name=, data.name=, ...). A module that is not there stops here in one line."""
    try:
        registry.import_plugins(config_plugins(*sources))
    except PluginNotFound as err:
        raise ConfigError(f"plugins: no module named {err.args[0]!r}; a plug-in module must be importable (an "
                          "installed package, or a folder on PYTHONPATH)") from None


def import_argv_plugins(argv: list[str]) -> None:
    """The `plugins` of a command that lists rather than runs (`--list KIND plugins=[...]`, or conf=NAME's)."""
    conf, overrides = parse_argv(argv)
    cli = OmegaConf.from_dotlist([a for a in overrides if a.startswith("plugins=")])
    import_config_plugins(load_conf_file(resolve_conf_path(conf)) if conf else OmegaConf.create(), cli)


def read_run_config(path: Path) -> DictConfig:
    """A run directory's config.yaml, as fl.train wrote it: a damaged file, or one written before a key moved
    (MOVED_KEYS: its checkpoints hold the old names too), stops here in one line."""
    try:
        node = OmegaConf.load(path)
    except Exception as err:  # a YAML syntax error, or bytes that are not text
        raise ConfigError(f"resume: cannot parse {path}: {(str(err).splitlines() or [''])[0][:160]}; it is the run's "
                          "config as fl.train wrote it: restore it, or start a new run") from None
    if not isinstance(node, DictConfig) or not node:
        raise ConfigError(f"resume: {path} is not a run config (expected the mapping of keys fl.train writes); restore "
                          "it, or start a new run")
    try:
        refuse_moved_keys(node, str(path))
    except ConfigError as err:
        raise ConfigError(f"resume: {err}; the run was made by an older version of fl, whose checkpoints this one "
                          "cannot continue: start a new run") from None
    return node


def _resume_base(resume: str, conf: Optional[str], cli: DictConfig, argv: list[str]) -> DictConfig:
    """The run's own config.yaml. The command may repeat the run's conf= and values (the original command
    with resume= appended); only a change to a key outside RESUMABLE_KEYS is refused."""
    saved_path = Path(resume) / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"resume={resume!r}: no config.yaml there; pass a run directory made by fl.train")
    saved = read_run_config(saved_path)
    if conf is not None:  # the whole command, as a fresh run, must describe the same experiment
        changed = config_diff(saved, load_config([a for a in argv if not a.startswith("resume=")]))
    else:
        changed = config_diff(saved, OmegaConf.merge(saved, cli))
    if changed:
        key, old, new = changed[0]
        if old is ABSENT:
            raise ConfigError(added_key_message(key, new))
        raise ConfigError(f"{key} cannot change when resuming: the run has {old!r}, this command {new!r} "
                          f"(only {', '.join(RESUMABLE_KEYS)} may)")
    return saved


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
