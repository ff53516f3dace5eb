"""The round loop on one Fabric, reused for the whole run.

Each round: draw the clients (a stream fixed by the seed, the same for every method), spread them over
the processes, train each one in the long-lived ClientModule with its state swapped in, reduce the
uploads with Fabric collectives, run the server step, evaluate, log and checkpoint.
"""
from __future__ import annotations

import math
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from fl.client import ClientModule, Upload
from fl.data import FederatedData, Split, batch_indices
from fl.data.augment import augment
from fl.loggers import JsonlLogger, log_histogram
from fl.metrics import ClientAccuracy, summarize_clients, summarize_history
from fl.metrics.evaluators import EVALUATORS, LOCAL_HOOKS, enabled_evaluators
from fl.registry import METHODS
from fl.seeding import derive_seed, generator, seed_torch
from fl.server import Server
from fl.state import ClientStateStore, load_checkpoint, save_checkpoint


class TrainingFault(RuntimeError):
    """A non-finite loss or parameter: the run stops, the last good checkpoint is left as it was."""


class Interrupted(RuntimeError):
    """Ctrl-C: a checkpoint of the last completed round was written."""


def sample_clients(seed: int, round_idx: int, num_clients: int, participation: float) -> list[int]:
    """The clients drawn in a round: depends only on (seed, round), never on the method."""
    k = max(1, round(participation * num_clients))
    if k >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(seed, round_idx, -1, "sample"))
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


@dataclass
class LocalResult:
    """What one client's local work produced, as exchanged between processes (all on CPU)."""
    cid: int
    state: dict[str, Any]
    message: dict[str, Any]
    logs: dict[str, float]
    fault: Optional[str] = None
    bytes_up: int = 0  # tensors and arrays sent to the server (parameters and message)
    bytes_down: int = 0  # tensors and arrays of the server's broadcast to this client


@dataclass
class WeightedSum:
    """Streaming sum_i w_i * params_i in float64, so memory does not grow with the clients of a round.
    Integer tensors (counters such as BatchNorm's num_batches_tracked) are not averaged: their
    elementwise maximum over the clients is kept."""
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    total: float = 0.0

    def add(self, params: dict[str, torch.Tensor], weight: float) -> None:
        for k, v in params.items():
            v64 = v.to(torch.float64)
            if k not in self.sums:
                self.sums[k] = torch.zeros_like(v64) if v.is_floating_point() else torch.full_like(v64, -math.inf)
                self.dtypes[k] = v.dtype
            if v.is_floating_point():
                self.sums[k].add_(v64, alpha=weight)
            else:
                torch.maximum(self.sums[k], v64, out=self.sums[k])
        self.total += weight

    def layout(self) -> list[tuple[str, tuple, torch.dtype]]:
        return [(k, tuple(v.shape), self.dtypes[k]) for k, v in self.sums.items()]


