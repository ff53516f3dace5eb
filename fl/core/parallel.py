"""K clients' local training as one program (`trainer.parallel_clients=K`): their parameters and optimizer state
stacked on a leading client axis, one `torch.func.vmap`-ed forward/backward per step over a [K, B, ...] batch.

Each client draws the same batches, augmentations and steps as in the sequential loop (its generators derive from
(seed, round, client, purpose)); a client with fewer steps, or a smaller last batch, is masked, never fed
invented samples: its parameters and optimizer state stay as they are on a masked step, and padded rows weigh 0 in
its loss. The optimizers (SGD with momentum and weight decay, Adam, AdamW) are written out below with torch.optim's
update rules, per client, so K clients at once equal K clients one after another up to float reduction order.

A method opts in by setting `functional = True` in its ClientModule class (not inherited: a subclass that changes
the loss opts in itself). Its loss is the one its `training_step` computes, `client_loss(forward, params, inputs,
batch, mask)`: here `forward` is one client's model as a function of its parameters (functional_call), `inputs`
are what `loss_inputs()` returned for the client (stacked too), `mask` weighs the padded rows 0, and the gradient is
taken of its 'objective' entry if it has one, else of 'loss'. `on_local_train_start` runs before and
`functional_train_end(steps)` after the vmapped training; epoch-end hooks are not called. `client_loss` is traced by
torch.compile (`trainer.compile`): it reads hyperparameters as plain Python numbers set in `__init__`, never through
the OmegaConf config (a config read breaks the graph and the step runs uncompiled).

Under `fabric.precision=bf16-mixed` the forward (`client_loss`) runs in the same autocast as the sequential
loop's `training_step`, and the gradient is taken outside it, as `fabric.backward` takes it there. 16-mixed stays
sequential: each client's loss scale grows, shrinks and skips steps on its own gradients' overflow (a GradScaler
state per client), which this vmapped step does not implement.

Compiled, every step has one shape, [trainer.parallel_clients, trainer.batch_size, ...]: a smaller last group is
padded with clients that have no steps, a shorter batch with rows of weight 0, so one graph serves the whole run.
Uncompiled, a step is as wide as its clients and batches (padding would be work for nothing).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fl.core.batches import batch_indices
from fl.core.client import ClientModule
from fl.core.optim import build_optimizer
from fl.core.seeding import generator

STATEFUL_IN_TRAINING = (nn.modules.batchnorm._BatchNorm, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)


def why_sequential(module: ClientModule, cfg) -> Optional[str]:
    """Why this run's clients cannot be trained K at a time (None when they can)."""
    cls = type(module)
    if not vars(cls).get("functional", False):
        return f"method '{cfg.method.name}' does not declare its local step functional ({cls.__name__}.functional)"
    if cls.configure_optimizers is not ClientModule.configure_optimizers:
        return f"{cls.__name__} makes its own optimizer"
    if cls.on_local_epoch_end is not ClientModule.on_local_epoch_end:
        return f"{cls.__name__} acts at the end of each local epoch"
    layer = next((m for m in module.model.modules() if isinstance(m, STATEFUL_IN_TRAINING)), None)
    if layer is not None:
        return f"the model has {type(layer).__name__}, whose training-mode state or randomness is per batch"
    if module.keep_optimizer_state:
        return "the method keeps optimizer state across rounds"
    if cfg.optim.name not in ("sgd", "adam", "adamw"):
        return f"optim.name={cfg.optim.name!r} has no vmapped update"
    if str(cfg.fabric.precision) == "16-mixed":
        return ("fabric.precision='16-mixed' needs a loss scale per client (each skips the steps its own gradients "
                "overflow), which the vmapped step does not implement; bf16-mixed needs no scaler and is vmapped")
    if str(cfg.fabric.precision) not in ("32-true", "32", "64-true", "64", "bf16-mixed"):
        return f"fabric.precision={cfg.fabric.precision!r} is not vmapped"
    return None


