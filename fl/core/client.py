"""ClientModule: the LightningModule a method subclasses. Its `training_step` holds the paper's client loss.

Lightning joins when a client is built, not when a method's module is imported: `ClientModule` declares no
base, and instantiating a subclass makes an instance of that class with `L.LightningModule` mixed in
(`with_lightning`). So listing the methods, a method's help and checking a config import every method
without importing Lightning, while every module a run trains is a LightningModule.

One instance lives on each process for the whole run; the loop swaps each client's state in and out of
it. A round for client i is:

    module.receive(server.broadcast(i))      # what the server sends
    module.load_client_state(store[i])       # what stayed on the client (None on its first visit)
    module.fit_local(optimizer, ...)         # on_local_train_start / training_step ... / on_local_epoch_end
                                             # / on_local_train_end over the client's data
    module.upload()                          # what goes back: parameters to average, a weight, a message
    store[i] = module.client_state()         # what stays private, moved off the accelerator

Evaluation swaps each client in the same way, then calls `personalize()` and scores `predict` through
`eval_pass`.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from fl.core.batches import augment, batch_indices, eval_batch_size, one_ahead
from fl.core.federated_data import FederatedData, Split, rows_to
from fl.core.metric_directions import LOWER, Directions
from fl.core.optim import build_optimizer, finetune_lr, round_lr
from fl.core.registry import build_model
from fl.core.seeding import generator, seed_torch

HEAD = "model.head."  # state_dict prefix of the classifier head of every model (models are head(backbone(x)))


@dataclass
class Upload:
    """What one client sends back after local training.

    params:  tensors the server averages over clients, weighted by `Server.weight(cid, upload)`
             (the loop reduces them across processes with a float64 all-reduce)
    weight:  the client's raw aggregation weight; FedAvg uses its number of training samples n_i
    message: anything else the server needs (statistics, predictions on a public set, scores);
             gathered from every process, in client order, before the server step
    """
    params: dict[str, Tensor] = field(default_factory=dict)
    weight: float = 1.0
    message: dict[str, Any] = field(default_factory=dict)


def _to(obj: Any, device) -> Any:
    """A copy of `obj` with every tensor moved to `device` (CPU copies are detached clones)."""
    if torch.is_tensor(obj):
        return obj.detach().to(device, copy=True)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return copy.deepcopy(obj)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over the rows where `mask` is 1 (a padded row weighs 0)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def cross_entropy(logits: Tensor, y: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """The batch's mean cross-entropy; with a row `mask` (trainer.parallel_clients' padding), over the rows it
    weighs 1. Without one it is exactly `F.cross_entropy`, so the sequential loop's numbers do not change."""
    if mask is None:
        return F.cross_entropy(logits, y)
    return masked_mean(F.cross_entropy(logits, y, reduction="none"), mask)


class ParametersByName(Mapping):
    """A module's parameters by state_dict name, the `params` of `client_loss` in the sequential loop. The dict is
    built on the first read: walking the module tree takes ~0.2 ms for a ResNet-18, which a loss that reads no
    parameter (the default cross-entropy) should not pay every step."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module, self._params = module, None

    def _all(self) -> dict[str, Tensor]:
        if self._params is None:
            self._params = dict(self._module.named_parameters())
        return self._params

    def __getitem__(self, name: str) -> Tensor:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


_WITH_LIGHTNING: dict[type, type] = {}


def with_lightning(cls: type) -> type:
    """`cls` with Lightning's LightningModule mixed in after it (its hooks and overrides keep precedence), under
    the same name; one class per `cls`, and a class that already has it maps to itself. `functional` is read
    from the class itself (fl/core/parallel.py), so the mixed class carries the method class's own flag."""
    if cls not in _WITH_LIGHTNING:
        import lightning as L

        mixed = type(cls.__name__, (cls, L.LightningModule), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
            "functional": vars(cls).get("functional", False)})
        _WITH_LIGHTNING[cls] = _WITH_LIGHTNING[mixed] = mixed
    return _WITH_LIGHTNING[cls]


