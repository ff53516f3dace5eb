"""Typed run configuration: OmegaConf structured dataclasses, CLI merging and validation.

Every key a user can set is declared here (or in a method's own config class, registered under the
method's name). Bad input raises `ConfigError` with a one-line message naming the key and what would
be valid; `fl.train` turns it into exit code 2 before any work starts.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
DEFAULT_CONF = "quickstart"


class ConfigError(ValueError):
    """A configuration mistake; the message is one line meant for the user."""


def param(default: Any, *, ge=None, gt=None, le=None, lt=None, choices=None, search=None, help: str = ""):
    """A dataclass field with validation metadata.

    `search` is the sweep range a method declares for its hyperparameter, e.g.
    {"distribution": "log_uniform_values", "min": 1e-3, "max": 1.0} or {"values": [...]}.
    """
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "search": search, "help": help}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainerConfig:
    rounds: int = param(20, ge=1, help="communication rounds")
    local_epochs: Optional[int] = param(1, ge=1, help="local passes over the client's data (ignored if local_steps is set)")
    local_steps: Optional[int] = param(None, ge=1, help="local optimizer steps per round; overrides local_epochs")
    batch_size: int = param(32, ge=1)
    drop_last: bool = False
    participation: float = param(1.0, gt=0.0, le=1.0, help="fraction of clients sampled each round")
    eval_every: int = param(1, ge=1, help="evaluate every k rounds (and always at the last round)")
    eval_batch_size: int = param(1024, ge=1)
    checkpoint_every: int = param(5, ge=0, help="checkpoint every k rounds; 0 = only at the end")
    last_k: int = param(5, ge=1, help="summary reports the mean over the last K evaluations")
    evaluators: Optional[list] = param(None, help="extra evaluation metrics to compute (see fl.metrics.evaluators); "
                                       "null = every evaluator registered as default, [] = none")
    adaptability_every: int = param(5, ge=1, help="local-model adaptability risk and KL(P||Q) diagnostics "
                                    "(fl/metrics/adaptability.py) on evaluation rounds every k rounds and the last")
    kl_tau: float = param(1.0 - 1e-5, gt=0.0, lt=1.0, help="diagonal tau of the template Q in the KL(P||Q) "
                          "diagnostic (FedACD's Eq. 10)")


@dataclass
class OptimConfig:
    name: str = param("sgd", choices=["sgd", "adam", "adamw"])
    lr: float = param(0.05, gt=0.0)
    momentum: float = param(0.0, ge=0.0, lt=1.0)
    weight_decay: float = param(0.0, ge=0.0)
    round_schedule: str = param("constant", choices=["constant", "cosine"],
                                help="learning rate per round: cosine = min_lr + (lr - min_lr)(1 + cos(pi r / R)) / 2")
    min_lr: float = param(0.0, ge=0.0, help="cosine schedule: the learning rate it decays to")


@dataclass
class FabricConfig:
    accelerator: str = param("cpu", choices=["cpu", "cuda", "gpu", "mps", "auto"])
    devices: Any = 1
    strategy: str = param("auto", choices=["auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "dp"])
    precision: str = param(
        "32-true", choices=["32-true", "32", "64-true", "64", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
    )
    num_nodes: int = param(1, ge=1)
    cpu_threads: Optional[int] = param(None, ge=1, help="torch intra-op threads per process; CPU kernels reduce "
                                       "in a thread-dependent order, so fix it to compare runs bitwise")


@dataclass
class DataConfig:
    name: str = param("embedded", help="dataset name (see fl.data registry)")
    root: str = param("data", help="where datasets live and the embedded dataset is cached")
    on_device: bool = param(True, help="keep all client data on the accelerator (index batching); false keeps "
                            "it in host memory and moves each batch")
    download: bool = param(False, help="let torchvision download the dataset where it can (needs a network)")
    variant: Optional[str] = param(None, help="dataset-specific variant, e.g. the EMNIST split")
    num_clients: int = param(20, ge=1)
    partition: str = param("dirichlet", choices=["iid", "dirichlet", "dirichlet_per_client", "classes", "shards",
                                                 "domains"])
    dirichlet_alpha: float = param(0.5, gt=0.0, help="concentration of the Dirichlet label split")
    dirichlet_balance: bool = param(False, help="a client already holding N/M samples gets no more (fedlab)")
    min_client_size: int = param(10, ge=1, help="Dirichlet split is redrawn until every client has this many samples")
    samples_per_client: Optional[int] = param(None, ge=1, help="dirichlet_per_client: samples per client "
                                              "(default: the pool divided evenly)")
    classes_per_client: int = param(2, ge=1, help="classes / domains+classes: classes held by each client")
    class_assignment: str = param("round_robin", choices=["round_robin", "random"],
                                  help="round_robin: consecutive classes of a random permutation; "
                                  "random: NIID-Bench #C=k (class p mod K plus random others)")
    shards_per_client: int = param(5, ge=1, help="shards: label-sorted shards per client (FedDRM's S-SPC)")
    clients_per_domain: int = param(1, ge=1, help="domains: clients carved out of each domain")
    within_domain: str = param("iid", choices=["iid", "dirichlet", "classes"],
                               help="domains: label skew inside each domain (classes = FedMosaic's hybrid)")
    partition_labels: str = param("label", choices=["label", "fine"],
                                  help="fine: partition on CIFAR-100's fine labels while training on coarse (FedDRM)")
    pool_splits: bool = param(False, help="merge the official train and test splits before partitioning (FedDRM)")
    test_split: str = param("client", choices=["client", "official"],
                            help="client: hold out test_fraction of each client's samples; official: draw each "
                            "client's test set from the official test split with its own (domain, label) mix")
    test_fraction: float = param(0.2, gt=0.0, lt=1.0, help="share of each client's samples held out as its test split")
    train_fraction: float = param(1.0, gt=0.0, le=1.0, help="keep this share of each client's training set "
                                  "(pFedFDA's data scarcity)")
    max_client_train: Optional[int] = param(None, ge=1, help="cap on each client's training set (FedBN/FedMosaic)")
    public_size: int = param(0, ge=0, help="size of the unlabeled public set held out from all clients (FedMosaic)")
    target: Any = param(None, help="null, 'partition' (one more partition is the target, FedPALS) or K probabilities")
    target_val_size: int = param(500, ge=1, help="target validation samples (from the official test split) when "
                                 "data.target is a distribution")
    target_domain: Optional[str] = param(None, help="hold this domain out as the target client (FedPALS' PACS)")
    target_drop_labels: list = param([], help="labels removed from the target's validation and test data")
    drop_labels: Optional[list] = param(None, help="per client, labels removed from its data, e.g. [[0], [1], [2]]")
    client_train_fraction: Optional[list] = param(None, help="per client, share of its training set kept "
                                                  "(overrides train_fraction)")
    clients_follow_target: bool = param(False, help="redraw every client's data with the target's label mix, "
                                        "keeping n_i (FedPALS' Oracle baseline)")
    client_transform: str = param("none", choices=["none", "feddrm_color", "cifar_s"],
                                  help="per-client covariate shift applied to each client's train and test data")
    augment: list = param([], help="training-time augmentation, applied per sample on the device in this order: "
                          "flip, crop (pad 4), resized_crop (scale 0.9-1), rotate (+-30 degrees)")
    partition_seed: Optional[int] = param(None, help="seed of the split; defaults to the run seed")
    # embedded, procedurally generated image dataset
    num_classes: int = param(10, ge=2)
    num_domains: int = param(4, ge=1, le=6, help="embedded_domains: number of visual styles")
    samples_per_class: int = param(300, ge=4, help="embedded: images per class; embedded_domains: training "
                                   "images per class and domain (a third as many test images)")
    image_size: Optional[int] = param(None, ge=8, help="side of the (square) images; None = the dataset's default")
    channels: int = param(3, ge=1)
    noise: float = param(0.6, ge=0.0, help="pixel noise std of the embedded dataset (harder when larger)")


@dataclass
class ModelConfig:
    name: str = param("cnn", help="model name (see fl.models registry)")
    width: int = param(32, ge=1, help="channels of the first conv / hidden units")
    norm: str = param("none", choices=["none", "batch", "group"], help="cnn: normalisation after each conv")
    groups: int = param(0, ge=0, help="resnet18 with norm=group: GroupNorm groups per layer; 0 = channels // 32 "
                        "(groups of 32 channels, pFedFDA's ResNet-18-GN)")
    stem: str = param("auto", choices=["auto", "cifar", "imagenet"],
                      help="resnet18 stem: cifar = 3x3 conv, no max-pool; imagenet = 7x7/2 conv + 3x3/2 max-pool; "
                      "auto = cifar for inputs up to 32 px, imagenet above (pFedFDA's TinyImageNet ResNet)")


@dataclass
class MethodConfig:
    """Base of every method's typed hyperparameter block."""
    name: str = "fedavg"


