"""FedPALS (Listo Zec et al., "Overcoming label shift in targeted federated learning").

Clients train as in FedAvg (or FedProx with method.mu > 0) and never see the target. The server
aggregates with the weights alpha of a convex QP over the label marginals S_i, the client sizes n_i and
the target marginal T (qp.py), trading label mismatch against effective sample size.
Under full participation alpha is solved once; under partial participation it is re-solved (and cached)
for each round's set of clients.
"""
from dataclasses import dataclass
from typing import Optional

from fl.config import ConfigError, MethodConfig, param
from fl.core import Server, register_method
from fl.core.metric_directions import NEITHER
from fl.methods.fedpals.qp import SOLVERS, FedPALSQP, ess, mismatch
from fl.methods.fedprox import FedProxClient


@dataclass
class FedPALSConfig(MethodConfig):
    name: str = "fedpals"
    lam: Optional[float] = param(None, ge=0.0, search={"distribution": "log_uniform_values", "min": 1.0, "max": 1e4},
                                 help="lambda in the paper's units (sample counts); takes precedence over ess_frac")
    ess_frac: Optional[float] = param(0.5, gt=0.0, le=1.0, search={"values": [0.1, 0.25, 0.5, 0.75, 1.0]},
                                      help="pick lambda by bisection so that ESS = ess_frac * N; 1.0 = FedAvg weights")
    mu: float = param(0.0, ge=0.0, help="FedProx proximal weight on the clients (FedProx + FedPALS)")
    solver: str = param("CLARABEL", choices=list(SOLVERS))


def resolve(cfg) -> None:
    if cfg.data.target.distribution is None and cfg.data.target.domain is None:
        raise ConfigError("method.name=fedpals needs a target: set data.target.distribution=partition, a list of "
                          "K probabilities or data.target.domain (or include a block such as data/cifar10_c2_target)")
    if cfg.method.lam is not None:
        cfg.method.ess_frac = None  # lam wins; keep the resolved config honest
    elif cfg.method.ess_frac is None:
        raise ConfigError("method.lam and method.ess_frac are both null; set one of them")


class FedPALSServer(Server):
    # the QP's trade-off, set by lambda: diagnostics, neither way better
    metric_directions = dict.fromkeys(("server/ess", "server/ess_frac", "server/label_mismatch",
                                       "server/projection_distance", "server/lambda", "server/alpha/*"), NEITHER)

    @classmethod
    def own_aggregation(cls, hp) -> Optional[str]:
        return "its aggregation weights are the QP's alpha, the method itself"

    def setup(self, module, data) -> None:
        super().setup(module, data)
        counts = data.label_counts("train").double()
        self.n = counts.sum(1).numpy()
        self.S = (counts / counts.sum(1, keepdim=True)).numpy()  # K-length over the global label order
        self.T = data.target.distribution.double().numpy()
        self._solved: dict[tuple, tuple] = {}

    def on_round_start(self, ctx, selected: list[int]) -> None:
        key = tuple(selected)
        if key not in self._solved:  # static under full participation; cached per participant set otherwise
            S, n = self.S[list(key)], self.n[list(key)]
            qp = FedPALSQP(S, self.T, n, self.hp.solver)  # compiled once for this set of clients
            lam = self.hp.lam if self.hp.lam is not None else qp.lambda_for_ess(self.hp.ess_frac)
            alpha = qp.weights(lam)
            projection = mismatch(qp.weights(0.0), S, self.T)
            self._solved[key] = (lam, alpha, projection)
        self.selected = list(key)
        self.lam, self.alpha, self.projection = self._solved[key]
        self.weights = dict(zip(self.selected, self.alpha))

    def weight(self, cid: int, upload) -> float:
        return float(self.weights[cid])

    def on_round_end(self, ctx, metrics: dict) -> None:
        n = self.n[self.selected]
        metrics.update({"server/ess": ess(self.alpha, n), "server/ess_frac": ess(self.alpha, n) / n.sum(),
                        "server/label_mismatch": mismatch(self.alpha, self.S[self.selected], self.T),
                        "server/projection_distance": self.projection, "server/lambda": float(self.lam)})
        metrics.update({f"server/alpha/{cid}": float(a) for cid, a in self.weights.items()})


register_method("fedpals", FedPALSConfig, FedProxClient, FedPALSServer, resolve, headline="test/target_acc",
                needs=("data.target.distribution=partition",))
