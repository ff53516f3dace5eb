"""FedMosaic (Abourayya, Kleesiek, Rao, Kamp: "Who Should I Listen To? Adaptive Collaboration in
Personalized Federated Learning"): federated co-training on a shared unlabeled public set U.

No parameters are shared; each client's whole model (and its Adam state) stays in the state store.
A round is one communication period: b local steps (`trainer.local_steps=b`), each minimizing

    l = l_priv + lambda_i * l_pseudo,    lambda_i = exp(-(l_pseudo - l_priv) / l_priv)  (detached)

on a private batch and a separate batch of U with the current global pseudo-labels (l_priv alone before
the first consensus). After the b steps the client sends its hard predictions on U and one confidence
score per example, E (W: training frequency of the predicted class; U: certainty of its softmax;
optionally with DP noise on E). The server votes S = sum_i diag(E_i) onehot(L_i), takes the row argmax
(ties to the lowest class) and broadcasts the pseudo-labels to every client for the next period.

The true labels of U never reach a client: the client holds U's inputs only. The server uses them for
the `pseudo/acc_vs_hidden_truth` diagnostic alone. FedCT (fedct.py) is the same protocol
with lambda = 1 and E = 1 (a majority vote).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from fl.config import ConfigError, MethodConfig, param
from fl.core import (
    ClientModule,
    Server,
    Split,
    Upload,
    batch_indices,
    build_model,
    generator,
    register_method,
    seed_torch,
)
from fl.core.batches import eval_batch_size
from fl.core.metric_directions import HIGHER, LOWER, NEITHER
from fl.methods.fedmosaic.vote import (
    UNCERTAINTY_SCORES,
    adaptive_lambda,
    check_upload,
    class_frequencies,
    confidence_u,
    confidence_w,
    consensus,
    cotraining_loss,
    dp_noise,
    label_dtype,
    vote_scores,
)


@dataclass
class CoTrainingConfig(MethodConfig):
    """What FedCT and FedMosaic share. The communication period b is `trainer.local_steps`."""
    name: str = "fedct"
    public_batch_size: Optional[int] = param(None, ge=1, help="B_U, public examples per local step; "
                                             "null = trainer.batch_size")
    tie_break: str = param("lowest", choices=["lowest", "random"], help="argmax ties of the vote: lowest class "
                           "index, or a seeded random one among the tied")
    init: str = param("independent", choices=["independent", "shared"],
                      help="client models start from independent seeded initialisations (FedCT code) or one")
    first_vote_after: Optional[int] = param(None, ge=1, help="local steps the clients take before the first vote: "
                                            "it ends the first period that reaches them (the paper does not say; "
                                            "null = b, the first period, as Algorithm 1 runs); until then clients "
                                            "train on their private data alone and send nothing")
    collapse_share: float = param(0.9, gt=0.0, le=1.0, help="warn when one class holds at least this share of the "
                                  "pseudo-labels (pseudo/majority_class_share)")


@dataclass
class FedMosaicConfig(CoTrainingConfig):
    name: str = "fedmosaic"
    lambda_mode: str = param("adaptive", choices=["adaptive", "fixed"],
                             help="adaptive = exp(-(l_pseudo - l_priv)/l_priv); fixed = lambda_fixed (ablation)")
    lambda_fixed: float = param(1.0, ge=0.0, help="lambda when lambda_mode=fixed (1.0 with confidence=uniform = FedCT)")
    lambda_estimation: str = param("batch", choices=["batch", "round"],
                                   help="batch: from each step's two minibatch losses (Alg. 1); round: from the "
                                   "full-set losses at the start of the period, frozen for its b steps")
    eps_loss: float = param(1e-8, gt=0.0, help="floor of l_priv in lambda's denominator")
    confidence: str = param("W", choices=["W", "U", "uniform"],
                            help="E: W = training frequency of the predicted class, U = certainty of the "
                            "softmax (uncertainty_score), uniform = 1 (majority vote)")
    uncertainty_score: str = param("norm_neg_entropy", choices=list(UNCERTAINTY_SCORES),
                                   help="confidence=U: 1-H(p)/log C, 1/H(p), top-1 minus top-2, or max p")
    eps_conf: float = param(1e-6, gt=0.0, help="floor of E (classes a client never saw still count as votes)")
    dp: bool = param(False, help="DP-FedMosaic: noise on the clipped E before it is sent (labels are not noised)")
    dp_mechanism: str = param("gaussian", choices=["gaussian", "laplace"])
    dp_sigma: float = param(0.1, ge=0.0, search={"values": [0.0, 0.01, 0.1, 0.5]},
                            help="noise scale on E (Gaussian std / Laplace scale); no epsilon is claimed")
    dp_clip: float = param(1.0, gt=0.0, help="E is clipped to [0, dp_clip] before the noise")


def resolve(cfg) -> None:
    if cfg.data.public_size <= 0:
        raise ConfigError(f"method.name={cfg.method.name} needs a public unlabeled set: set data.public_size > 0 "
                          "(or include a data block such as data/domainnet_hybrid30)")
    if cfg.method.first_vote_after is not None and cfg.trainer.local_steps is None:
        raise ConfigError("method.first_vote_after counts local steps: set trainer.local_steps (the communication "
                          "period b)")


def votes_after_round(cfg, rnd: int) -> bool:
    """Whether round rnd's period ends with a vote: every period from the first by which the clients have taken
    method.first_vote_after local steps (default: b, so from the first period on)."""
    b = cfg.trainer.local_steps
    return b is None or (rnd + 1) * b >= (cfg.method.first_vote_after or b)


# ---- clients ---------------------------------------------------------------------------------------
class CoTrainingClient(ClientModule):
    """Local steps on l_priv + lambda * l_pseudo; uploads hard labels and confidences on U."""
    metric_directions = {"loss_priv": LOWER, "loss_pseudo": LOWER, "lambda": NEITHER}  # lambda_i: a weight

    keep_optimizer_state = True  # Adam's moments persist across communications (Algorithm 1, line 14 only replaces P)
    has_global_model = False

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.pseudo: Optional[Tensor] = None  # L_t on the device; None before the first consensus (P = {})
        self.public: Optional[Split] = None
        self._pub_batches = None

    def is_private(self, key: str) -> bool:
        return True  # no parameter ever leaves the client

    def attach(self, data) -> None:
        super().attach(data)
        # U as a client sees it: the inputs, with every label replaced by -1 (the true ones stay server-side)
        self.public = Split(data.public.x, torch.full_like(data.public.y, -1))

    # ---- hooks the two methods fill in --------------------------------------------------------
    def lambda_weight(self, l_priv: Tensor, l_pseudo: Tensor) -> Tensor:
        raise NotImplementedError

    def confidence(self, preds: Tensor, probs: Tensor) -> Tensor:
        raise NotImplementedError

    # ---- state ------------------------------------------------------------------------------------
    def load_client_state(self, state: Optional[dict[str, Any]]) -> None:
        if state is None and self.hp.init == "independent" and self.cid >= 0:
            self.load_state_dict(self._initial_model(self.cid))
            return
        super().load_client_state(state)

    def _initial_model(self, cid: int) -> dict[str, Tensor]:
        """Client cid's own seeded initialisation (the global RNG is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            seed_torch(self.cfg.seed, 0, cid, "init")
            model = build_model(self.cfg, tuple(self.data.input_shape), self.num_classes)
        return {f"model.{k}": v for k, v in model.state_dict().items()}

    def receive(self, payload: dict[str, Any]) -> None:
        pseudo = payload.get("pseudo")
        self.pseudo = None if pseudo is None else pseudo.to(self.public.x.device).long()

    # ---- local training ---------------------------------------------------------------------------
    def on_local_train_start(self) -> None:
        # public minibatches: seeded per (round, client), reshuffled at every pass over U
        bs = self.hp.public_batch_size or self.cfg.trainer.batch_size
        gen = generator(self.cfg.seed, self.round, self.cid, "public")
        self._pub_batches = (idx for _, idx in batch_indices(len(self.public), bs, gen, steps=2**62)
                             if idx is not None)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits_pub, pseudo = None, None
        if self.pseudo is not None:
            idx = next(self._pub_batches).to(self.public.y.device)
            x_pub, _ = self.make_batch(self.public, idx)  # its labels are -1 placeholders
            logits_pub, pseudo = self(x_pub), self.pseudo[idx]  # a separate forward pass (own BN statistics)
        loss, l_priv, l_pseudo, lam = cotraining_loss(self(x), y, logits_pub, pseudo, self.lambda_weight)
        out = {"loss": loss, "loss_priv": l_priv.detach()}
        if lam is not None:  # no pseudo term (and no lambda) before the first consensus
            out.update(loss_pseudo=l_pseudo.detach(), **{"lambda": lam.detach()})
        return out

    # ---- communication ----------------------------------------------------------------------------
    def upload(self) -> Upload:
        if not votes_after_round(self.cfg, self.round):  # before the first vote nothing is sent
            return Upload(weight=float(self.num_train))
        preds, probs = self.predict_public()
        conf = self.confidence(preds, probs)
        return Upload(weight=float(self.num_train),
                      message={"pred": preds.to(label_dtype(self.num_classes)), "conf": conf.float().cpu()})

    def predict_public(self) -> tuple[Tensor, Tensor]:
        """Hard predictions and softmax of the current model on U, in U's fixed index order (eval mode,
        no augmentation)."""
        probs = torch.cat([torch.softmax(logits.float(), 1).cpu() for logits, _ in self.eval_pass(self.public)])
        return probs.argmax(1), probs