@dataclass
class WandbConfig:
    mode: str = param("auto", choices=["auto", "online", "offline", "disabled"],
                      help="auto = online when an API key is configured, else offline")
    project: str = "fl"
    entity: Optional[str] = None
    group: Optional[str] = param(None, help="defaults to <dataset>/<partition>")
    tags: list = param([])


@dataclass
class LoggerConfig:
    output_dir: str = "outputs"
    run_name: Optional[str] = param(None, help="defaults to <time>-<method>-<dataset>-s<seed>")
    progress: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    seed: int = param(0, ge=0)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    resume: Optional[str] = param(None, help="run directory to continue from its last checkpoint")


# Keys that may change when resuming; everything else must match the checkpointed run.
RESUMABLE_KEYS = ("trainer.rounds", "fabric.", "logger.", "resume")


def _suggest(word: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def _choices_msg(key: str, value: Any, choices) -> str:
    choices = sorted(str(c) for c in choices)
    return f"{key}={value!r} is not valid{_suggest(value, choices)}; choices: {', '.join(choices)}"


def available_confs() -> list[str]:
    """Top-level configs; conf/data/ holds the blocks they include."""
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


def load_conf_file(path: Path, seen: tuple = ()) -> DictConfig:
    """A YAML config; its `include: [data/NAME, ...]` blocks (conf/data/NAME.yaml) are merged first, in
    order, so paper configs share their data settings."""
    if path in seen:
        raise ConfigError(f"include cycle: {' -> '.join(str(p) for p in seen + (path,))}")
    try:
        node = OmegaConf.load(path)
    except Exception as err:  # a YAML syntax error, reported in one line
        raise ConfigError(f"cannot parse {path}: {str(err).splitlines()[0]}") from None
    includes = node.pop("include", [])
    parts = []
    for name in [includes] if isinstance(includes, str) else includes:
        inc = CONF_DIR / f"{name}.yaml"
        if not inc.is_file():
            raise ConfigError(f"{path}: include {name!r} not found (expected {inc})")
        parts.append(load_conf_file(inc, seen + (path,)))
    return OmegaConf.merge(*parts, node) if parts else node


def parse_argv(argv: list[str]) -> tuple[Optional[str], list[str]]:
    """Split CLI arguments into the conf name and OmegaConf dotlist overrides."""
    conf, overrides = None, []
    for arg in argv:
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"argument {arg!r} is not key=value (e.g. conf=quickstart trainer.rounds=5)")
        if arg.startswith("conf="):
            conf = arg.split("=", 1)[1]
        else:
            overrides.append(arg.lstrip("-"))
    return conf, overrides