def autocast_dtype(cfg) -> Optional[torch.dtype]:
    """The dtype the forward runs in under autocast (fabric.precision=bf16-mixed), None without autocast."""
    return torch.bfloat16 if str(cfg.fabric.precision) == "bf16-mixed" else None


class ParallelClients:
    """Trains groups of clients of one round as one program on the module's device."""

    def __init__(self, module: ClientModule, cfg) -> None:
        self.m, self.cfg = module, cfg
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        # compiled: one shape for every step of the run (see the module docstring)
        self.fixed_shape = (cfg.trainer.parallel_clients, cfg.trainer.batch_size) if cfg.trainer.compile else None
        device, dtype = next(module.parameters()).device.type, autocast_dtype(cfg)

        def loss(p, b, inputs, x, y, w):
            with torch.autocast(device, dtype=dtype, enabled=dtype is not None):  # the forward only, as in fit_local
                out = module.client_loss(lambda xb: functional_call(module, {**p, **b}, (xb,)), p, inputs, (x, y), w)
            out = dict(out) if isinstance(out, dict) else {"loss": out}
            return out.pop("objective", out["loss"]), out

        # one client's gradient, vmapped over the leading client axis of every argument
        self.step_grad = vmap(grad(loss, has_aux=True))
        if cfg.trainer.compile:
            self.step_grad = torch.compile(self.step_grad, backend=cfg.trainer.compile_backend)

    # ---- the clients' batches, as the sequential loop draws them -----------------------------------------------
    def _schedule(self, rnd: int, cid: int) -> tuple[object, list[Tensor], Optional[torch.Generator]]:
        t, seed = self.cfg.trainer, self.cfg.seed
        train = self.m.train_split(self.m.data, cid)
        gen = generator(seed, rnd, cid, "train")
        aug = generator(seed, rnd, cid, "train/augment") if self.cfg.data.augment else None
        steps = [idx for _, idx in batch_indices(len(train), t.batch_size, gen, epochs=t.local_epochs,
                                                 steps=t.local_steps, drop_last=t.drop_last) if idx is not None]
        return train, steps, aug

    def _batch(self, s: int, schedules) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Step s of every client: inputs [K, B, ...], labels [K, B], sample mask [K, B], step mask [K]."""
        parts = []
        for train, steps, aug in schedules:
            if s < len(steps):
                idx = steps[s]
                parts.append(self.m.make_batch(train, idx.to(train.y.device, non_blocking=True), aug))
            else:
                parts.append(None)
        shape = next(p for p in parts if p is not None)[0].shape[1:]
        width = self.fixed_shape[1] if self.fixed_shape else max(len(p[1]) for p in parts if p is not None)
        ref = next(p for p in parts if p is not None)
        x = ref[0].new_zeros((len(parts), width, *shape))
        y = ref[1].new_zeros((len(parts), width))
        w = torch.zeros((len(parts), width), dtype=ref[0].dtype, device=ref[0].device)
        for k, p in enumerate(parts):
            if p is not None:
                n = len(p[1])
                x[k, :n], y[k, :n], w[k, :n] = p[0], p[1], 1
        return x, y, w, (w.sum(1) > 0)

    # ---- training ----------------------------------------------------------------------------------------------
    def train(self, rnd: int, cids: list[int], load) -> list[tuple[dict[str, Tensor], dict[str, float], int]]:
        """Local training of clients `cids` (`load(cid)` swaps a client into the module); returns, per client, its
        trained parameters, the means of its logged scalars over its steps, and its number of steps."""
        m = self.m
        starts, buffers, inputs, schedules = [], [], [], []
        for cid in cids:
            load(cid)
            m.on_local_train_start()
            starts.append({n: p.detach().clone() for n, p in m.named_parameters() if n in self.names})
            buffers.append({n: b.detach().clone() for n, b in m.named_buffers()})
            inputs.append(m.loss_inputs())
            schedules.append(self._schedule(rnd, cid))
        if self.fixed_shape:  # padding clients: the first one's tensors, no steps (masked throughout, then dropped)
            padding = self.fixed_shape[0] - len(cids)
            starts, buffers, inputs = starts + starts[:1] * padding, buffers + buffers[:1] * padding, \
                inputs + inputs[:1] * padding
            schedules = schedules + [(schedules[0][0], [], None)] * padding
        params, bufs, inputs = stack(starts), stack(buffers), stack(inputs)
        opt = Optimizer(self.cfg, m.lr, params)
        m.train()
        sums: dict[str, Tensor] = {}
        steps = [len(s[1]) for s in schedules]
        for s in range(max(steps, default=0)):
            x, y, w, active = self._batch(s, schedules)
            grads, out = self.step_grad(params, bufs, inputs, x, y, w)
            params = opt.step(params, grads, active, {n for n in self.names if m.trains(n, s)})
            for k, v in out.items():
                v = torch.where(active, v.detach(), torch.zeros_like(v))
                sums[k] = sums[k] + v if k in sums else v
        return [({n: params[n][k] for n in self.names},
                 {key: float(v[k]) / max(steps[k], 1) for key, v in sums.items()}, steps[k]) for k in range(len(cids))]


def stack(trees: list) -> object:
    """The clients' nested dicts of tensors as one, each tensor stacked on a new leading client axis."""
    if torch.is_tensor(trees[0]):
        return torch.stack(trees)
    return {key: stack([tree[key] for tree in trees]) for key in trees[0]}


