"""What a server hook or an evaluator gets each round: a small context, not the loop."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from omegaconf import DictConfig

from fl.core.batches import eval_batch_size
from fl.core.client import ClientModule
from fl.core.federated_data import FederatedData
from fl.core.global_predictions import PooledPredictions, score_pooled
from fl.core.personalized import PersonalizedModels

if TYPE_CHECKING:  # Lightning loads with the run, not with a method or an evaluator
    from lightning.fabric import Fabric


@dataclass
class RoundContext:
    """round: the round index (0-based); fabric: device, world size and collectives (`all_reduce`);
    data: the run's data on the device; cfg: the run's config."""
    round: int
    fabric: Fabric
    data: FederatedData
    cfg: DictConfig
    stop_reason: Optional[str] = None

    def stop(self, reason: str) -> None:
        """End the run after this round, which is checkpointed and summarised as a last round is; `reason` is
        printed in one line (a server hook's or a callback's request; any process's stops them all)."""
        self.stop_reason = reason

    def log_histogram(self, key: str, values: Iterable[float]) -> None:
        """A per-round distribution for the dashboards, sent to every logger that draws histograms (W&B);
        scalars go through the metrics dict."""
        for logger in self.fabric.loggers:
            draw = getattr(logger, "log_histogram", None)
            if draw is not None:
                draw(key, [float(v) for v in values], self.round)


@dataclass
class EvalContext(RoundContext):
    """An evaluator's context: also the process's ClientModule and `load_client(cid)`, which swaps client
    cid (-1: the global model) into it, as evaluation and training do, and `load_personalized(cid)`, which also
    personalises it."""
    module: ClientModule = None
    load_client: Callable[[int], ClientModule] = None
    #: the clients personalised in this evaluation, shared with its validation view (`dataclasses.replace`)
    personalized: PersonalizedModels = field(default_factory=PersonalizedModels, repr=False, compare=False)
    _pooled: Optional[PooledPredictions] = field(default=None, init=False, repr=False, compare=False)

    def load_personalized(self, cid: int) -> dict[str, float]:
        """Swap client cid in and personalise it (`ClientModule.personalize`) for scoring; returns the scalars it
        logged. Within one evaluation a method with `reuse_personalized` is personalised once per client and
        restored on later calls (fl/core/personalized.py)."""
        return self.personalized.personalize(self.load_client(cid), cid)

    def global_predictions(self) -> PooledPredictions:
        """The global model's predicted label for every sample of `data.pooled_test()`, made on the first call of this
        evaluation (it loads the global model; every process must call it) and reused by the later ones. A new
        context is made every round, and `dataclasses.replace` (the validation view) starts without them."""
        if self._pooled is None or self._pooled.split is not self.data.pooled_test():
            self._pooled = score_pooled(self.fabric, self.module, self.data.pooled_test(), self.load_client,
                                        eval_batch_size(self.cfg, self.fabric.device))
        return self._pooled
