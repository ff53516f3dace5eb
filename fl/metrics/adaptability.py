"""Adaptability diagnostics of FedACD's paper (Zhou et al. 2025), computed for every method.

pi_bar = (1/M) sum_n pi^n, the unweighted mean of the M clients' training label proportions.

- test/acc_global_balanced: the global model's accuracy on a uniform test set = the mean over classes of its
  per-class accuracy on the pooled test set (Table 1). When the pooled test set is class-balanced (the
  official test split of CIFAR / Tiny-ImageNet and the embedded twins' stratified held-out split, i.e.
  every `*_20c` FedACD data block) this equals test/acc_global_micro; on an unbalanced pooled test set it is
  the balanced accuracy, test/acc_global_micro the micro accuracy.
- test/acc_global_client_dist: sum_i pi_bar_i acc_i (Table 2) = 1 - R(global model) of Eq. 2, the mean
  over clients of the accuracy on a test set drawn from each client's label distribution.
- test/adaptability: R(local model m) = sum_i pi_bar_i eps_i^m (Eq. 3), eps the per-class error on the
  pooled test set, averaged over the local models trained in the round (Table 3; lower is better).
- client/<i>/kl_PQ and test/kl_PQ: KL(P^m || Q) of each of those local models (Table 9): P^m from a
  clean eval-mode pass over the client's training data, Q = tau on the diagonal
  (`evaluators.adaptability.kl_tau`), the mean over the rows of the classes the client holds.
- test/absent_mass: the share of those P^m rows' probability on the classes the client does not hold, averaged
  over the rows and the local models (what FedACD's missing-class Delta acts on; 0 when a client holds every class).

The two local-model metrics run on rounds where evaluation runs and (round + 1) is a multiple of
`evaluators.adaptability.every` (and on the last round). They need the local models before aggregation:
`on_local_model` runs on the process that trained the client, right after its local training; the
evaluator then sums the per-client results over the processes (each client is on exactly one), so
1 and 2 processes give the same numbers. Classes missing from the pooled test set are left out of
every class average, and pi_bar is renormalised over the classes that remain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fl.config import param
from fl.core import EvalContext, Evaluator, register_evaluator
from fl.core.eval_schedule import is_eval_round
from fl.core.label_sums import class_sums, label_counts
from fl.core.metric_directions import HIGHER, LOWER, NEITHER, Directions

KL_REDUCTIONS = ("mean_present", "sum", "batchmean_C")


def template_q(num_classes: int, tau: float, dtype=torch.float64, device=None) -> Tensor:
    """Q of FedACD's Eq. 10: tau on the diagonal, (1 - tau) / (C - 1) elsewhere."""
    C = num_classes
    Q = torch.full((C, C), (1.0 - tau) / max(C - 1, 1), dtype=dtype, device=device)
    Q.fill_diagonal_(tau)
    return Q


def kl_pq(P: Tensor, present: Tensor, tau: float, reduction: str = "mean_present", eps: float = 1e-8) -> Tensor:
    """KL(P || Q) over the rows of present classes (FedACD's Eq. 10).

    mean_present: mean over present rows of sum_j P_ij log(P_ij / Q_ij) (the magnitudes of the paper's
    Table 9); sum: the literal double sum of Eq. 10; batchmean_C: the sum divided by C."""
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"kl reduction {reduction!r}; choices: {', '.join(KL_REDUCTIONS)}")
    P = P.to(torch.float64)[present]
    Q = template_q(P.shape[1], tau, device=P.device)[present]
    # 0 log 0 = 0: entries that are exactly zero contribute nothing
    rows = torch.where(P > 0, P * (P.clamp_min(eps).log() - Q.log()), torch.zeros_like(P)).sum(1)
    if reduction == "mean_present":
        return rows.mean()
    total = rows.sum()
    return total if reduction == "sum" else total / present.numel()  # present has one entry per class