class Optimizer:
    """torch.optim's SGD / Adam / AdamW update, on parameters stacked over clients, applied only where `active`.
    Hyperparameters come from the optimizer `build_optimizer` makes, so both loops read the same ones."""

    def __init__(self, cfg, lr: float, params: dict[str, Tensor]) -> None:
        self.kind = cfg.optim.name
        self.hp = build_optimizer(cfg, [nn.Parameter(torch.zeros(1))], lr).param_groups[0]
        self.state = {n: [torch.zeros_like(v), torch.zeros_like(v)] for n, v in params.items()}
        # Adam's step count per parameter and client (torch.optim counts a parameter's own steps), on the parameters'
        # device: a step moves nothing between host and device. float64, as torch.optim's bias corrections are
        # Python floats.
        self.t = {n: torch.zeros(v.shape[0], dtype=torch.float64, device=v.device) for n, v in params.items()}

    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], active: Tensor,
             stepping: set[str]) -> dict[str, Tensor]:
        """One step of the parameters in `stepping` (the others are left as torch.optim leaves a parameter
        without a gradient: not moved, state untouched)."""
        hp, new = self.hp, dict(params)
        for n in stepping:
            p, g, (a, b) = params[n], grads[n], self.state[n]
            on = active.view(-1, *[1] * (p.dim() - 1))
            if self.kind == "sgd":
                if hp["weight_decay"]:
                    g = g + hp["weight_decay"] * p
                if hp["momentum"]:
                    a_new = hp["momentum"] * a + g  # zero at the start: the first step's buffer is g, as in torch
                    self.state[n][0], g = torch.where(on, a_new, a), a_new
                p_new = p - hp["lr"] * g
            else:
                beta1, beta2 = hp["betas"]
                if self.kind == "adamw":
                    p = p * (1 - hp["lr"] * hp["weight_decay"])
                elif hp["weight_decay"]:
                    g = g + hp["weight_decay"] * p
                self.t[n] = self.t[n] + active
                a_new = torch.lerp(a, g, 1 - beta1)
                b_new = b * beta2 + (1 - beta2) * g * g
                t = self.t[n].clamp(min=1)
                step_size = (hp["lr"] / (1 - beta1 ** t)).to(p).view_as(on)
                root_bc2 = torch.sqrt(1 - beta2 ** t).to(p).view_as(on)
                p_new = p - step_size * a_new / (b_new.sqrt() / root_bc2 + hp["eps"])
                self.state[n] = [torch.where(on, a_new, a), torch.where(on, b_new, b)]
            new[n] = torch.where(on, p_new, params[n])
        return new