def _method_config_cls(name: Any):
    from fl.registry import METHODS

    if name not in METHODS:
        raise ConfigError(_choices_msg("method.name", name, METHODS))
    return METHODS[name].config_cls


def _merge(schema_method_name: Any, *sources) -> DictConfig:
    schema = OmegaConf.structured(Config(method=_method_config_cls(schema_method_name)()))
    try:
        return OmegaConf.merge(schema, *sources)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(err, schema)) from None


def _omegaconf_message(err: OmegaConfBaseException, schema: DictConfig) -> str:
    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, ConfigKeyError) or "not in" in str(err):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema, parent) if parent else schema
        valid = list(node.keys()) if isinstance(node, DictConfig) else []
        where = f"under '{parent}'" if parent else "at the top level"
        hint = _suggest(leaf, valid, f"{parent}." if parent else "")
        return f"unknown key '{key}'{hint}; valid keys {where}: {', '.join(valid)}"
    if isinstance(err, ValidationError):
        expected = ""
        node_type = None
        try:
            parent, _, leaf = key.rpartition(".")
            cls = OmegaConf.get_type(OmegaConf.select(schema, parent) if parent else schema)
            node_type = {f.name: f.type for f in fields(cls)}.get(leaf)
        except Exception:  # best effort: the type is a hint only
            pass
        if node_type is not None:
            expected = f"; expected {node_type}" if isinstance(node_type, str) else f"; expected {node_type.__name__}"
        value = getattr(err, "msg", str(err)).split("'")[1] if "'" in getattr(err, "msg", "") else "?"
        return f"{key}={value!r} has the wrong type{expected}"
    return f"{key}: {str(err).splitlines()[0]}"


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
            raise ConfigError(_choices_msg(key, value, meta["choices"]))
        for bound, ok, sym in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                               ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
            b = meta.get(bound)
            if b is not None and not ok(value, b):
                raise ConfigError(f"{key}={value!r} is out of range; it must be {sym} {b}")


