"""System accuracy (FedDRM, Wang et al. 2025, Sec. 3.3 and Fig. 4): the federation as one classifier of
queries drawn from the pooled test set (the union of every client's test split, each sample keeping its
client's shift).

* `test/system_acc`: a method with a router (`ClientModule.route_scores` returns scores) sends each query to
  the argmax client, whose model predicts; any other method with per-client models predicts by the
  unweighted majority vote of all client models, ties going to the smallest label (torch.mode's rule).
* `test/system_acc_oracle`: each query goes to its own client's model (a diagnostic upper bound on the value
  of routing; it is the micro-averaged per-client accuracy).
* `test/routing_acc` (router only): per client, the share of its test samples whose raw client scores
  (`ClientModule.client_scores`) have their argmax at that client, averaged with training-size weights n_i / N:
  the paper's "client accuracy", which its official code computes from the raw argmax whatever the routing
  rule; `test/routing_acc_micro` pools them. `test/routing_acc_rule` (and `_micro`) is the same share for the
  routing rule's own choice (FedDRM's density-ratio correction), the routing that system_acc uses.

Methods whose clients all use one global model (no private parameters, no `personalize`, no router) are
skipped: their system accuracy is `test/acc_global_micro`. The router runs on the server's model (cid -1).

Processes split the work (batches for routing, clients for prediction) and merge counts with a sum
all-reduce; batches are the same slices on any number of processes, so 1 and 2 processes agree.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fl.core import ClientModule, EvalContext, Evaluator, register_evaluator
from fl.core.batches import eval_batch_size
from fl.core.metric_directions import HIGHER, Directions


def majority_vote(votes: Tensor) -> Tensor:
    """votes [N, K] counts -> [N] label with the most votes, the smallest label on ties (argmax returns the
    first maximum)."""
    return votes.argmax(dim=1)


def _overrides(module: ClientModule | type, name: str) -> bool:
    cls = module if isinstance(module, type) else type(module)
    return getattr(cls, name) is not getattr(ClientModule, name)


def has_router(module: ClientModule | type) -> bool:
    return _overrides(module, "route_scores")


def may_have_client_models(cfg, client_cls: type) -> bool:
    """has_client_models as far as the config and the class say, before a module exists: fine-tuning rounds
    (finetune.after_round) give every client its own model; private parameters are possible where the class
    overrides is_private (FedBN's on a model without BatchNorm has none: it then logs nothing, as evaluate says)."""
    return (cfg.finetune.after_round is not None or not client_cls.has_global_model or has_router(client_cls)
            or _overrides(client_cls, "personalize") or _overrides(client_cls, "is_private"))


def has_client_models(module: ClientModule) -> bool:
    """Whether clients can predict differently: private parameters, personalization or a router."""
    return (not module.has_global_model or has_router(module) or _overrides(module, "personalize")
            or bool(module.private_state()))


def _reduce(fabric, t: Tensor) -> Tensor:
    return fabric.all_reduce(t, reduce_op="sum") if fabric.world_size > 1 else t


@register_evaluator
class SystemAccuracy(Evaluator):
    name = "system"
    on_validation = True
    ROUTING = dict.fromkeys(("test/routing_acc", "test/routing_acc_micro", "test/routing_acc_rule",
                             "test/routing_acc_rule_micro"), HIGHER)
    metric_directions = {"test/system_acc": HIGHER, "test/system_acc_oracle": HIGHER, **ROUTING}

    @classmethod
    def logged_directions(cls, cfg, client_cls: type) -> Directions:
        if not may_have_client_models(cfg, client_cls):
            return {}
        logs = super().logged_directions(cfg, client_cls)
        return logs if has_router(client_cls) else {k: v for k, v in logs.items() if k not in cls.ROUTING}

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        m, fabric, data = ctx.module, ctx.fabric, ctx.data
        if not has_client_models(m):
            return {}
        device, bs = fabric.device, eval_batch_size(ctx.cfg, fabric.device)
        tests = [c.test for c in data.clients]
        sizes = [len(s) for s in tests]
        if sum(sizes) == 0:
            return {}
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        units = [(j, b) for j, n in enumerate(sizes) for b in range(0, n, bs)]  # fixed batches, any process count
        rank, world = fabric.global_rank, fabric.world_size

        # 1. routing, by the server's model: every process routes its share of the batches
        route = raw = None
        if has_router(m):
            ctx.load_client(-1)
            m.eval()
            route = torch.zeros(2, offsets[-1], dtype=torch.float64, device=device)  # [rule, raw argmax]
            with torch.no_grad(), fabric.autocast():
                for j, b in units[rank::world]:
                    x, _ = m.make_batch(tests[j], slice(b, b + bs))
                    scores = m.route_scores(x)
                    if scores is None:  # the hook declined: no router after all
                        route = None
                        break
                    span = slice(offsets[j] + b, offsets[j] + b + len(x))
                    route[0, span] = scores.argmax(1).to(torch.float64)
                    route[1, span] = m.client_scores(x).argmax(1).to(torch.float64)
            # every process must agree on whether a router exists before the collective
            declined = _reduce(fabric, torch.tensor([float(route is None)], device=device))
            if float(declined) > 0:
                route = None
            else:
                route, raw = _reduce(fabric, route).long()

        # 2. client models: each process evaluates its share of the clients
        K = data.num_classes
        counts = torch.zeros(2, dtype=torch.float64, device=device)  # [routed correct, oracle correct]
        votes = None if route is not None else torch.zeros(offsets[-1], K, dtype=torch.float32, device=device)
        routed = None if route is None else routed_queries(route, sizes)
        for c in range(rank, data.num_clients, world):
            ctx.load_personalized(c)
            m.eval()
            with torch.no_grad(), fabric.autocast():
                for j, split in enumerate(tests):
                    if not sizes[j]:
                        continue
                    if route is not None:  # only the queries routed to c, and c's own ones for the oracle
                        mine = route[offsets[j]:offsets[j + 1]] == c
                        idx = torch.arange(sizes[j], device=device) if j == c else routed(c, j)
                    else:
                        idx = torch.arange(sizes[j], device=device)
                    for b in range(0, len(idx), bs):
                        sel = idx[b:b + bs]
                        x, y = m.make_batch(split, sel.to(split.y.device))
                        preds = m.predict(x).argmax(1)
                        hit = preds == y
                        if j == c:
                            counts[1] += hit.sum()
                        if route is not None:
                            counts[0] += (hit & mine[sel]).sum()
                        else:
                            votes[offsets[j] + sel, preds] += 1
        counts = _reduce(fabric, counts)
        total = float(offsets[-1])
        out = {"test/system_acc_oracle": float(counts[1]) / total}
        if route is not None:
            out["test/system_acc"] = float(counts[0]) / total
            out.update(routing_accuracy(raw, offsets, sizes, data.train_sizes(), "test/routing_acc"))
            out.update(routing_accuracy(route, offsets, sizes, data.train_sizes(), "test/routing_acc_rule"))
        else:
            votes = _reduce(fabric, votes)
            labels = torch.cat([s.y.to(device) for s in tests])
            out["test/system_acc"] = float((majority_vote(votes) == labels).sum()) / total
        return out


def routed_queries(route: Tensor, sizes: list[int]):
    """(c, j) -> positions in test split j of the queries routed to client c, ascending (route: the client of every
    pooled query, splits in order). One sort and one transfer to the host for all pairs: a nonzero() per pair would
    make the host wait for the GPU M^2 times per evaluation."""
    m = len(sizes)
    split_of = torch.repeat_interleave(torch.arange(m), torch.tensor(sizes)).to(route.device, non_blocking=True)
    key = route * m + split_of  # pairs (c, j) in order, each query's position ascending within its pair
    order = torch.argsort(key, stable=True)
    bounds = torch.searchsorted(key[order], torch.arange(m * m + 1, device=route.device)).tolist()
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    return lambda c, j: order[bounds[c * m + j]:bounds[c * m + j + 1]] - starts[j]


def routing_accuracy(route: Tensor, offsets: list[int], sizes: list[int], train_sizes: list[int], key: str) -> dict:
    """Per client the share of its test queries routed to it, weighted by training size (`key`) and pooled
    (`key`_micro)."""
    acc, weight, hits = [], [], 0
    for j, n in enumerate(sizes):
        if n:
            h = int((route[offsets[j]:offsets[j + 1]] == j).sum())
            hits += h
            acc.append(h / n)
            weight.append(float(train_sizes[j]))
    w = sum(weight)
    weighted = sum(a * wt for a, wt in zip(acc, weight)) / w if w > 0 else sum(acc) / len(acc)
    return {key: weighted, f"{key}_micro": hits / offsets[-1]}
