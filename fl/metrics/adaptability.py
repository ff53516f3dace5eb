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

Scoring every local model on the whole pooled test set costs, per adaptability round, as many test passes as the
round trains clients. By default each client's local model is scored on a shard of its own instead: `test_shards=k`
scores client c's local model on shard c mod k of the pooled test set (k stratified shards drawn once from the seed),
and the default k = 0 means one shard per client (data.num_clients), so a round that trains every client scores the
pooled test set once. The round's risk is unbiased for the whole-set one, and test/adaptability_se logs its standard
error. `train_per_class=m` measures P on at most m training images of each class of the client. At test_shards=1
and train_per_class=0 nothing is subsampled: the whole-set numbers, bit for bit.
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
from fl.core.seeding import generator

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


def class_counts(counter, module, split) -> tuple[Tensor, Tensor]:
    """Correct and total predictions per true class of the module's model (a local one) on `split` (the pooled test
    set or a shard of it), counted by `counter` (a GroupedAccuracy over the classes, on this process alone)."""
    counter.reset()
    for logits, y in module.eval_pass(split):
        counter.update(logits.argmax(1), y)
    return counter.counts()


def shuffled_class_rows(y: Tensor, gen: torch.Generator) -> list[Tensor]:
    """Each class's rows (class by class, in label order), each in a random order."""
    y = y.cpu()
    return [rows[torch.randperm(len(rows), generator=gen)]
            for rows in (torch.nonzero(y == c).flatten() for c in torch.unique(y))]