def validate(cfg: DictConfig) -> None:
    """Range / choice checks from the field metadata, plus the registries of datasets and models."""
    from fl.registry import DATASETS, METHODS, MODELS

    _check_node(cfg, "")
    if METHODS[cfg.method.name].resolve is not None:
        METHODS[cfg.method.name].resolve(cfg)
    if cfg.data.name not in DATASETS:
        raise ConfigError(_choices_msg("data.name", cfg.data.name, DATASETS))
    from fl.data.augment import AUGMENTATIONS
    from fl.metrics.evaluators import EVALUATORS

    for name in cfg.data.augment:
        if name not in AUGMENTATIONS:
            raise ConfigError(_choices_msg("data.augment", name, AUGMENTATIONS))
    for name in cfg.trainer.evaluators or []:
        if name not in EVALUATORS:
            raise ConfigError(_choices_msg("trainer.evaluators", name, EVALUATORS))
    if cfg.model.name not in MODELS:
        raise ConfigError(_choices_msg("model.name", cfg.model.name, MODELS))
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
    from fl import methods  # noqa: F401  (registers the methods)

    conf, overrides = parse_argv(argv)
    try:
        cli = OmegaConf.from_dotlist(overrides)
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot parse overrides {overrides}: {str(err).splitlines()[0]}") from None
    resume = OmegaConf.select(cli, "resume", default=None)
    if resume is not None:
        base = _resume_base(resume, conf, cli)
    else:
        base = load_conf_file(resolve_conf_path(conf or DEFAULT_CONF))
    file_method, cli_method = _method_name(base), OmegaConf.select(cli, "method.name", default=None)
    if cli_method is not None and cli_method != file_method and "method" in base:
        base.method = {"name": cli_method}  # the file's hyperparameters belong to the file's method
    cfg = _merge(_method_name(base, cli), base, cli)
    if cfg.trainer.local_steps is not None:
        cfg.trainer.local_epochs = None  # steps win; keep the resolved config honest
    validate(cfg)
    return cfg


def _resume_base(resume: str, conf: Optional[str], cli: DictConfig) -> DictConfig:
    run_dir = Path(resume)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"resume={resume!r}: no config.yaml there; pass a run directory made by fl.train")
    if conf is not None:
        raise ConfigError("conf= cannot be combined with resume=; the run's own config.yaml is used")
    for key in _leaf_keys(cli):
        if not key.startswith(RESUMABLE_KEYS):
            raise ConfigError(f"{key} cannot change when resuming; only {', '.join(RESUMABLE_KEYS)} may")
    return OmegaConf.load(saved)


def _leaf_keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, DictConfig):
        return [k for key in node.keys() for k in _leaf_keys(node[key], f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def search_spaces(method_cls) -> dict[str, dict]:
    """Sweep ranges a method config declares for its hyperparameters (used by sweep generation)."""
    return {f"method.{f.name}": f.metadata["search"] for f in fields(method_cls)
            if f.metadata and f.metadata.get("search")}

