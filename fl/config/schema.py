"""The typed run configuration: OmegaConf structured dataclasses with validation metadata.

Every key a user can set is declared here, in a method's own config class (registered under the method's
name), or in an evaluator's settings class; fl/config/load.py builds the schema of a run from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from fl.core import registry


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
class EarlyStopConfig:
    """Stop when a metric stops improving (fl/core/callbacks.py EarlyStopping), counted in evaluation rounds."""
    metric: Optional[str] = param(None, help="the metric watched after each evaluation, e.g. val/acc_mean_clients "
                                  "(val/* needs data.val_fraction > 0; watching test/* selects on the test set); "
                                  "null = off")
    patience: int = param(5, ge=1, help="the run stops after this many evaluations in a row without improvement")
    mode: Optional[str] = param(None, choices=["max", "min"], help="max: higher is better; min: lower; null = the "
                                "direction the metric's logger declares (a mode against it is refused)")
    min_delta: float = param(0.0, ge=0.0, help="an improvement must exceed the best so far by more than this")


@dataclass
class TrainerConfig:
    rounds: int = param(20, ge=1, help="communication rounds")
    local_epochs: Optional[int] = param(1, ge=1,
                                        help="local passes over the client's data (ignored if local_steps is set)")
    local_steps: Optional[int] = param(None, ge=1, help="local optimizer steps per round; overrides local_epochs")
    batch_size: int = param(32, ge=1)
    parallel_clients: int = param(1, ge=1, help="train this many clients of a round at once, vmapped (methods that "
                                  "declare a functional local step; others run one at a time, with a notice)")
    compile: bool = param(False, help="torch.compile the vmapped local step (trainer.parallel_clients > 1)")
    compile_backend: str = param("inductor", help="torch.compile's backend with trainer.compile: inductor (kernels "
                                 "generated for the device), or another of torch._dynamo.list_backends(), e.g. "
                                 "eager (Dynamo's graphs, no generated kernels: no compiler needed)")
    drop_last: bool = False
    participation: float = param(1.0, gt=0.0, le=1.0, help="fraction of clients sampled each round")
    sampling: str = param("fixed", choices=["fixed", "bernoulli"],
                          help="fixed: round(participation x clients) clients each round; bernoulli: each client "
                          "independently with probability participation (a round may have none: it trains nothing)")
    eval_every: int = param(1, ge=1, help="evaluate every k rounds (and always at the last round)")
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    eval_batch_size: Optional[int] = param(None, ge=1, help="evaluation batch size; null: 128 on a CPU (within "
                                           "30% of the fastest measured there, bench/README.md), 1024 on a GPU")
    checkpoint_every: int = param(5, ge=0, help="checkpoint every k rounds; 0 = only at the end")
    last_k: int = param(5, ge=1, help="summary reports the mean over the last K evaluations")
    on_divergence: str = param("stop", choices=["stop", "warn"],
                               help="a client's training loss above 1000 x max(1, the first round's mean loss), or "
                               "its uploaded parameters' norm above 1000 x the initial model's: stop (exit 1, the "
                               "last checkpoint kept) or warn and go on; summary.json records it as 'diverged'")
    evaluators: Optional[list] = param(None, help="extra evaluation metrics to compute (see fl.metrics.evaluators); "
                                       "null = every evaluator registered as default, [] = none")


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
class FinetuneConfig:
    after_round: Optional[int] = param(None, ge=0, help="rounds from this one on are local fine-tuning: no "
                                       "aggregation, each client trains its own copy of the global model with plain "
                                       "cross-entropy (FedDRM's FT baselines: 700 of 800 rounds); the summary's last_k "
                                       "evaluations must all come after it; null = off")
    lr: Optional[float] = param(None, gt=0.0, help="fine-tuning learning rate (these rounds and FedAvg-FT's "
                                "fine-tuning before evaluation); null = the rate optim.round_schedule gives the round")
    schedule: str = param("constant", choices=["constant", "cosine"],
                          help="with finetune.lr: constant, or cosine from it to 0 over the fine-tuning rounds")


@dataclass
class FabricConfig:
    accelerator: str = param("cpu", choices=["cpu", "cuda", "gpu", "mps", "auto"])
    devices: Any = 1
    strategy: str = param("auto", choices=["auto", "ddp", "ddp_find_unused_parameters_true"],
                          help="auto: one process on one device (ddp when fabric.devices > 1); ddp: one process per "
                          "device, started as copies of the command (torchrun, srun or Fabric itself)")
    precision: str = param(
        "32-true", choices=["32-true", "32", "64-true", "64", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
    )
    num_nodes: int = param(1, ge=1)
    cpu_threads: Optional[int] = param(None, ge=1, help="torch intra-op threads per process; CPU kernels reduce "
                                       "in a thread-dependent order, so fix it to compare runs bitwise")
    deterministic: bool = param(False, help="deterministic GPU kernels (torch.use_deterministic_algorithms, "
                                "deterministic cuDNN, CUBLAS_WORKSPACE_CONFIG): the same run on the same GPU gives the "
                                "same bits, at some speed; an op without such a kernel warns, naming itself")


@dataclass
class PartitionConfig:
    """The keys every partition takes; the chosen partition's own settings (its registration's `Settings`:
    alpha, classes_per_client, ...) join them as data.partition.* keys (fl/data/partitions/)."""
    name: str = param("dirichlet", help="how the pool is split over the clients (python -m fl.train --list "
                      "partitions)")
    labels: str = param("label", choices=["label", "fine"],
                        help="fine: partition on CIFAR-100's fine labels while training on coarse (FedDRM)")
    seed: Optional[int] = param(None, ge=0, help="seed of the split; defaults to the run seed")


@dataclass
class TargetConfig:
    """A target client with its own label distribution (FedPALS): validation and test data follow it."""
    distribution: Any = param(None, help="null, 'partition' (one more partition is the target), 'test' (the "
                              "official test split's label marginal, FedPALS' iWildCam) or K probabilities")
    domain: Optional[str] = param(None, help="hold this domain out as the target client (FedPALS' PACS)")
    val_size: int = param(500, ge=1, help="target validation samples (from the official test split) when "
                          "data.target.distribution is a list of probabilities")
    drop_labels: list = param([], help="labels removed from the target's validation and test data")
    clients_follow: bool = param(False, help="redraw every client's data with the target's label mix, keeping n_i "
                                 "(FedPALS' Oracle baseline)")


@dataclass
class NewClientsConfig:
    """Clients held out of training and evaluated at the end (pFedFDA's Table 4): the last `count` clients."""
    count: int = param(0, ge=0, help="the last `count` clients never train; every evaluation reports them apart "
                       "(test/acc_new_clients) from the others (test/acc_original_clients)")
    corruption: str = param("none", choices=["none", "motion_blur", "defocus_blur", "gaussian_noise", "shot_noise",
                                             "impulse_noise", "frost", "fog", "brightness", "contrast",
                                             "jpeg_compression"],
                            help="a CIFAR-C corruption applied to all of the new clients' images")
    severity: int = param(3, ge=1, le=5, help="its severity (Table 4: 3)")


@dataclass
class ClientTransformConfig:
    """The keys every client transform takes; the chosen one's own settings (its registration's `Settings`) join
    them as data.client_transform.* keys (fl/data/client_transforms/)."""
    name: str = param("none", help="per-client covariate shift applied to each client's train and test data "
                      "(python -m fl.train --list client_transforms)")
    after_augment: bool = param(False, help="apply the client transform to each batch after data.augment (FedDRM's "
                                "official order: crop, then colour) instead of once to the stored images; transforms "
                                "with a per-batch form only (feddrm_color)")


@dataclass
class DataConfig:
    """The keys every dataset takes: where the data live and how the pool is split over the clients. The chosen
    dataset's own settings (its registration's `Settings`: image_size, download, ...) join them as data.* keys;
    fl/config/load.py builds the block."""
    name: str = param("embedded", help="the dataset (python -m fl.train --list datasets)")
    root: str = param("data", help="where datasets live (for `arrays`: the file) and the embedded dataset is cached")
    on_device: bool = param(True, help="keep all client data on the accelerator (index batching); false keeps "
                            "it in host memory and moves each batch; a memory-mapped pool (data.cache) is read from "
                            "its map either way")
    cache: str = param("auto", choices=["auto", "memory", "mmap"],
                       help="decoded images of the image-folder datasets (tinyimagenet, domainnet, office_caltech10, "
                       "pacs, iwildcam; written once to disk): memory = read into memory; mmap = memory-mapped, each "
                       "batch read from the map (pools larger than memory; the generated datasets too); auto = mmap "
                       "when the pool takes more than data.cache_auto_fraction of the available memory")
    cache_auto_fraction: float = param(0.25, gt=0.0, le=1.0, help="data.cache=auto memory-maps a pool whose images "
                                       "take more than this share of the memory available (MemAvailable) at load")
    cache_dir: Optional[str] = param(None, help="where the image caches go (<cache_dir>/<data.name>/); null: a "
                                     ".fl_cache folder in the dataset's own folder")
    num_clients: int = param(20, ge=1)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    pool_splits: bool = param(False, help="merge the official train and test splits before partitioning (FedDRM)")
    test_split: str = param("client", choices=["client", "official"],
                            help="client: hold out test_fraction of each client's samples; official: draw each "
                            "client's test set from the official test split with its own (domain, label) mix")
    test_fraction: float = param(0.2, gt=0.0, lt=1.0, help="share of each client's samples held out as its test split")
    val_fraction: float = param(0.0, ge=0.0, lt=1.0, help="share of each client's training data held out as its "
                                "validation split (seeded): val/* metrics for every method, for model selection; "
                                "0 = none (the papers' protocols)")
    train_fraction: float = param(1.0, gt=0.0, le=1.0, help="keep this share of each client's training set "
                                  "(pFedFDA's data scarcity)")
    max_client_train: Optional[int] = param(None, ge=1, help="cap on each client's training set (FedBN/FedMosaic)")
    client_train_fraction: Optional[list] = param(None, help="per client, share of its training set kept "
                                                  "(overrides train_fraction)")
    drop_labels: Optional[list] = param(None, help="per client, labels removed from its data, e.g. [[0], [1], [2]]")
    public_size: int = param(0, ge=0, help="size of the unlabeled public set held out from all clients (FedMosaic)")
    target: TargetConfig = field(default_factory=TargetConfig)
    new_clients: NewClientsConfig = field(default_factory=NewClientsConfig)
    client_transform: ClientTransformConfig = field(default_factory=ClientTransformConfig)
    augment: list = param([], help="training-time augmentation, applied per sample on the device in this order: "
                          "flip, crop (pad 4), resized_crop (scale 0.9-1), rotate (+-30 degrees)")
    eval_augment: bool = param(False, help="augment evaluation batches too (seeded per batch), as FedDRM's "
                               "official code crops its test images at random; off: evaluation is deterministic")


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
    pretrained: Optional[str] = param(None, help="initial weights: a torchvision weights name (e.g. "
                                      "ResNet50_Weights.IMAGENET1K_V2, read from torch's hub cache) or a state-dict "
                                      "file; the head is refitted to the task's classes")
    download: bool = param(False, help="let a torchvision weights name be downloaded when it is not cached")
    proj_dim: int = param(0, ge=0, help="width of a Linear+LayerNorm+ReLU projection between the backbone and the "
                          "head, part of the shared backbone (FedDRM's network: 512 -> 256, for FedDRM and its "
                          "baselines); 0 = the head on the backbone's features")
    zero_init_residual: bool = param(False, help="resnet18: the last norm layer of each residual block starts at "
                                     "zero scale, so every block starts as the identity (FedDRM's official code)")


@dataclass
class StateConfig:
    cache_mb: Optional[float] = param(None, ge=0, help="null: every client state in memory; a number: client states "
                                      "on disk (state.dir), one file per client, behind an LRU cache of this many MiB "
                                      "per process, with incremental checkpoints")
    dir: Optional[str] = param(None, help="where the client state files go (state.cache_mb set), each run in a "
                               "folder of its own, <state.dir>/<run name>; default: <run dir>/client_states")


@dataclass
class MethodConfig:
    """Base of every method's typed hyperparameter block."""
    name: str = "fedavg"


@dataclass
class AggregatorConfig:
    """The key every aggregator takes; the chosen one's own settings (its registration's `Settings`: trim_fraction,
    f, max_norm, ...) join it as server.aggregator.* keys (fl/aggregators/)."""
    name: str = param("mean", help="how the server combines the round's uploads, for methods whose server takes their "
                      "weighted mean (python -m fl.train --list aggregators); methods whose aggregation is their own "
                      "take only mean")


@dataclass
class ServerConfig:
    """How the server combines the round's parameter uploads (fl/core/aggregation.py, fl/aggregators/)."""
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)