def stratified_shards(y: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """The shard (0 .. k-1) of each row: each class's rows in a random order dealt out in turn, so that every shard
    holds each class's rows in proportion, within one row."""
    shard = torch.empty(len(y), dtype=torch.long)
    for rows in shuffled_class_rows(y, gen):
        shard[rows] = torch.arange(len(rows)) % k
    return shard


def per_class_sample(y: Tensor, per_class: int, gen: torch.Generator) -> Tensor:
    """The sorted rows of at most `per_class` images of each class, drawn at random."""
    kept = [rows[:per_class] for rows in shuffled_class_rows(y, gen)]
    return torch.cat(kept).sort().values if kept else torch.zeros(0, dtype=torch.long)


def sharded_risk_se(correct: Tensor, total: Tensor, pooled: Tensor, w: Tensor, shard: Tensor) -> Tensor:
    """Standard error of the mean over local models of the risk each scores on its shard, as an estimate of the same
    mean on the whole pooled test set. Per model, the per-class error is a proportion from n of the class's N images
    drawn without replacement: variance e (1 - e) / (n - 1) (1 - n / N), weighted by w^2 and summed over classes,
    with e = (errors + 1/2) / (n + 1), so that a class the shard shows all right or all wrong still counts as
    uncertain (the plain proportion would say 0). Models on one shard are correlated (at most perfectly): their
    standard deviations add within a shard, shards add in variance. correct, total: [models, classes] on the
    shards; pooled: [classes] on the whole set."""
    e = (total - correct + 0.5) / (total + 1)
    fpc = (1.0 - total / pooled.clamp_min(1)).clamp_min(0)
    var = (w ** 2 * e * (1 - e) / (total - 1).clamp_min(1) * fpc).sum(1)
    per_shard = class_sums(var.sqrt(), shard, int(shard.max()) + 1)
    return per_shard.square().sum().sqrt() / len(var)


@dataclass
class AdaptabilitySettings:
    every: int = param(5, ge=1, help="local-model adaptability risk and KL(P||Q) on evaluation rounds every k "
                       "rounds and the last")
    kl_tau: float = param(1.0 - 1e-5, gt=0.0, lt=1.0, help="diagonal tau of the template Q in the KL(P||Q) "
                          "diagnostic (FedACD's Eq. 10)")
    test_shards: int = param(0, ge=0, help="score client c's local model on shard c mod k of the pooled test set, "
                             "split once (from the seed) into k shards that each hold 1/k of every class (k lowered "
                             "to the smallest class's image count): 1/k of the cost, the same risk in expectation, "
                             "its standard error logged as test/adaptability_se; 0: one shard per client "
                             "(k = data.num_clients); 1: the whole set")
    train_per_class: int = param(0, ge=0, help="P of the KL(P||Q) diagnostic from at most this many of the client's "
                                 "training images of each class (drawn once from the seed); P and test/absent_mass "
                                 "are unbiased under it, the KL (convex in P) slightly high; 0: every image")


@register_evaluator
class Adaptability(Evaluator):
    """test/adaptability, test/kl_PQ and client/<i>/kl_PQ over the local models of the round."""

    name = "adaptability"
    Settings = AdaptabilitySettings
    # the risk is an error rate; KL(P || Q) to the template, lower as FedACD's l2 drives it; the absent classes' mass
    # is a diagnostic of the data, neither way better
    metric_directions = {"test/adaptability": LOWER, "test/kl_PQ": LOWER, "test/absent_mass": NEITHER,
                         "test/adaptability_se": NEITHER}

    def __init__(self, settings):
        super().__init__(settings)
        self.stash: dict[int, tuple] = {}  # this process's clients: cid -> (correct, total, kl, absent mass)
        # (the pooled test split they divide, its images per class, each row's shard, their number)
        self.shards: tuple = (None, None, None, 1)
        self.train_rows: dict[int, Tensor] = {}  # cid -> the rows of its training split that P is measured on
        self.counter = None  # one GroupedAccuracy for every local model: making one costs about a millisecond

    def class_counter(self, ctx: EvalContext):
        if self.counter is None:
            from fl.core import GroupedAccuracy  # a torchmetrics Metric: loads with the first evaluation

            self.counter = GroupedAccuracy(ctx.data.num_classes, sync_on_compute=False).to(ctx.fabric.device)
        return self.counter

    def pooled_shards(self, ctx: EvalContext) -> tuple[Tensor | None, Tensor | None, int]:
        """The pooled test set's images per class, each row's shard and their number k (test_shards, lowered to the
        smallest class's image count so that every shard holds every class), drawn once from the seed for this data
        view's set; (None, None, 1) when nothing is sharded."""
        pooled = ctx.data.pooled_test()
        wanted = self.hp.test_shards or ctx.data.num_clients  # 0: a shard per client
        if wanted == 1:
            return None, None, 1
        if self.shards[0] is not pooled:
            counts = torch.bincount(pooled.y.cpu(), minlength=ctx.data.num_classes)
            k = min(wanted, int(counts[counts > 0].min())) if len(pooled) else 1
            gen = generator(ctx.cfg.seed, 0, -1, "adaptability/test")
            self.shards = (pooled, counts, stratified_shards(pooled.y, k, gen) if k > 1 else None, k)
        return self.shards[1:]

    def test_split(self, ctx: EvalContext, cid: int):
        """What client cid's local model is scored on: the pooled test set, or its shard (test_shards)."""
        pooled = ctx.data.pooled_test()
        _, shard, k = self.pooled_shards(ctx)
        if k == 1:
            return pooled
        return pooled.subset(torch.nonzero(shard == cid % k).flatten().to(pooled.y.device))

    def train_split(self, ctx: EvalContext, cid: int):
        """What client cid's P is measured on: its training split, or at most train_per_class images a class of it."""
        train = ctx.data.clients[cid].train
        if self.hp.train_per_class == 0:
            return train
        if cid not in self.train_rows:
            self.train_rows[cid] = per_class_sample(train.y, self.hp.train_per_class,
                                                    generator(ctx.cfg.seed, 0, cid, "adaptability/train"))
        return train.subset(self.train_rows[cid].to(train.y.device))

    def active(self, cfg, rnd: int) -> bool:
        """The loop's evaluation rounds ((round + 1) % eval_every == 0, or the last), thinned to every
        `every` rounds (and the last)."""
        last = rnd == cfg.trainer.rounds - 1
        return is_eval_round(cfg, rnd) and ((rnd + 1) % self.hp.every == 0 or last)

    def on_local_model(self, ctx: EvalContext, cid: int) -> None:
        """Per-class test errors and KL(P || Q) of client cid's freshly trained local model."""
        if cid < 0 or not self.active(ctx.cfg, ctx.round):
            return
        correct, total = class_counts(self.class_counter(ctx), ctx.module, self.test_split(ctx, cid))
        sums, n = local_probability_matrix(ctx.module, self.train_split(ctx, cid))
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
        tested = total[has][0] > 0  # the pooled test set's classes: each shard holds every one of them
        errors = 1.0 - correct[has] / total[has].clamp_min(1)
        risk = adaptability_risk(errors, pi_bar, tested)
        out = {"test/adaptability": float(risk.mean())}
        pooled, _, k = self.pooled_shards(ctx)
        if k > 1:  # every process knows k: the same keys on 1 process and on 2
            w = pi_bar * tested / (pi_bar * tested).sum()
            shard_of = torch.nonzero(has).flatten() % k
            out["test/adaptability_se"] = float(sharded_risk_se(correct[has], total[has], pooled.to(torch.float64),
                                                                w, shard_of))
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