def mean_label_distribution(label_counts: Tensor) -> Tensor:
    """pi_bar: the unweighted mean over clients of each client's label proportions (clients weigh 1/M,
    not by data size)."""
    counts = label_counts.to(torch.float64)
    return (counts / counts.sum(1, keepdim=True).clamp_min(1)).mean(0)


def client_dist_accuracy(acc: Tensor, pi_bar: Tensor, has: Tensor) -> Tensor:
    """sum_i pi_bar_i acc_i over the classes with test data (pi_bar renormalised over them)."""
    w = pi_bar.to(acc.dtype) * has
    return (w * acc).sum() / w.sum()


def adaptability_risk(errors: Tensor, pi_bar: Tensor, has: Tensor) -> Tensor:
    """R = eps . pi_bar per local model (rows of `errors`), over the classes with test data."""
    w = pi_bar.to(errors.dtype) * has
    return (errors * w).sum(-1) / w.sum()


def local_probability_matrix(module, split) -> tuple[Tensor, Tensor]:
    """Clean pass (eval mode, no augmentation) of the module's model over `split`: the per-class sums of
    softmax probabilities [C, C] and the per-class counts [C], float64. P = sums / counts on the rows
    of the classes present. FedACD's V and the kl_PQ diagnostic both use it, so they agree."""
    C = module.num_classes
    device = next(module.parameters()).device
    sums = torch.zeros(C, C, dtype=torch.float64, device=device)
    counts = torch.zeros(C, dtype=torch.float64, device=device)
    for logits, y in module.eval_pass(split):
        p = torch.softmax(logits.float(), dim=1).to(torch.float64)
        sums += class_sums(p, y, C)  # not index_add_: its atomics on CUDA add a class's rows in a varying order
        counts += label_counts(y, C)
    return sums, counts


def class_counts(ctx: EvalContext) -> tuple[Tensor, Tensor]:
    """Correct and total predictions per true class of the loaded model (a local one) on the pooled test set, scored
    on this process alone."""
    from fl.core import GroupedAccuracy  # a torchmetrics Metric: loads with the first evaluation

    counts = GroupedAccuracy(ctx.data.num_classes, sync_on_compute=False).to(ctx.fabric.device)
    for logits, y in ctx.module.eval_pass(ctx.data.pooled_test()):
        counts.update(logits.argmax(1), y)
    return counts.counts()


@dataclass
class AdaptabilitySettings:
    every: int = param(5, ge=1, help="local-model adaptability risk and KL(P||Q) on evaluation rounds every k "
                       "rounds and the last")
    kl_tau: float = param(1.0 - 1e-5, gt=0.0, lt=1.0, help="diagonal tau of the template Q in the KL(P||Q) "
                          "diagnostic (FedACD's Eq. 10)")


