"""The global model on the target client's validation and test data (FedPALS' protocol): val/target_acc,
test/target_acc and test/target_f1, for every method with a global model when the data has a target
(`data.target`). Macro-F1 averages over the classes present in the test labels (WILDS' convention).
Every process scores the whole (small) sets, so no collective is needed."""
from __future__ import annotations

import torch

from fl.core import EvalContext, Evaluator, register_evaluator
from fl.core.metric_directions import HIGHER, Directions


@register_evaluator
class TargetAccuracy(Evaluator):
    name = "target"
    metric_directions = {"val/target_acc": HIGHER, "test/target_acc": HIGHER, "test/target_f1": HIGHER}

    @classmethod
    def logged_directions(cls, cfg, client_cls: type) -> Directions:
        targeted = cfg.data.target.distribution is not None or cfg.data.target.domain is not None
        return super().logged_directions(cfg, client_cls) if targeted and client_cls.has_global_model else {}

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score  # loads with the run

        target, m = ctx.data.target, ctx.module
        if target is None or not m.has_global_model:
            return {}
        K, device = ctx.data.num_classes, ctx.fabric.device
        ctx.load_client(-1)
        out = {}
        for name, split in (("val", target.val), ("test", target.test)):
            acc = MulticlassAccuracy(K, average="micro").to(device)
            f1 = MulticlassF1Score(K, average="none").to(device)
            for logits, y in m.eval_pass(split):
                preds = logits.argmax(1)
                acc.update(preds, y)
                f1.update(preds, y)
            out[f"{name}/target_acc"] = float(acc.compute())
            if name == "test":
                present = torch.bincount(split.y, minlength=K) > 0
                out["test/target_f1"] = float(f1.compute()[present.to(device)].mean())
        return out