class Orchestrator:
    def __init__(self, cfg: DictConfig, fabric: Fabric, data: FederatedData, server: Server, run_dir: Path,
                 jsonl: Optional[JsonlLogger] = None):
        self.cfg = cfg
        self.fabric = fabric
        self.run_dir = run_dir
        self.spec = METHODS[cfg.method.name]
        self.server = server
        self.store = ClientStateStore()
        self.history: list[dict] = []
        self.start_round = 0
        self.jsonl = jsonl  # rewritten from the checkpoint's history on resume
        self._stop_requested = False
        self._last_broadcast_bytes = 0
        with fabric.init_module():
            seed_torch(cfg.seed, 0, -1, "init")  # every client and the server start from one model
            self.module: ClientModule = self.spec.client_cls(cfg, data)
        # client data lives on the device, in the model's dtype, for index batching
        self.dtype = next(self.module.parameters()).dtype
        self.data = data.to(fabric.device if cfg.data.on_device else "cpu", self.dtype)
        self.module.fabric = fabric  # LightningModule's Fabric integration: manual_backward, optimizers()
        self.module.attach(self.data, self._batch)
        self.module.snapshot_initial_state()
        server.setup(self.module, self.data)
        self.ckpt_path = run_dir / "checkpoints" / "last.ckpt"

    # ---- the run ------------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg, fabric = self.cfg, self.fabric
        rounds = cfg.trainer.rounds
        bar = self._progress(rounds)
        previous = signal.signal(signal.SIGINT, self._on_sigint) if fabric.world_size == 1 else None
        try:
            for rnd in range(self.start_round, rounds):
                metrics = self.run_round(rnd)
                fabric.log_dict(metrics, step=rnd)
                self.history.append({"round": rnd, **metrics})
                last = rnd == rounds - 1
                every = cfg.trainer.checkpoint_every
                if last or (every and (rnd + 1) % every == 0):
                    self.save(rnd)
                if bar is not None:
                    bar.update(rnd, metrics)
                if self._stop_requested and not last:
                    self.save(rnd)
                    raise Interrupted(f"interrupted after round {rnd}")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            if bar is not None:
                bar.close()
        return summarize_history(self.history, cfg.trainer.last_k)

    def _on_sigint(self, signum, frame) -> None:
        if self._stop_requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self._stop_requested = True

    def run_round(self, rnd: int) -> dict[str, float]:
        cfg, fabric, server = self.cfg, self.fabric, self.server
        sampled = sample_clients(cfg.seed, rnd, self.data.num_clients, cfg.trainer.participation)
        selected = server.select(rnd, sampled)
        fabric.call("on_round_start", self, rnd, selected)

        acc = WeightedSum()
        results = []
        for cid in selected[fabric.global_rank::fabric.world_size]:
            upload, result = self.train_client(rnd, cid)
            result.bytes_up = payload_bytes(upload.params) + payload_bytes(upload.message)
            acc.add(upload.params, server.weight(cid, upload))
            results.append(result)
            if self._stop_requested:  # abandon the round: store and server still hold round rnd-1
                if rnd > 0:
                    self.save(rnd - 1)
                raise Interrupted(f"interrupted during round {rnd}")
        mean, results = self._exchange(acc, results)
        faults = [r.fault for r in results if r.fault]
        if faults:
            raise TrainingFault(faults[0])

        self.store.update({r.cid: r.state for r in results})
        fabric.call("server_step", self, rnd, mean, {r.cid: r.message for r in results})

        metrics = self._train_metrics(results)
        metrics["comm/bytes_up"] = float(sum(r.bytes_up for r in results))
        metrics["comm/bytes_down"] = float(sum(r.bytes_down for r in results))
        if (rnd + 1) % cfg.trainer.eval_every == 0 or rnd == cfg.trainer.rounds - 1:
            metrics.update(self.evaluate(rnd))
            for name in enabled_evaluators(cfg.trainer.evaluators):
                metrics.update(EVALUATORS[name](self, rnd))
            fabric.call("on_evaluate", self, rnd, metrics)
        fabric.call("on_round_end", self, rnd, metrics)
        return {k: float(v) for k, v in metrics.items()}  # plain floats: JSON, W&B and checkpoints alike

    # ---- local work ---------------------------------------------------------------------------
    def load_client(self, rnd: int, cid: int) -> ClientModule:
        """Swap client `cid` into the module: the server's broadcast, then the client's own state."""
        m = self.module
        m.cid, m.round = cid, rnd
        payload = self.server.broadcast(cid)
        self._last_broadcast_bytes = payload_bytes(payload)
        m.receive(payload)
        m.load_client_state(self.store.get(cid) if cid >= 0 else None)
        return m

    def train_client(self, rnd: int, cid: int) -> tuple[Upload, LocalResult]:
        m = self.load_client(rnd, cid)
        state = self.store.get(cid)
        optimizer = self.fabric.setup_optimizers(m.configure_optimizers())
        if m.keep_optimizer_state and state is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
            for group in optimizer.param_groups:  # the stored lr is last round's; the schedule sets this one's
                group["lr"] = m.lr
        t = self.cfg.trainer
        logs = self.fit_local(rnd, cid, optimizer, epochs=t.local_epochs, steps=t.local_steps)
        upload = m.upload()
        for name in enabled_evaluators(self.cfg.trainer.evaluators):  # evaluators that score local models
            if name in LOCAL_HOOKS:
                LOCAL_HOOKS[name](self, rnd, cid, m)
        fault = None if math.isfinite(logs.get("loss", 0.0)) and _finite(upload.params) else (
            f"non-finite loss or parameters in method '{self.cfg.method.name}', client {cid}, round {rnd}")
        new_state = m.client_state()
        if m.keep_optimizer_state:
            new_state["optimizer"] = _to_cpu(optimizer.state_dict())
        result = LocalResult(cid, new_state, _to_cpu(upload.message), logs, fault,
                             bytes_down=self._last_broadcast_bytes)
        return upload, result

    def fit_local(self, rnd: int, cid: int, optimizer, *, epochs: Optional[int] = None,
                  steps: Optional[int] = None, purpose: str = "train") -> dict[str, float]:
        """Run the module's training_step over the client's data; returns mean logged scalars."""
        m, fabric, t = self.module, self.fabric, self.cfg.trainer
        train = m.train_split(self.data, cid)
        m.num_train = len(train)
        m._fabric_optimizers = [optimizer]
        seed_torch(self.cfg.seed, rnd, cid, purpose)
        gen = generator(self.cfg.seed, rnd, cid, purpose)
        aug = generator(self.cfg.seed, rnd, cid, purpose + "/augment") if self.cfg.data.augment else None
        m.train()
        m.on_local_train_start()
        sums: dict[str, torch.Tensor] = {}
        n_steps, epoch = 0, 0
        for epoch, idx in batch_indices(len(train), t.batch_size, gen, epochs=epochs, steps=steps,
                                        drop_last=t.drop_last):
            if idx is None:  # end of a pass over the data
                m.on_local_epoch_end(epoch)
                continue
            with fabric.autocast():
                out = m.training_step(self._batch(train, idx.to(train.y.device, non_blocking=True), aug), n_steps)
            out = out if isinstance(out, dict) else {"loss": out}
            if m.automatic_optimization:
                optimizer.zero_grad(set_to_none=True)
                fabric.backward(out["loss"])
                optimizer.step()
            for k, v in out.items():
                v = v.detach() if torch.is_tensor(v) else torch.tensor(float(v))
                sums[k] = sums[k] + v if k in sums else v.clone()
            n_steps += 1
        m.on_local_train_end()
        return {k: float(v) / max(n_steps, 1) for k, v in sums.items()}

    def _batch(self, split: Split, idx, aug_gen: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather a batch from the client's tensors, augment it (training, `data.augment`), normalise it,
        and put it on the device."""
        device = self.fabric.device
        x, y = split.x[idx].to(device, non_blocking=True), split.y[idx].to(device, non_blocking=True)
        if aug_gen is not None:
            x = augment(x, self.cfg.data.augment, aug_gen)
        return self.data.prepare(x, self.dtype), y

    def _exchange(self, acc: WeightedSum, results: list[LocalResult]):
        """All-reduce the weighted parameter sums and gather every client's result, in client order."""
        fabric = self.fabric
        if fabric.world_size == 1:
            gathered, layouts, total = results, [acc.layout()], acc.total
        else:
            parts = [fabric.broadcast((results, acc.layout(), acc.total) if fabric.global_rank == src else None,
                                      src=src) for src in range(fabric.world_size)]
            gathered = [r for res, _, _ in parts for r in res]
            layouts = [lay for _, lay, _ in parts]
            total = sum(tot for _, _, tot in parts)
        gathered.sort(key=lambda r: r.cid)
        layout = next((lay for lay in layouts if lay), [])
        if not layout or total <= 0:
            return {}, gathered
        mean = {}
        for floating, op in ((True, "sum"), (False, "max")):  # weighted sums, then integer maxima
            part = [(k, shape, dtype) for k, shape, dtype in layout if dtype.is_floating_point == floating]
            if not part:
                continue
            empty = 0.0 if floating else -math.inf  # a process without clients contributes nothing
            flat = torch.cat([acc.sums[k].flatten() if k in acc.sums else
                              torch.full((math.prod(shape),), empty, dtype=torch.float64, device=fabric.device)
                              for k, shape, _ in part])
            if fabric.world_size > 1:
                flat = fabric.all_reduce(flat, reduce_op=op)
            if floating:
                flat = flat / total
            offset = 0
            for k, shape, dtype in part:
                n = math.prod(shape)
                mean[k] = flat[offset:offset + n].view(shape).to(dtype)
                offset += n
        return {k: mean[k] for k, _, _ in layout}, gathered

    def _train_metrics(self, results: list[LocalResult]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for r in results:
            for k, v in r.logs.items():
                metrics[f"client/{r.cid}/{k}"] = v
        if results:
            for k in results[0].logs:
                metrics[f"train/{k}"] = sum(r.logs.get(k, 0.0) for r in results) / len(results)
        metrics["train/clients"] = float(len(results))
        return metrics

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def _predict(self, split: Split, start: int = 0, stride: int = 1):
        bs = self.cfg.trainer.eval_batch_size
        self.module.eval()
        for begin in range(start * bs, len(split), stride * bs):
            x, y = self._batch(split, slice(begin, begin + bs))
            with self.fabric.autocast():
                yield self.module.predict(x).argmax(1), y

    def evaluate(self, rnd: int) -> dict[str, float]:
        """Each client's model on its own test split; the global model on the pooled test set."""
        fabric, m = self.fabric, self.module
        per_client = ClientAccuracy(self.data.num_clients).to(fabric.device)
        for cid in range(fabric.global_rank, self.data.num_clients, fabric.world_size):
            self.load_client(rnd, cid)
            m.personalize(self, cid)
            for preds, y in self._predict(self.data.clients[cid].test):
                per_client.update(preds, y, cid)
        correct, total = (t.reshape(-1) for t in per_client.compute())  # torchmetrics squeezes 1-element results
        metrics = summarize_clients(correct, total, self.data.train_sizes())
        acc = (correct / total.clamp_min(1)).tolist()
        metrics.update({f"client/{i}/acc": a for i, a in enumerate(acc)})
        if self.server.has_global_model:
            self.load_client(rnd, -1)
            pooled = MulticlassAccuracy(self.data.num_classes, average="micro").to(fabric.device)
            for preds, y in self._predict(self.data.pooled_test(), fabric.global_rank, fabric.world_size):
                pooled.update(preds, y)
            metrics["test/acc_global"] = float(pooled.compute())
            if self.data.target is not None:
                metrics.update(self._target_metrics())
        return metrics

    def log_histogram(self, key: str, values, rnd: int) -> None:
        """A per-round distribution for the dashboards (W&B only; scalars go through the metrics dict)."""
        log_histogram(self.fabric.loggers, key, values, rnd)

    def _target_metrics(self) -> dict[str, float]:
        """The global model on the target client's validation and test data (FedPALS' protocol); every
        process scores the whole (small) sets, so no collective is needed. Macro-F1 averages over the
        classes present in the test labels (WILDS' convention)."""
        t, K, device = self.data.target, self.data.num_classes, self.fabric.device
        out = {}
        for name, split in (("val", t.val), ("test", t.test)):
            acc = MulticlassAccuracy(K, average="micro").to(device)
            f1 = MulticlassF1Score(K, average="none").to(device)
            for preds, y in self._predict(split):
                acc.update(preds, y)
                f1.update(preds, y)
            out[f"{name}/target_acc"] = float(acc.compute())
            if name == "test":
                present = torch.bincount(split.y, minlength=K) > 0
                out["test/target_f1"] = float(f1.compute()[present.to(device)].mean())
        return out

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self, rnd: int) -> None:
        """Everything a resumed run needs; random draws derive from (seed, round, client, purpose), so
        the round is the whole RNG state."""
        state = {
            "round": rnd,
            "rng": {"seed": int(self.cfg.seed), "next_round": rnd + 1},
            "server": self.server.state_dict(),
            "clients": self.store.state_dict(),
            "history": self.history,
            "fingerprint": self.data.fingerprint(),
        }
        save_checkpoint(self.fabric, self.ckpt_path, state)

    def restore(self) -> None:
        if not self.ckpt_path.is_file():
            raise FileNotFoundError(f"resume: no checkpoint at {self.ckpt_path}")
        state = load_checkpoint(self.fabric, self.ckpt_path)
        if state["fingerprint"] != self.data.fingerprint():
            raise ValueError(f"resume: the data split of {self.ckpt_path} differs from this config's")
        self.server.load_state_dict(state["server"], self.fabric.device)
        self.store.load_state_dict(state["clients"])
        self.history = list(state["history"])
        self.start_round = state["round"] + 1
        if self.jsonl is not None:
            self.jsonl.rewrite(self.history)

    def _progress(self, rounds: int):
        if not self.fabric.is_global_zero or not self.cfg.logger.progress:
            return None
        from fl.progress import RoundProgress

        return RoundProgress(rounds, self.start_round)


def payload_bytes(obj: Any) -> int:
    """Bytes of the tensors and arrays in a (nested) payload, as they would travel."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


def _finite(params: dict[str, torch.Tensor]) -> bool:
    floats = [p for p in params.values() if p.is_floating_point()]
    return not floats or bool(torch.isfinite(torch.stack([p.sum() for p in floats])).all())


def _to_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
