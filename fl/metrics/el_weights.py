"""The empirical-likelihood weights of a density-ratio router (FedDRM, Sec. 2.3: p_ij of Eq. 6 with
rho_l = n_l / N, Thm. 2.2), recovered from the server model's raw client logits z_ij on the pooled training
data, whose intercepts absorb log n_l: log p_ij = -logsumexp_l z_ijl + c, with c such that sum p_ij = 1.
Training never computes them (the reference distribution is profiled out); they show how far the fitted
reference is from the empirical one:

* `server/el_weight_ess_frac`: (sum p)^2 / (N sum p^2), 1 when every atom weighs 1/N;
* `server/el_weight_max_ratio`: N max p, the heaviest atom against 1/N;
* `server/el_marginal_gap`: max over clients l of |sum_ij softmax_l(z_ij) / n_l - 1|, the gap of the fitted
  client marginals to constraint (5), which holds exactly at an unpenalised optimum of the client head.

Only methods with a router (`ClientModule.route_scores`) report them. Processes score strided batches of each
client's training data into one matrix, summed across them.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fl.core import EvalContext, Evaluator, register_evaluator
from fl.core.batches import eval_batch_size
from fl.core.metric_directions import LOWER, NEITHER, Directions
from fl.metrics.system import has_router


def el_log_weights(client_logits: Tensor) -> Tensor:
    """log p_ij of every pooled sample from its client logits [N, m], normalised to sum to 1 (float64,
    log-sum-exp throughout)."""
    lp = -torch.logsumexp(client_logits.to(torch.float64), dim=1)
    return lp - torch.logsumexp(lp, dim=0)


@register_evaluator
class ELWeights(Evaluator):
    name = "el_weights"
    # the weights' spread is a diagnostic; the gap is the fitted marginals' distance from the paper's constraint (5)
    metric_directions = {"server/el_weight_ess_frac": NEITHER, "server/el_weight_max_ratio": NEITHER,
                         "server/el_marginal_gap": LOWER}

    @classmethod
    def logged_directions(cls, cfg, client_cls: type) -> Directions:
        return super().logged_directions(cfg, client_cls) if has_router(client_cls) else {}

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        m, fabric, data = ctx.module, ctx.fabric, ctx.data
        if not has_router(m):
            return {}
        ctx.load_client(-1)
        splits = [c.train for c in data.clients]
        sizes = [len(s) for s in splits]
        M, N, bs = data.num_clients, sum(sizes), eval_batch_size(ctx.cfg, fabric.device)
        logits = torch.zeros(N, M, dtype=torch.float64, device=fabric.device)
        rank, world, offset = fabric.global_rank, fabric.world_size, 0
        for split in splits:  # batches rank, rank + world, ... of each split
            batches = m.eval_pass(split, m.client_scores, batch_size=bs, start=rank, stride=world)
            for t, (z, _) in enumerate(batches):
                begin = offset + (rank + t * world) * bs
                logits[begin:begin + len(z)] = z.to(torch.float64)
            offset += len(split)
        if fabric.world_size > 1:
            logits = fabric.all_reduce(logits, reduce_op="sum")
        p = el_log_weights(logits).exp()
        n = torch.tensor(sizes, dtype=torch.float64, device=logits.device)
        marginal = torch.softmax(logits, dim=1).sum(0) / n.clamp_min(1)
        return {"server/el_weight_ess_frac": float(p.sum() ** 2 / (N * (p * p).sum())),
                "server/el_weight_max_ratio": float(N * p.max()),
                "server/el_marginal_gap": float((marginal[n > 0] - 1).abs().max())}