@register_evaluator
class Adaptability(Evaluator):
    """test/adaptability, test/kl_PQ and client/<i>/kl_PQ over the local models of the round."""

    name = "adaptability"
    Settings = AdaptabilitySettings
    # the risk is an error rate; KL(P || Q) to the template, lower as FedACD's l2 drives it; the absent classes' mass
    # is a diagnostic of the data, neither way better
    metric_directions = {"test/adaptability": LOWER, "test/kl_PQ": LOWER, "test/absent_mass": NEITHER}

    def __init__(self, settings):
        super().__init__(settings)
        self.stash: dict[int, tuple] = {}  # this process's clients: cid -> (correct, total, kl, absent mass)

    def active(self, cfg, rnd: int) -> bool:
        """The loop's evaluation rounds ((round + 1) % eval_every == 0, or the last), thinned to every
        `every` rounds (and the last)."""
        last = rnd == cfg.trainer.rounds - 1
        return is_eval_round(cfg, rnd) and ((rnd + 1) % self.hp.every == 0 or last)

    def on_local_model(self, ctx: EvalContext, cid: int) -> None:
        """Per-class test errors and KL(P || Q) of client cid's freshly trained local model."""
        if cid < 0 or not self.active(ctx.cfg, ctx.round):
            return
        correct, total = class_counts(ctx)
        sums, n = local_probability_matrix(ctx.module, ctx.data.clients[cid].train)
        present = n > 0
        P = sums / n.clamp_min(1)[:, None]
        if bool(present.any()):
            kl, absent = float(kl_pq(P, present, self.hp.kl_tau)), float(P[present][:, ~present].sum(1).mean())
        else:  # no training data: no P to measure; the client's KL is left out, not logged as NaN
            kl = absent = math.nan
        self.stash[cid] = (correct.cpu(), total.cpu(), kl, absent)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        mine, self.stash = self.stash, {}
        if not self.active(ctx.cfg, ctx.round):
            return {}
        M, K, fabric = ctx.data.num_clients, ctx.data.num_classes, ctx.fabric
        # one flat float64 vector per process: [has, kl, absent, correct (M x K), total (M x K)]; each client is
        # on one process, so the sum over processes is exact
        has, kl, absent = (torch.zeros(M, dtype=torch.float64) for _ in range(3))
        correct = torch.zeros(M, K, dtype=torch.float64)
        total = torch.zeros(M, K, dtype=torch.float64)
        for cid, (c, t, k, a) in mine.items():
            has[cid], kl[cid], absent[cid], correct[cid], total[cid] = 1.0, k, a, c, t
        flat = torch.cat([has, kl, absent, correct.flatten(), total.flatten()]).to(fabric.device)
        if fabric.world_size > 1:
            flat = fabric.all_reduce(flat, reduce_op="sum")
        has, kl, absent, rest = flat.cpu().split([M, M, M, 2 * M * K])
        has = has > 0
        correct, total = rest[:M * K].view(M, K), rest[M * K:].view(M, K)
        if not bool(has.any()):
            return {}
        pi_bar = mean_label_distribution(ctx.data.label_counts("train"))
        tested = total[has][0] > 0  # every local model is scored on the same pooled test set
        errors = 1.0 - correct[has] / total[has].clamp_min(1)
        risk = adaptability_risk(errors, pi_bar, tested)
        out = {"test/adaptability": float(risk.mean())}
        measured = has & kl.isfinite()  # the local models of clients with training data
        if bool(measured.any()):
            out.update({"test/kl_PQ": float(kl[measured].mean()), "test/absent_mass": float(absent[measured].mean())})
            out.update({f"client/{cid}/kl_PQ": float(kl[cid]) for cid in torch.nonzero(measured).flatten().tolist()})
        return out


@register_evaluator
class GlobalAccuracy(Evaluator):
    """test/acc_global_balanced (uniform test set) and test/acc_global_client_dist of the global model."""

    name = "global_acc"
    on_validation = True
    metric_directions = {"test/acc_global_balanced": HIGHER, "test/acc_global_client_dist": HIGHER}

    @classmethod
    def logged_directions(cls, cfg, client_cls: type) -> Directions:
        return super().logged_directions(cfg, client_cls) if client_cls.has_global_model else {}

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        from fl.core import GroupedAccuracy  # a torchmetrics Metric: loads with the first evaluation

        if not ctx.module.has_global_model:
            return {}
        shared = ctx.global_predictions()  # made once per evaluation; every process holds all of them
        counts = GroupedAccuracy(ctx.data.num_classes, sync_on_compute=False).to(ctx.fabric.device)
        counts.update(shared.preds, shared.labels)
        correct, total = (t.cpu() for t in counts.counts())
        has = total > 0
        acc = correct / total.clamp_min(1)
        pi_bar = mean_label_distribution(ctx.data.label_counts("train"))
        return {"test/acc_global_balanced": float(acc[has].mean()),
                "test/acc_global_client_dist": float(client_dist_accuracy(acc, pi_bar, has))}
