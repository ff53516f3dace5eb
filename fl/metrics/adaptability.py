"""Adaptability diagnostics of FedACD's paper (Zhou et al. 2025), computed for every method.

pi_bar = (1/M) sum_n pi^n, the unweighted mean of the M clients' training label proportions.

- test/global_acc: the global model's accuracy on a uniform test set = the mean over classes of its
  per-class accuracy on the pooled test set (Table 1). When the pooled test set is class-balanced (the
  official test split of CIFAR / Tiny-ImageNet and the embedded twins' stratified held-out split, i.e.
  every `*_20c` FedACD data block) this equals test/acc_global; on an unbalanced pooled test set it is
  the balanced accuracy, test/acc_global the micro accuracy.
- test/global_acc_client_dist: sum_i pi_bar_i acc_i (Table 2) = 1 - R(global model) of Eq. 2, the mean
  over clients of the accuracy on a test set drawn from each client's label distribution.
- test/adaptability: R(local model m) = sum_i pi_bar_i eps_i^m (Eq. 3), eps the per-class error on the
  pooled test set, averaged over the local models trained in the round (Table 3; lower is better).
- client/<i>/kl_PQ and test/kl_PQ: KL(P^m || Q) of each of those local models (Table 9): P^m from a
  clean eval-mode pass over the client's training data, Q = tau on the diagonal (`trainer.kl_tau`), the
  mean over the rows of the classes the client holds.

The two local-model metrics run on rounds where evaluation runs and (round + 1) is a multiple of
`trainer.adaptability_every` (and on the last round). They need the local models before aggregation:
`on_local_model` runs on the process that trained the client, right after its local training; the
evaluator then sums the per-client results over the processes (each client is on exactly one), so
1 and 2 processes give the same numbers. Classes missing from the pooled test set are left out of
every class average, and pi_bar is renormalised over the classes that remain.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from fl.metrics.evaluators import register_evaluator, register_local_hook


class ClassCounts(Metric):
    """Correct and total predictions per true class (float64 counts, summed across processes)."""

    full_state_update = False

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.add_state("correct", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        K = self.total.numel()
        self.total += torch.bincount(target, minlength=K).to(self.total.dtype)
        self.correct += torch.bincount(target[preds == target], minlength=K).to(self.correct.dtype)

    def compute(self) -> tuple[Tensor, Tensor]:
        return self.correct.clone(), self.total.clone()


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


@torch.no_grad()
def local_probability_matrix(module, split, batch_size: int) -> tuple[Tensor, Tensor]:
    """Clean pass (eval mode, no augmentation) of the module's model over `split`: the per-class sums of
    softmax probabilities [C, C] and the per-class counts [C], float64. P = sums / counts on the rows
    of the classes present. FedACD's V and the kl_PQ diagnostic both use it, so they agree."""
    C = module.num_classes
    device = next(module.parameters()).device
    sums = torch.zeros(C, C, dtype=torch.float64, device=device)
    counts = torch.zeros(C, dtype=torch.float64, device=device)
    was_training = module.training
    module.eval()
    fabric = module._fabric
    for begin in range(0, len(split), batch_size):
        x, y = module.make_batch(split, slice(begin, begin + batch_size))
        if fabric is not None:
            with fabric.autocast():
                logits = module.predict(x)
        else:
            logits = module.predict(x)
        p = torch.softmax(logits.float(), dim=1).to(torch.float64)
        sums.index_add_(0, y, p)
        counts.index_add_(0, y, torch.ones_like(y, dtype=torch.float64))
    module.train(was_training)
    return sums, counts


def is_adaptability_round(cfg, rnd: int) -> bool:
    """The orchestrator's evaluation rounds ((round + 1) % eval_every == 0, or the last), thinned to
    every `adaptability_every` rounds (and the last)."""
    t = cfg.trainer
    last = rnd == t.rounds - 1
    return ((rnd + 1) % t.eval_every == 0 or last) and ((rnd + 1) % t.adaptability_every == 0 or last)


def _stash(orch) -> dict:
    if not hasattr(orch, "_adaptability_stash"):
        orch._adaptability_stash = {}
    return orch._adaptability_stash