class ClientModule:
    """A LightningModule once instantiated (see the module's docstring): `self.fabric`, `self.device`,
    `manual_backward`, `automatic_optimization` and nn.Module's state_dict / parameters are Lightning's."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(with_lightning(cls))

    #: keep each client's optimizer state (e.g. momentum) in the state store across rounds
    keep_optimizer_state: bool = False
    #: attributes each client keeps between rounds (in the state store); a client's first visit starts
    #: from their values after __init__
    persistent: tuple[str, ...] = ()
    #: whether the shared part (cid -1) is a complete model worth scoring on the pooled test set
    has_global_model: bool = True
    #: whether the method trains the model's backbone apart from its head (a model without backbone parameters,
    #: such as logistic regression, is then a configuration error)
    needs_backbone: bool = False
    #: whether `personalize` fine-tunes with finetune.lr before evaluating (FedAvg-FT), so finetune.lr is read
    #: without finetune.after_round
    finetunes_for_evaluation: bool = False
    #: `personalize` changes nothing but the module's tensors (its state_dict) and `persistent` attributes, so one
    #: evaluation personalises each client once and restores a copy for its later passes (fl/core/personalized.py)
    reuse_personalized: bool = False
    #: `client_loss` is this class's whole local step (its `training_step` computes `client_loss` and its hooks have
    #: the vmapped counterparts `loss_inputs`, `trains` and `functional_train_end`), so `trainer.parallel_clients`
    #: may train K clients at once by differentiating `client_loss` (fl/core/parallel.py). Set it in the class
    #: itself: a subclass that changes the loss does not inherit it.
    functional: bool = False
    #: the scalars `training_step` returns (logged as train/<name>, client/<i>/<name>) and which way each is better
    #: (fl/core/metric_directions.py); a subclass declares its own, these are merged in
    metric_directions: ClassVar[Directions] = {"loss": LOWER}

    def __init__(self, cfg: DictConfig, data: FederatedData):
        super().__init__()
        self.cfg = cfg
        self.hp = cfg.method  # the method's typed hyperparameters, under the paper's names
        self.num_classes = data.num_classes
        self.model = build_model(cfg, data.input_shape, data.num_classes)
        self.cid = -1  # the client whose state is loaded; -1 = the global model
        self.round = -1
        self.num_train = 0
        self.data: Optional[FederatedData] = None  # the run's data on the training device, set by attach()
        self._initial_private: dict[str, Tensor] = {}
        self._initial_persistent: dict[str, Any] = {}
        self._local_optimizer = None  # the optimizer of the running fit_local
        self._input_dtype = torch.float32
        self.finetuning = False  # set by the loop in the fine-tuning rounds (`finetune.after_round`)
        self._step_logs: Optional[dict[str, Tensor]] = None  # self.log() inside a training step

    def attach(self, data: FederatedData) -> None:
        """Called once by the loop: the run's data, on the training device, in the model's dtype."""
        self.data = data
        self._input_dtype = next(self.parameters()).dtype

    @property
    def lr(self) -> float:
        """This round's learning rate (`optim.round_schedule`; `finetune.*` in the fine-tuning rounds)."""
        return finetune_lr(self.cfg, self.round) if self.finetuning else round_lr(self.cfg, self.round)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    # ---- what stays private -------------------------------------------------------------------
    def is_private(self, key: str) -> bool:
        """True for state_dict entries that never leave the client (e.g. a personal head)."""
        return False

    def _kept(self, key: str) -> bool:
        return self.finetuning or self.is_private(key)  # a fine-tuned model is the client's own, all of it

    def shared_state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items() if not self._kept(k)}

    def private_state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items() if self._kept(k)}

    def snapshot_initial_state(self) -> None:
        """Called once after initialisation: a client's private part and persistent attributes start from
        these values."""
        self._initial_private = {k: v.detach().cpu().clone() for k, v in self.private_state().items()}
        self._initial_persistent = {name: _to(getattr(self, name), "cpu") for name in self.persistent}

    # ---- communication ------------------------------------------------------------------------
    def receive(self, payload: dict[str, Any]) -> None:
        """Load what the server broadcast; by default its (shared) parameters."""
        params = payload.get("params")
        if params:
            self.load_state_dict(params, strict=False)

    def upload(self) -> Upload:
        """What this client sends back; by default every shared tensor, weighted by n_i."""
        return Upload(params={k: v.detach() for k, v in self.shared_state().items()}, weight=float(self.num_train))

    # ---- persistent client state ----------------------------------------------------------------
    def client_state(self) -> dict[str, Any]:
        """What this client keeps between rounds, on the CPU: its private tensors and `persistent`
        attributes."""
        state = {"private": {k: v.detach().cpu().clone() for k, v in self.private_state().items()}}
        state.update({name: _to(getattr(self, name), "cpu") for name in self.persistent})
        return state

    def load_client_state(self, state: Optional[dict[str, Any]]) -> None:
        """Restore what `client_state` returned (None on a client's first visit: the initial values)."""
        private = state["private"] if state is not None else self._initial_private
        if private:
            self.load_state_dict(private, strict=False)
        source = state if state is not None else self._initial_persistent
        device = next(self.parameters()).device
        for name in self.persistent:
            setattr(self, name, _to(source[name], device))

    # ---- local training -----------------------------------------------------------------------
    def train_split(self, data: FederatedData, cid: int) -> Split:
        return data.clients[cid].train

    def configure_optimizers(self):
        return build_optimizer(self.cfg, self.parameters(), self.lr)

    def optimizers(self, use_pl_optimizer: bool = True):
        """The optimizer of the running `fit_local` (for manual optimization)."""
        return self._local_optimizer

    def make_batch(self, split: Split, idx, augment_gen: Optional[torch.Generator] = None,
                   fetched: Optional[tuple] = None) -> tuple[Tensor, Tensor]:
        """(x, y) of `split[idx]` on the device, normalised in the model's dtype; with a generator, augmented
        first (`data.augment`), as training batches are, then shifted by its owner's client transform when
        the split has owners (`data.client_transform.after_augment`). `fetched`: what `fetch_batch` returned for
        these rows, one batch ahead (`batch_fetcher`)."""
        x, y, owner = fetched if fetched is not None else self.fetch_batch(split, idx, self._batch_device())
        if augment_gen is not None:
            x = augment(x, self.cfg.data.augment, augment_gen)
        if owner is not None:
            x = self.data.batch_transform(x, owner)
        return self.data.prepare(x, self._input_dtype), y

    def _batch_device(self) -> torch.device:
        return self.fabric.device if self.fabric is not None else next(self.parameters()).device

    @staticmethod
    def fetch_batch(split: Split, idx, device: torch.device) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """The rows `idx` of `split` (images, labels, owners or None) on `device`, as they are stored."""
        owner = None if split.owner is None else rows_to(split.owner, idx, device)
        return rows_to(split.x, idx, device), rows_to(split.y, idx, device), owner

    def batch_fetcher(self, split: Split) -> Optional[Callable[[Any], tuple]]:
        """`fetch_batch` for `split`, to run one batch ahead on a worker thread (`one_ahead`) where a batch is read
        from host memory (a memory-mapped split; host tensors for a CUDA device); None where it is indexed on its
        device. The worker issues its copies on this thread's CUDA stream, so each batch is ready in stream order."""
        device = self._batch_device()
        if not (split.mapped or (split.y.device.type == "cpu" and device.type == "cuda")):
            return None
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

        def fetch(idx) -> tuple:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                return self.fetch_batch(split, idx, device)
        return fetch

    def fit_local(self, optimizer, *, epochs: Optional[int] = None, steps: Optional[int] = None,
                  purpose: str = "train", hooks: bool = True,
                  step: Optional[Callable[[tuple[Tensor, Tensor], int], Any]] = None) -> dict[str, float]:
        """Run `training_step` over this client's training split, `epochs` passes or `steps` batches, with
        batches, augmentation and torch's RNG seeded by (seed, round, client, purpose). With
        `automatic_optimization` each step is zero_grad / backward / step of `optimizer`; otherwise the step
        does it through `self.optimizers()`. `hooks=False` skips the on_local_* hooks (a phase inside
        them). `step` replaces `training_step` (always optimized automatically). Returns the mean of the logged
        scalars."""
        fabric, t, seed = self.fabric, self.cfg.trainer, self.cfg.seed
        train = self.train_split(self.data, self.cid)
        self.num_train = len(train)
        previous, self._local_optimizer = self._local_optimizer, optimizer
        seed_torch(seed, self.round, self.cid, purpose)
        gen = generator(seed, self.round, self.cid, purpose)
        aug = generator(seed, self.round, self.cid, purpose + "/augment") if self.cfg.data.augment else None
        step_fn, automatic = step or self.training_step, step is not None or self.automatic_optimization
        self.train()
        if hooks:
            self.on_local_train_start()
        sums: dict[str, Tensor] = {}
        n_steps = 0
        batches = batch_indices(len(train), t.batch_size, gen, epochs=epochs, steps=steps, drop_last=t.drop_last)
        for epoch, idx, fetched in one_ahead(batches, self.batch_fetcher(train)):
            if idx is None:  # end of a pass over the data
                if hooks:
                    self.on_local_epoch_end(epoch)
                continue
            self._step_logs = {}
            try:
                with fabric.autocast():
                    batch = self.make_batch(train, idx.to(train.y.device, non_blocking=True), aug, fetched)
                    out = step_fn(batch, n_steps)
            finally:
                logged, self._step_logs = self._step_logs, None
            out = {**logged, **(out if isinstance(out, dict) else {"loss": out})}
            if automatic:
                optimizer.zero_grad(set_to_none=True)
                fabric.backward(out["loss"])
                optimizer.step()
            for k, v in out.items():
                v = v.detach() if torch.is_tensor(v) else torch.tensor(float(v))
                sums[k] = sums[k] + v if k in sums else v.clone()
            n_steps += 1
        if hooks:
            self.on_local_train_end()
        self._local_optimizer = previous
        return {k: float(v) / max(n_steps, 1) for k, v in sums.items()}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int):
        """Return the loss, or a dict with 'loss' and other scalars to log as client/<i>/<name>. By default
        `client_loss` of the module itself: its forward, its parameters, its `loss_inputs()`, every row."""
        return self.client_loss(self, self.parameters_by_name(), self.loss_inputs(), batch)

    def parameters_by_name(self) -> Mapping[str, Tensor]:
        """This module's parameters by state_dict name: `client_loss`'s `params` in `training_step`."""
        return ParametersByName(self)

    def client_loss(self, forward: Callable[[Tensor], Tensor], params: Mapping[str, Tensor], inputs: dict[str, Any],
                    batch: tuple[Tensor, Tensor], mask: Optional[Tensor] = None):
        """The client's loss on one batch, written once for both loops: `training_step` calls it with the module
        (`forward` = self, `params` = `parameters_by_name()`, `mask` None), and `trainer.parallel_clients`
        differentiates it vmapped over K clients (`forward` the model as a function of `params`, `mask` weighing
        the batch's rows, 0 for padding). So it reads the model through `forward` and `params` only, and the client's
        own tensors through `inputs` (what `loss_inputs` returned). Returns the loss, or a dict with 'loss', other
        scalars to log, and 'objective' when the gradient is taken of something else than the logged loss.
        Default: cross-entropy."""
        x, y = batch
        return cross_entropy(forward(x), y, mask)

    def loss_inputs(self) -> dict[str, Any]:
        """The client's own tensors `client_loss` reads besides the parameters (e.g. FedProx's anchor), as set by
        `on_local_train_start`; the vmapped loop stacks them over clients."""
        return {}

    def trains(self, name: str, step: int) -> bool:
        """Whether parameter `name` takes an optimizer step at local step `step` of the vmapped loop (where the
        sequential loop leaves its gradient None, e.g. FedRep's frozen part)."""
        return True

    def functional_train_end(self, steps: int) -> None:
        """After vmapped local training of `steps` optimizer steps, with the trained parameters loaded; by default
        `on_local_train_end`."""
        self.on_local_train_end()

    def log(self, name: str, value, *args, **kwargs) -> None:
        """`self.log(name, value)` inside `training_step`: logged like the step's returned scalars, as the
        round's mean of client/<i>/<name> (and train/<name> over the round's clients). Lightning's other
        arguments (on_step, prog_bar, ...) have no meaning here and are ignored."""
        if self._step_logs is None:
            raise RuntimeError(f"self.log({name!r}, ...) works inside training_step only; elsewhere return the "
                               "scalars (personalize) or add them to the metrics dict (server hooks, evaluators)")
        self._step_logs[name] = value.detach() if torch.is_tensor(value) else torch.tensor(float(value))

    def log_dict(self, dictionary: dict, *args, **kwargs) -> None:
        for name, value in dictionary.items():
            self.log(name, value)

    def finetune_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The loss of the local fine-tuning rounds (`finetune.after_round`): cross-entropy of the prediction."""
        x, y = batch
        return F.cross_entropy(self(x), y)

    def on_local_train_start(self) -> None:
        pass

    def on_local_epoch_end(self, epoch: int) -> None:
        pass

    def on_local_train_end(self) -> None:
        pass

    # ---- evaluation ---------------------------------------------------------------------------
    def eval_pass(self, split: Split, fn: Optional[Callable[[Tensor], Tensor]] = None, *,
                  batch_size: Optional[int] = None, start: int = 0, stride: int = 1,
                  autocast: bool = True) -> Iterator[tuple[Tensor, Tensor]]:
        """(fn(x), y) for consecutive batches of `split` (default fn: `predict`), in eval mode, without
        gradients and without augmentation unless `data.eval_augment` (then each batch's draws are seeded by
        its position, so any split of the pass over processes draws the same); batches start, start + stride,
        ... of `batch_size` (default: `trainer.eval_batch_size`, null giving the device's, fl/core/batches.py), so
        processes can share a pass. The train/eval mode is restored once the pass is consumed."""
        fn = fn or self.predict
        bs = batch_size or eval_batch_size(self.cfg, self._batch_device())
        augmented = bool(self.cfg.data.eval_augment and self.cfg.data.augment)  # read once: a config read is slow
        was_training = self.training
        self.eval()
        try:
            windows = ((0, slice(begin, begin + bs)) for begin in range(start * bs, len(split), stride * bs))
            for _, rows, fetched in one_ahead(windows, self.batch_fetcher(split)):
                with torch.no_grad(), self.fabric.autocast() if autocast else contextlib.nullcontext():
                    aug = generator(self.cfg.seed, self.round, self.cid, f"eval/augment/{rows.start}") \
                        if augmented else None
                    x, y = self.make_batch(split, rows, aug, fetched)
                    out = fn(x)
                yield out, y
        finally:
            self.train(was_training)

    def personalize(self) -> Optional[dict[str, float]]:
        """Runs before this client's evaluation (e.g. fine-tuning); its changes are not kept. May return
        scalars to log as client/<i>/<name> on evaluation rounds. It must give the same model each time it runs
        for the same (round, client): seed its draws by (seed, round, client, purpose) (`fit_local` does)."""
        return None

    def predict(self, x: Tensor) -> Tensor:
        """Logits of the client's model (the global model when cid == -1)."""
        return self(x)

    def route_scores(self, x: Tensor) -> Optional[Tensor]:
        """A router's scores [B, num_clients]: a query goes to the argmax client, whose model then predicts
        (fl/metrics/system.py). Computed from the server's model (cid == -1). None (the default) = no
        router; system accuracy is then the majority vote of all client models."""
        return None

    def client_scores(self, x: Tensor) -> Optional[Tensor]:
        """The router's raw per-client scores, before any correction its routing rule applies; routing accuracy
        is the share of queries whose argmax is their own client (FedDRM's "client accuracy"). Default: the
        routing scores."""
        return self.route_scores(x)
