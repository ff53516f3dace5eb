"""Evaluation: each client's model on its own test split, the global model on the pooled test set, and the
Evaluator interface through which every other evaluation metric plugs in (fl/metrics/)."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from fl.core.context import EvalContext
from fl.core.exchange import gather_objects
from fl.core.global_predictions import model_tensors, predicts_with_model, same_tensors
from fl.core.metric_directions import HIGHER, LOWER, Directions, declared
from fl.core.registry import NoSettings

# What summarize_clients and evaluate_clients log (test/X, and val/X on validation splits), and which way is better.
CLIENT_METRICS: Directions = {"acc_mean_clients": HIGHER, "acc_weighted": HIGHER, "acc_weighted_train": HIGHER,
                              "acc_micro": HIGHER, "acc_std_clients": LOWER, "acc_worst10": HIGHER}
NEW_CLIENT_METRICS: Directions = {"acc_original_clients": HIGHER, "acc_new_clients": HIGHER}
GLOBAL_METRICS: Directions = {"acc_global_micro": HIGHER}


def client_metric_directions(cfg, client_cls: type) -> Directions:
    """evaluate_clients' keys in a run of `cfg` (under test/; the loop renames them val/ on validation splits)."""
    out = dict(CLIENT_METRICS)
    if cfg.data.new_clients.count:
        out.update(NEW_CLIENT_METRICS)
    if client_cls.has_global_model:
        out.update(GLOBAL_METRICS)
    return {f"test/{k}": v for k, v in out.items()}


def summarize_clients(correct: Tensor, total: Tensor, train_sizes: list[int], prefix: str = "test/") -> dict[str,
                                                                                                             float]:
    """acc_mean_clients (unweighted), acc_weighted (by test size), acc_weighted_train (by train size,
    FedDRM's Table 2), acc_micro (pooled correct / pooled total), std across clients (unbiased) and
    the mean of the worst 10% of clients (at least one). Clients without test samples are skipped."""
    has = total > 0
    acc = correct[has] / total[has]
    test_w = total[has] / total[has].sum()
    train = torch.tensor(train_sizes, dtype=torch.float64, device=acc.device)[has]
    k = max(1, math.ceil(0.1 * len(acc)))
    out = {
        "acc_mean_clients": acc.mean(),
        "acc_weighted": (test_w * acc).sum(),
        "acc_weighted_train": (train / train.sum() * acc).sum(),
        "acc_micro": correct[has].sum() / total[has].sum(),
        "acc_std_clients": acc.std() if len(acc) > 1 else torch.zeros((), dtype=acc.dtype),
        "acc_worst10": acc.sort().values[:k].mean(),
    }
    return {prefix + k: float(v) for k, v in out.items()}


class Evaluator:
    """A metric every method gets on evaluation rounds (system accuracy, adaptability, ...). Register a
    subclass with `@register_evaluator`; `trainer.evaluators` names the ones that run (null = those with
    `default = True`), and its settings are the typed block `evaluators.<name>` (`Settings`).

    The loop builds one instance per process for the run, so an evaluator keeps its own state. Every
    process calls `evaluate` (collectives are allowed) and it must return the same dict on every process.
    """

    name: ClassVar[str]
    default: ClassVar[bool] = True
    Settings: ClassVar[type] = NoSettings
    #: also run on the clients' validation splits (data.val_fraction), its test/* keys logged as val/*; the
    #: evaluator then gets a context whose data has the validation splits in place of the test splits
    on_validation: ClassVar[bool] = False
    #: the keys `evaluate` returns (client/<i>/... aside) and which way each is better (fl/core/metric_directions.py)
    metric_directions: ClassVar[Directions] = {}

    @classmethod
    def logged_directions(cls, cfg, client_cls: type) -> Directions:
        """The keys it logs in a run of `cfg` with the method's `client_cls`, known before the run starts: by
        default all it declares; an evaluator that skips some methods or data says so here."""
        return declared(cls)

    def __init__(self, settings: Any):
        self.hp = settings

    def on_local_model(self, ctx: EvalContext, cid: int) -> None:
        """Right after client cid's local training, before its upload is reduced, on the process that
        trained it (`ctx.module` holds the local model; leave its weights alone)."""

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        raise NotImplementedError


def evaluate_clients(ctx: EvalContext) -> dict[str, float]:
    """Each client's model on its own test split (after `personalize`, whose scalars are logged as
    client/<i>/<name>), and the global model on the pooled test set when the method has one.

    A client whose evaluated model is the global model (the same tensors, predicting through them alone) and whose
    test samples are rows of the pooled test set takes its counts from the global model's predictions on that set
    (`EvalContext.global_predictions`), so each image is scored once per distinct model; any other client is
    scored by its own pass. A row is the same image normalised the same way in both, so only the kernels' choice
    by batch size can tell the two apart (bench/eval_cost.py counts the rows where it does)."""
    from torchmetrics.classification import MulticlassAccuracy  # torchmetrics loads with the first evaluation

    from fl.core.accuracy import GroupedAccuracy

    fabric, data, m = ctx.fabric, ctx.data, ctx.module
    shared = ctx.global_predictions() if m.has_global_model else None
    reference = model_tensors(m) if shared is not None and shares_global_passes(ctx) else None
    per_client = GroupedAccuracy(data.num_clients).to(fabric.device)
    logs: dict[int, dict[str, float]] = {}
    for cid in range(fabric.global_rank, data.num_clients, fabric.world_size):
        logs[cid] = ctx.load_personalized(cid)
        rows = data.pooled_test_rows(cid) if reference is not None else None
        if rows is not None and same_tensors(m, reference):
            rows = rows if isinstance(rows, slice) else rows.to(fabric.device, non_blocking=True)
            per_client.update(shared.preds[rows], shared.labels[rows], cid)
            continue
        for logits, y in m.eval_pass(data.clients[cid].test):
            per_client.update(logits.argmax(1), y, cid)
    correct, total = per_client.counts()
    metrics = summarize_clients(correct, total, data.train_sizes())
    if data.num_new_clients:  # held out of training: reported apart, weighted by test size
        k = data.num_train_clients
        for name, part in (("original", slice(0, k)), ("new", slice(k, None))):
            metrics[f"test/acc_{name}_clients"] = float(correct[part].sum() / total[part].sum().clamp_min(1))
    acc = (correct / total.clamp_min(1)).tolist()
    metrics.update({f"client/{i}/acc": a for i, a in enumerate(acc)})
    for part in gather_objects(fabric, logs):
        metrics.update({f"client/{cid}/{k}": float(v) for cid, values in part.items() for k, v in values.items()})
    if shared is not None:  # every process holds every prediction: no sum across processes
        pooled = MulticlassAccuracy(data.num_classes, average="micro", sync_on_compute=False).to(fabric.device)
        pooled.update(shared.preds, shared.labels)
        metrics["test/acc_global_micro"] = float(pooled.compute())
    return metrics


def shares_global_passes(ctx: EvalContext) -> bool:
    """Whether a client may take the global model's predictions as its own when its model holds the same tensors:
    the module predicts through its model alone, and evaluation batches are not augmented (`data.eval_augment`
    draws per client and batch) nor transformed per owner."""
    d = ctx.cfg.data
    return (predicts_with_model(ctx.module) and not (d.eval_augment and d.augment)
            and ctx.data.pooled_test().owner is None)