@register_local_hook("adaptability")
def on_local_model(orch, rnd: int, cid: int, module) -> None:
    """Per-class test errors and KL(P || Q) of client cid's freshly trained local model (kept per process
    until the round's evaluation)."""
    if cid < 0 or not is_adaptability_round(orch.cfg, rnd):
        return
    from fl.methods.fedacd_losses import kl_pq  # here: fl.methods imports every method

    K = orch.data.num_classes
    counts = ClassCounts(K, sync_on_compute=False).to(orch.fabric.device)
    for preds, y in orch._predict(orch.data.pooled_test()):
        counts.update(preds, y)
    correct, total = counts.compute()
    sums, n = local_probability_matrix(module, orch.data.clients[cid].train, orch.cfg.trainer.eval_batch_size)
    present = n > 0
    P = sums / n.clamp_min(1)[:, None]
    kl = kl_pq(P, present, orch.cfg.trainer.kl_tau) if bool(present.any()) else torch.tensor(float("nan"))
    _stash(orch)[cid] = (rnd, correct.cpu(), total.cpu(), float(kl))


@register_evaluator("adaptability")
def adaptability(orch, rnd: int) -> dict[str, float]:
    """test/adaptability, test/kl_PQ and client/<i>/kl_PQ over the local models of this round."""
    stash = _stash(orch)
    mine = {cid: v for cid, v in stash.items() if v[0] == rnd}
    stash.clear()
    if not is_adaptability_round(orch.cfg, rnd):
        return {}
    M, K = orch.data.num_clients, orch.data.num_classes
    # one flat float64 vector per process: [has, kl, correct (M x K), total (M x K)]; each client is on
    # one process, so the sum over processes is exact
    has = torch.zeros(M, dtype=torch.float64)
    kl = torch.zeros(M, dtype=torch.float64)
    correct = torch.zeros(M, K, dtype=torch.float64)
    total = torch.zeros(M, K, dtype=torch.float64)
    for cid, (_, c, t, k) in mine.items():
        has[cid], kl[cid], correct[cid], total[cid] = 1.0, k, c, t
    flat = torch.cat([has, kl, correct.flatten(), total.flatten()]).to(orch.fabric.device)
    if orch.fabric.world_size > 1:
        flat = orch.fabric.all_reduce(flat, reduce_op="sum")
    flat = flat.cpu()
    has, kl = flat[:M] > 0, flat[M:2 * M]
    correct, total = flat[2 * M:2 * M + M * K].view(M, K), flat[2 * M + M * K:].view(M, K)
    if not bool(has.any()):
        return {}
    pi_bar = mean_label_distribution(orch.data.label_counts("train"))
    tested = total[has][0] > 0  # every local model is scored on the same pooled test set
    errors = 1.0 - correct[has] / total[has].clamp_min(1)
    risk = adaptability_risk(errors, pi_bar, tested)
    out = {"test/adaptability": float(risk.mean()), "test/kl_PQ": float(kl[has].mean())}
    out.update({f"client/{cid}/kl_PQ": float(kl[cid]) for cid in torch.nonzero(has).flatten().tolist()})
    return out


@register_evaluator("global_acc")
def global_acc(orch, rnd: int) -> dict[str, float]:
    """test/global_acc (uniform test set) and test/global_acc_client_dist of the global model."""
    if not orch.server.has_global_model:
        return {}
    fabric = orch.fabric
    orch.load_client(rnd, -1)
    counts = ClassCounts(orch.data.num_classes).to(fabric.device)  # strided shards, summed over processes
    for preds, y in orch._predict(orch.data.pooled_test(), fabric.global_rank, fabric.world_size):
        counts.update(preds, y)
    correct, total = (t.cpu() for t in counts.compute())
    has = total > 0
    acc = correct / total.clamp_min(1)
    pi_bar = mean_label_distribution(orch.data.label_counts("train"))
    return {"test/global_acc": float(acc[has].mean()),
            "test/global_acc_client_dist": float(client_dist_accuracy(acc, pi_bar, has))}
