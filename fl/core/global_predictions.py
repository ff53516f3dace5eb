"""The global model's predicted labels on the pooled test set, made once per evaluation: the pooled accuracy, the
global-model evaluators and every client whose evaluated model is the global model read them, instead of scoring
the same images with the same parameters again (fl/core/evaluation.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fl.core.client import ClientModule
from fl.core.federated_data import Split

if TYPE_CHECKING:
    from fl.core.context import EvalContext


@dataclass
class PooledPredictions:
    split: Split  # the pooled test set they were made on
    preds: Tensor  # [N] the global model's predicted label of every sample, on the Fabric device
    labels: Tensor  # [N] the true labels, on the same device


def score_pooled(ctx: EvalContext) -> PooledPredictions:
    """The global model (cid -1) loaded and scored on `ctx.data.pooled_test()`: each process scores batches rank,
    rank + world, ... of trainer.eval_batch_size, as the pooled pass always split it, and the predictions are summed
    across processes (each row is scored on exactly one), so every process holds all of them."""
    fabric, m = ctx.fabric, ctx.module
    split = ctx.data.pooled_test()
    ctx.load_client(-1)
    bs, rank, world = ctx.cfg.trainer.eval_batch_size, fabric.global_rank, fabric.world_size
    preds = torch.zeros(len(split), dtype=torch.int64, device=fabric.device)
    for t, (logits, _) in enumerate(m.eval_pass(split, batch_size=bs, start=rank, stride=world)):
        begin = (rank + t * world) * bs
        preds[begin:begin + len(logits)] = logits.argmax(1)
    if world > 1:
        preds = fabric.all_reduce(preds, reduce_op="sum")
    return PooledPredictions(split, preds, split.y.to(fabric.device))


def predicts_with_model(module: ClientModule) -> bool:
    """Whether the module's predictions are its model's output (`predict` and `forward` are ClientModule's), so two
    clients whose models hold the same tensors predict the same labels."""
    cls = type(module)
    return cls.predict is ClientModule.predict and cls.forward is ClientModule.forward


def model_tensors(module: ClientModule) -> dict[str, Tensor]:
    """A copy of the model's parameters and buffers, to compare the clients' models with (`same_tensors`)."""
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def same_tensors(module: ClientModule, reference: dict[str, Tensor]) -> bool:
    """Whether the module's model holds exactly `reference` (bitwise; a NaN differs), with one read of the device."""
    state = module.model.state_dict()
    return not reference or bool(torch.stack([(state[k] == v).all() for k, v in reference.items()]).all())