@dataclass
class WandbConfig:
    mode: str = param("auto", choices=["auto", "online", "offline", "disabled"],
                      help="auto = online when an API key is configured, else offline")
    project: str = "fl"
    entity: Optional[str] = None
    group: Optional[str] = param(None, help="defaults to <dataset>/<partition>")
    tags: list = param([])
    log_checkpoint: bool = param(False, help="online: upload the final checkpoint (checkpoints/last.ckpt) as a W&B "
                                 "model artifact at the end of the run")


@dataclass
class LoggerConfig:
    output_dir: str = "outputs"
    run_name: Optional[str] = param(None, help="defaults to <time>-<method>-<dataset>-s<seed>")
    progress: bool = True
    partition_plots: bool = param(True, help="draw the partition heatmaps (partition_*.png, and on W&B); false skips "
                                  "them: about 0.3 s a run, and matplotlib's import in the first (0.8 s in all for "
                                  "the quickstart), which add up over many short runs (partition.json is written "
                                  "either way)")
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    seed: int = param(0, ge=0)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    state: StateConfig = field(default_factory=StateConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    evaluators: Any = param(None, help="settings of the evaluators, one typed block each (evaluators.<name>)")
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    callbacks: list = param([], help="user callbacks (fl.core.Callback subclasses), called in this order: "
                            "[{class: pkg.module.Class, <its keyword arguments>}, ...]")
    resume: Optional[str] = param(None, help="run directory to continue from its last checkpoint")
    plugins: list = param([], help="modules imported before the config is checked, which register methods, "
                          "datasets, partitions, client transforms, aggregators, models or evaluators: "
                          "[mypackage.fl_plugin, ...]")


# A data plug-in's or aggregator's settings may not take the name of one of these keys (registration refuses it,
# naming both).
registry.SHARED_KEYS.update({kind: frozenset(f.name for f in fields(base)) for kind, base in (
    ("dataset", DataConfig), ("partition", PartitionConfig), ("client transform", ClientTransformConfig),
    ("aggregator", AggregatorConfig))})


def search_spaces(method_cls) -> dict[str, dict]:
    """Sweep ranges a method config declares for its hyperparameters (used by sweep generation)."""
    return {f"method.{f.name}": f.metadata["search"] for f in fields(method_cls)
            if f.metadata and f.metadata.get("search")}