class FedMosaicClient(CoTrainingClient):
    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self._round_lambda: Optional[Tensor] = None

    def lambda_weight(self, l_priv: Tensor, l_pseudo: Tensor) -> Tensor:
        if self.hp.lambda_mode == "fixed":
            return torch.tensor(float(self.hp.lambda_fixed), device=l_priv.device)
        if self.hp.lambda_estimation == "round":
            return self._round_lambda.to(l_priv.device)
        return adaptive_lambda(l_priv, l_pseudo, self.hp.eps_loss)

    def on_local_train_start(self) -> None:
        super().on_local_train_start()
        self._round_lambda = None
        if self.pseudo is not None and self.hp.lambda_mode == "adaptive" and self.hp.lambda_estimation == "round":
            l_priv, l_pseudo = self._full_set_losses()
            self._round_lambda = adaptive_lambda(l_priv, l_pseudo, self.hp.eps_loss)

    def _full_set_losses(self) -> tuple[Tensor, Tensor]:
        """l_priv over all of D_i and l_pseudo over all of P_t with the model at the start of the period."""
        bs = eval_batch_size(self.cfg, self.device)
        losses = []
        for split, labels in ((self.train_split(self.data, self.cid), None), (self.public, self.pseudo)):
            total = torch.zeros((), dtype=torch.float64, device=self.pseudo.device)
            for b, (logits, y) in enumerate(self.eval_pass(split, self, batch_size=bs)):
                y = y if labels is None else labels[b * bs:(b + 1) * bs]
                total += torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum").double()
            losses.append((total / max(len(split), 1)).float())
        return losses[0], losses[1]

    def confidence(self, preds: Tensor, probs: Tensor) -> Tensor:
        hp = self.hp
        if hp.confidence == "W":
            freq = class_frequencies(self.train_split(self.data, self.cid).y, self.num_classes)
            conf = confidence_w(preds, freq, hp.eps_conf)
        elif hp.confidence == "U":
            conf = confidence_u(probs, hp.uncertainty_score, hp.eps_conf)
        else:
            conf = torch.ones(preds.shape[0])
        if hp.dp:
            gen = generator(self.cfg.seed, self.round, self.cid, "dp")
            conf = dp_noise(conf, hp.dp_sigma, gen, hp.dp_mechanism, hp.dp_clip, hp.eps_conf)
        return conf


