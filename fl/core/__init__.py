"""The federated engine: the round loop and what it is made of. Methods, evaluators, datasets and models plug
in through the registry; nothing here imports them."""
from fl.core.batches import augment, batch_indices
from fl.core.callbacks import Callback, EarlyStopping
from fl.core.client import HEAD, ClientModule, Upload
from fl.core.context import EvalContext, RoundContext
from fl.core.evaluation import Evaluator, summarize_clients
from fl.core.federated_data import ClientData, FederatedData, Split, Target
from fl.core.loop import Diverged, Interrupted, Orchestrator, TrainingFault, make_client_module, sample_clients
from fl.core.optim import build_optimizer, finetune_lr, round_lr
from fl.core.precision import float32_island, loss_scaler
from fl.core.registry import (
                              METHODS,
                              MethodSpec,
                              build_model,
                              load_plugins,
                              register_augmentation,
                              register_dataset,
                              register_evaluator,
                              register_method,
                              register_model,
)
from fl.core.seeding import derive_seed, generator, seed_torch
from fl.core.server import Server
from fl.core.state import CheckpointError, latest_checkpoint

__all__ = ["METHODS", "MethodSpec", "build_model", "load_plugins", "register_augmentation", "register_dataset",
           "register_evaluator", "register_method", "register_model", "derive_seed", "generator", "seed_torch",
           "ClientData", "FederatedData", "Split", "Target", "augment", "batch_indices", "build_optimizer",
           "finetune_lr", "round_lr", "HEAD", "ClientModule", "Upload", "EvalContext", "RoundContext", "Server",
           "Evaluator", "GroupedAccuracy", "summarize_clients", "Diverged", "Interrupted", "Orchestrator",
           "TrainingFault", "make_client_module", "sample_clients", "CheckpointError", "latest_checkpoint", "Callback",
           "EarlyStopping", "float32_island", "loss_scaler"]


def __getattr__(name: str):
    """GroupedAccuracy (a torchmetrics Metric) loads on first use, so importing fl.core imports no torchmetrics."""
    if name == "GroupedAccuracy":
        from fl.core.accuracy import GroupedAccuracy
        return GroupedAccuracy
    raise AttributeError(f"module 'fl.core' has no attribute {name!r}")