# ---- server ----------------------------------------------------------------------------------------
class CoTrainingServer(Server):
    """Builds the consensus pseudo-labels from every client's (predictions, confidences) on U."""
    # the consensus against the public set's hidden labels (higher is better); its class share and churn: diagnostics
    metric_directions = {"pseudo/acc_vs_hidden_truth": HIGHER, "pseudo/majority_class_share": NEITHER,
                         "pseudo/changed_frac": NEITHER}

    def setup(self, module, data) -> None:
        super().setup(module, data)
        self.pseudo: Optional[Tensor] = None  # L_t (CPU, compact integer type)
        self.diagnostics: dict[str, float] = {}

    def broadcast(self, cid: int) -> dict[str, Any]:
        return {"pseudo": self.pseudo}

    @classmethod
    def own_aggregation(cls, hp) -> Optional[str]:
        return "its clients share no parameters, only predictions on the public set"

    def server_step(self, ctx, mean: dict, messages: dict[int, dict]) -> None:
        if not votes_after_round(self.cfg, ctx.round):
            self.diagnostics = {}
            return
        n, K = len(self.data.public), self.data.num_classes
        cids = sorted(messages)  # client order: the float64 sum is the same on any number of processes
        uploads = [check_upload(messages[c], n, K, c) for c in cids]
        preds, confs = [p for p, _ in uploads], [e for _, e in uploads]
        scores = vote_scores(preds, confs, K)
        labels = consensus(scores, self.hp.tie_break, generator(self.cfg.seed, ctx.round, -1, "tie_break"))
        truth = self.data.public.y.cpu()  # diagnostics only; never sent to a client
        share = float(torch.bincount(labels, minlength=K).max()) / n
        diag = {"pseudo/acc_vs_hidden_truth": float((labels == truth).double().mean()),
                "pseudo/majority_class_share": share}
        if share >= self.hp.collapse_share and ctx.fabric.is_global_zero:
            warnings.warn(f"{self.hp.name}: the consensus collapsed: one class holds at least "
                          f"{self.hp.collapse_share:.0%} of the pseudo-labels (pseudo/majority_class_share); a vote "
                          "taken before the clients learned anything does this (method.first_vote_after delays the "
                          "first vote)", stacklevel=1)
        if self.pseudo is not None:
            diag["pseudo/changed_frac"] = float((labels != self.pseudo.long()).double().mean())
        won = scores[torch.arange(n), labels].sum()
        for c, p, e in zip(cids, preds, confs):
            agree = p.long() == labels
            diag[f"client/{c}/agree_with_consensus"] = float(agree.double().mean())
            diag[f"client/{c}/mean_E"] = float(e.double().mean())
            diag[f"client/{c}/vote_share"] = float((e.double() * agree).sum() / won)
        self.pseudo = labels.to(label_dtype(K))
        self.diagnostics = diag

    def on_round_end(self, ctx, metrics: dict) -> None:
        metrics.update(self.diagnostics)

    def state_dict(self) -> dict[str, Any]:
        return {"pseudo": self.pseudo}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.pseudo = state["pseudo"]


register_method("fedmosaic", FedMosaicConfig, FedMosaicClient, CoTrainingServer, resolve,
                needs=("data.public_size=40",))
