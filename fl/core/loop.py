"""The round loop on one Fabric, reused for the whole run.

Each round: draw the clients (a stream fixed by the seed, the same for every method), let each process train
the ones it owns (client cid lives on process cid % world_size, with its state) in the long-lived ClientModule
with its state swapped in, reduce the uploads (fl/core/exchange.py) into the server's aggregate
(fl/core/aggregation.py), run the server step, evaluate (fl/core/evaluation.py), log and checkpoint. A client's
state never leaves its process except into a checkpoint.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fl.core.aggregate_check import check_aggregate
from fl.core.aggregation import Uploads
from fl.core.callbacks import Callback
from fl.core.client import ClientModule, Upload
from fl.core.context import EvalContext, RoundContext
from fl.core.divergence import Divergence, find_divergence, initial_norm, parameter_norm, reference_loss, squared_norms
from fl.core.eval_schedule import is_eval_round
from fl.core.evaluation import Evaluator, evaluate_clients
from fl.core.evaluator_check import checked_metrics
from fl.core.exchange import (
    LocalResult,
    all_finite,
    exchange,
    gather_objects,
    gather_to_zero,
    payload_bytes,
    to_cpu,
)
from fl.core.federated_data import FederatedData
from fl.core.metric_directions import LOWER, NEITHER, Directions
from fl.core.optim import build_optimizer, is_finetune_round
from fl.core.parallel import ParallelClients, why_sequential
from fl.core.plugin_calls import blamed
from fl.core.precision import loss_scaler
from fl.core.registry import EVALUATORS, METHODS, evaluator_names
from fl.core.seeding import derive_seed, seed_torch
from fl.core.server import Server
from fl.core.state import CheckpointError, ClientStateStore, host_memory_bytes, make_state_store, save_checkpoint

if TYPE_CHECKING:  # Lightning loads with the run, not with a method or an evaluator
    from lightning.fabric import Fabric

LOSS_SCALE = "loss_scale"  # a client state's entry: its GradScaler state under 16-mixed
# What the loop itself logs every round, and which way is better; the clients' training scalars (train/<name>) are
# their ClientModule's metric_directions (fl/core/metric_directions.py).
LOOP_METRICS: Directions = {"train/clients": NEITHER, "comm/bytes_up": LOWER, "comm/bytes_down": LOWER,
                            "time/round_s": LOWER, "time/eval_s": LOWER, "time/evaluators_s": LOWER}
# ... and under a robust aggregator (server.aggregator.name), the faulty uploads it left out of each round
ROBUST_METRICS: Directions = {"server/faulty_uploads": LOWER}


class TrainingFault(RuntimeError):
    """A non-finite loss or parameter: the run stops, the last good checkpoint is left as it was. `where` (round,
    client, method, reason) is what summary.json records of the stop, as for a divergence: the run has ended, and
    the same seed would stop there again."""

    def __init__(self, message: str, where: Optional[Divergence] = None):
        super().__init__(message)
        self.where = where


class Diverged(TrainingFault):
    """A finite loss or model grown by orders of magnitude (fl/core/divergence.py) under trainer.on_divergence=stop:
    the run stops, the last checkpoint is left as it was."""

    def __init__(self, where: Divergence):
        super().__init__(describe(where), where)


def describe(where: Divergence) -> str:
    return f"method '{where.method}' diverged at client {where.client}, round {where.round}: {where.reason}"


NON_FINITE = "non-finite loss or parameters"


def non_finite(where: Divergence) -> TrainingFault:
    """The non-finite guard's stop: the message names the method, client (or the server's aggregate) and round."""
    if where.client is None:
        return TrainingFault(f"{where.reason} in method '{where.method}', round {where.round}", where)
    return TrainingFault(f"{where.reason} in method '{where.method}', client {where.client}, round {where.round}",
                         where)


class Interrupted(RuntimeError):
    """Ctrl-C: a checkpoint of the last completed round was written."""


def sample_clients(seed: int, round_idx: int, num_clients: int, participation: float,
                   scheme: str = "fixed") -> list[int]:
    """The clients drawn in a round: depends only on (seed, round), never on the method.
    fixed: exactly max(1, round(q M)) of the M clients, without replacement; bernoulli: each client independently
    with probability q (pFedFDA's code), so a round may have any number of clients, none included."""
    rng = np.random.default_rng(derive_seed(seed, round_idx, -1, "sample"))
    if scheme == "bernoulli":
        return np.flatnonzero(rng.random(num_clients) < participation).tolist()
    k = max(1, round(participation * num_clients))
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


def validation_keys(metrics: dict[str, float]) -> dict[str, float]:
    """An evaluation on the validation splits under its own names: test/X -> val/X, client/<i>/acc ->
    client/<i>/val_acc; the clients' other scalars were logged by the test evaluation."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("test/"):
            out["val/" + key[len("test/"):]] = value
        elif key.startswith("client/") and key.endswith("/acc"):
            out[key[:-len("acc")] + "val_acc"] = value
    return out


def enabled_evaluators(cfg: DictConfig) -> list[Evaluator]:
    """One instance of each evaluator `trainer.evaluators` names (null: every default one), with its
    `evaluators.<name>` settings."""
    settings = cfg.get("evaluators") or {}
    return [EVALUATORS[n](settings.get(n)) for n in evaluator_names(cfg.trainer.evaluators)]


def make_client_module(cfg: DictConfig, fabric: Fabric, data: FederatedData) -> tuple[ClientModule, FederatedData]:
    """The method's ClientModule, seeded so every client and the server start from one model, attached to
    the run's data moved to the device in the model's dtype (index batching); returns both. The loop keeps
    one for the whole run; a unit test can drive one client through it without a run. The module refers to
    `fabric` weakly (Lightning's choice): keep the Fabric alive as long as the module is used.

    The initial model is drawn on the CPU, in the dtype Fabric's init context gives, then moved to the device:
    a CUDA generator draws other numbers than the CPU's (seed 0 would start elsewhere on a GPU), and a draw with
    a CPU `torch.Generator` fails under Fabric's `torch.device(cuda)` context."""
    with fabric.init_module(), torch.device("cpu"):  # the innermost device context decides where tensors go
        seed_torch(cfg.seed, 0, -1, "init")
        module: ClientModule = METHODS[cfg.method.name].client_cls(cfg, data)
    module = module.to(fabric.device)
    dtype = next(module.parameters()).dtype
    data = data.to(fabric.device if cfg.data.on_device else "cpu", dtype)
    module.fabric = fabric  # LightningModule's Fabric integration: manual_backward, autocast
    module.attach(data)
    module.snapshot_initial_state()
    return module, data


class Orchestrator:
    def __init__(self, cfg: DictConfig, fabric: Fabric, data: FederatedData, server: Server, run_dir: Path,
                 callbacks: Sequence[Callback] = ()):
        self.cfg = cfg
        self.fabric = fabric
        self.server = server
        self.store = make_state_store(cfg, fabric, run_dir, self.owns)  # locked for this run until store.close()
        self.history: list[dict] = []
        self.start_round = 0
        self.evaluators = enabled_evaluators(cfg)
        self._stop_requested = False
        self._last_broadcast_bytes = 0
        self._memory_checked = False
        # the round's wall seconds in the clients' and global model's evaluation, and in the evaluators (their
        # evaluate and on_local_model): what bench/reproduce_budget.py splits a run's time by
        self._seconds = {"eval": 0.0, "evaluators": 0.0}
        self.callbacks = list(callbacks)  # Fabric calls them after the server; the loop keeps their state
        self._callback_states = self.callback_states()  # as of the last completed round: what a checkpoint holds
        self.stopped: Optional[dict] = None  # {"round", "reason"} once a hook ended the run (ctx.stop)
        self.module, self.data = make_client_module(cfg, fabric, data)
        # 16-mixed: the one GradScaler of this process carries each client's own loss scale in turn (load_client)
        self.scaler = loss_scaler(fabric)
        self._initial_scale = self.scaler.state_dict() if self.scaler is not None else None
        self.diverged: Optional[Divergence] = None  # the first divergence seen (trainer.on_divergence=warn)
        self._warned_faulty: set[int] = set()  # clients whose faulty upload a robust aggregator left out
        self._initial_norms = squared_norms(self.module.state_dict())
        self.parallel = self._parallel_clients()
        server.setup(self.module, self.data)
        self.ckpt_path = run_dir / "checkpoints" / "last.ckpt"

    # ---- the run ------------------------------------------------------------------------------
    def fit(self, progress=None) -> list[dict]:
        """Rounds start_round .. rounds-1, or up to the round after which a hook asked to stop (ctx.stop); returns
        the metric history (one dict per round). `progress`, if given, gets update(round, metrics) after each round
        and close() at the end."""
        cfg, fabric = self.cfg, self.fabric
        rounds = cfg.trainer.rounds
        previous = signal.signal(signal.SIGINT, self._on_sigint) if fabric.world_size == 1 else None
        try:
            for rnd in range(self.start_round, rounds if self.stopped is None else 0):  # a stopped run stays so
                start = time.perf_counter()
                self._seconds = dict.fromkeys(self._seconds, 0.0)
                metrics = self.run_round(rnd)
                # training, aggregation and evaluation; varies run to run, so tests compare rows without time/*
                metrics["time/round_s"] = time.perf_counter() - start
                metrics.update({f"time/{k}_s": v for k, v in self._seconds.items()})
                fabric.log_dict(metrics, step=rnd)
                self.history.append({"round": rnd, **metrics})
                self._callback_states = self.callback_states()
                reason = self.agreed_stop(self._round_ctx.stop_reason)
                if reason is not None:
                    self.stopped = {"round": rnd, "reason": reason}
                last = rnd == rounds - 1 or self.stopped is not None
                every = cfg.trainer.checkpoint_every
                if last or (every and (rnd + 1) % every == 0):
                    self.save(rnd)
                if progress is not None:
                    progress.update(rnd, metrics)
                if self.stopped is not None:
                    break
                if self._stop_requested and not last:
                    self.save(rnd)
                    raise Interrupted(f"interrupted after round {rnd}")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            if progress is not None:
                progress.close()
        return self.history

    def agreed_stop(self, reason: Optional[str]) -> Optional[str]:
        """A stop asked for on any process (the first in rank order) stops every process after the same round."""
        if self.fabric.world_size == 1:
            return reason
        return next((r for r in gather_objects(self.fabric, reason) if r is not None), None)

    def _on_sigint(self, signum, frame) -> None:
        if self._stop_requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self._stop_requested = True

    def _parallel_clients(self) -> Optional[ParallelClients]:
        """`trainer.parallel_clients` > 1: the vmapped trainer, or None (and a notice) where it cannot be used."""
        k = self.cfg.trainer.parallel_clients
        if k == 1:
            return None
        reason = why_sequential(self.module, self.cfg)
        if reason is None:
            if self.fabric.device.type == "cpu" and self.fabric.is_global_zero:  # a CPU is not launch-bound
                print(f"notice: trainer.parallel_clients={k} on a CPU: {k} clients' steps run as one vmapped program, "
                      "which measured slower than one client at a time for most models on a CPU (the table: "
                      "docs/parallel-clients.md); it is meant for GPUs. trainer.parallel_clients=1 trains them one at "
                      "a time", file=sys.stderr)
            return ParallelClients(self.module, self.cfg)
        if self.fabric.is_global_zero:
            print(f"notice: trainer.parallel_clients={k}: {reason}; training one client at a time", file=sys.stderr)
        return None

    def warn_if_states_outgrow_memory(self) -> None:
        """Once the first states are stored in memory: say so when all of this node's would not fit its memory (the
        operating system kills such a run hours later, without a word)."""
        if not isinstance(self.store, ClientStateStore) or not self.fabric.is_global_zero:
            return
        owned = len(range(self.fabric.global_rank, self.data.num_clients, self.fabric.world_size))
        on_node = self.fabric.world_size // self.cfg.fabric.num_nodes
        need, have = self.store.projected_bytes(owned) * on_node, host_memory_bytes()
        if need > 0.8 * have:
            print(f"warning: the client states will take about {need / 2**30:.1f} GiB in memory ({owned} clients x "
                  f"{need / on_node / owned / 2**20:.0f} MiB on each of {on_node} process(es)), and this machine has "
                  f"{have / 2**30:.1f} GiB: set state.cache_mb=2048 to keep them on disk behind a 2 GiB cache",
                  file=sys.stderr)

    def owns(self, cid: int) -> bool:
        """Client cid's state lives on this process, which trains and evaluates it (the evaluators' split too)."""
        return cid % self.fabric.world_size == self.fabric.global_rank

    def context(self, rnd: int) -> EvalContext:
        return EvalContext(rnd, self.fabric, self.data, self.cfg, module=self.module,
                           load_client=lambda cid: self.load_client(rnd, cid, read_ahead=True))

    def run_round(self, rnd: int) -> dict[str, float]:
        cfg, fabric, server = self.cfg, self.fabric, self.server
        ctx = self.context(rnd)
        round_ctx = self._round_ctx = RoundContext(rnd, fabric, self.data, cfg)  # fit() reads its stop request
        t = cfg.trainer
        finetuning = self.module.finetuning = is_finetune_round(cfg, rnd)
        sampled = sample_clients(cfg.seed, rnd, self.data.num_train_clients, t.participation, t.sampling)
        selected = sampled if finetuning else server.select(rnd, sampled)
        if not selected:  # possible under bernoulli sampling: nothing trains, the server hooks are skipped
            metrics = {"train/clients": 0.0, "comm/bytes_up": 0.0, "comm/bytes_down": 0.0}
            if is_eval_round(self.cfg, rnd):
                metrics.update(self.evaluate(ctx))
                fabric.call("on_evaluate", round_ctx, metrics)
            return {k: float(v) for k, v in metrics.items()}
        if not finetuning:  # a fine-tuning round has no server step: the global model stays as it was
            fabric.call("on_round_start", round_ctx, selected)

        uploads = Uploads(keep_each=server.needs_every_upload)
        results = []
        mine = [cid for cid in selected if self.owns(cid)]
        for i, (cid, (upload, result)) in enumerate(zip(mine, self.local_work(rnd, mine))):
            if i + 1 < len(mine):  # read the next client's state while this one trains
                self.store.prefetch(mine[i + 1])
            self.store.stage(cid, result.state, rnd)  # stays on this process; the store sees it at commit
            result.state = {}
            result.bytes_up = payload_bytes(upload.params) + payload_bytes(upload.message)
            if not finetuning:
                uploads.add(cid, upload.params, server.weight(cid, upload))
            results.append(result)
            if self._stop_requested:  # abandon the round: store and server still hold round rnd-1
                if rnd > 0:
                    self.save(rnd - 1)
                raise Interrupted(f"interrupted during round {rnd}")
        mean, results = exchange(fabric, uploads.sum, results)
        faults = [r.fault for r in results if r.fault]
        left_out = self.leave_out_faulty(rnd, results) if faults and not finetuning else frozenset()
        if faults and not left_out:
            raise non_finite(faults[0])
        if self.diverged is None:
            self.check_divergence(rnd, results)

        self.store.commit(rnd, left_out)
        if not self._memory_checked and len(self.store):
            self._memory_checked = True
            self.warn_if_states_outgrow_memory()
        if not finetuning:
            gathered = uploads.gathered(fabric, mean)
            gathered.leave_out(left_out)
            aggregated = server.aggregate(gathered)
            fault = check_aggregate(aggregated, gathered, server, rnd)
            if fault is not None:
                raise non_finite(fault)
            fabric.call("server_step", round_ctx, aggregated,  # a left-out client's message is as faulty as its upload
                        {r.cid: r.message for r in results if r.cid not in left_out})

        metrics = self._train_metrics(results)
        if server.leaves_out_faulty_uploads:
            metrics["server/faulty_uploads"] = float(len(left_out))
        metrics["comm/bytes_up"] = float(sum(r.bytes_up for r in results))
        metrics["comm/bytes_down"] = float(sum(r.bytes_down for r in results))
        if is_eval_round(self.cfg, rnd):
            metrics.update(self.evaluate(ctx))
            fabric.call("on_evaluate", round_ctx, metrics)
        if not finetuning:
            fabric.call("on_round_end", round_ctx, metrics)
        return {k: float(v) for k, v in metrics.items()}  # plain floats: JSON, W&B and checkpoints alike

    def leave_out_faulty(self, rnd: int, results: list[LocalResult]) -> frozenset[int]:
        """Under a robust aggregator, the clients whose upload is non-finite: left out of the round (their uploads
        not aggregated, their state not committed, their training scalars not averaged), each warned about once;
        empty (the run stops) under any other aggregation, or when every client of the round is faulty."""
        faulty = frozenset(r.cid for r in results if r.fault)
        if not self.server.leaves_out_faulty_uploads or len(faulty) == len(results):
            return frozenset()
        for r in results:
            if r.cid in faulty:
                r.logs = {}  # a NaN loss is not averaged into train/loss: the client is counted, not scored
                if r.cid not in self._warned_faulty and self.fabric.is_global_zero:
                    print(f"warning: client {r.cid}'s upload is non-finite at round {rnd}; "
                          f"server.aggregator.name={self.cfg.server.aggregator.name} leaves it out of the round "
                          "(server/faulty_uploads counts them; warned once per client)", file=sys.stderr)
                self._warned_faulty.add(r.cid)
        return faulty

    def check_divergence(self, rnd: int, results: list[LocalResult]) -> None:
        """The round's clients against the divergence rule (every process sees the same results): stop (raise
        Diverged before the round is committed) or warn once and go on, per trainer.on_divergence."""
        found = find_divergence(rnd, self.cfg.method.name, [(r.cid, r.logs, r.norms) for r in results],
                                reference_loss(self.history))
        if found is None:
            return
        self.diverged = found
        if self.cfg.trainer.on_divergence == "stop":
            raise Diverged(found)
        if self.fabric.is_global_zero:
            print(f"warning: {describe(found)}; trainer.on_divergence=warn: training goes on and summary.json marks "
                  "the run as diverged", file=sys.stderr)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        """Every client's model and the global model (fl/core/evaluation.py), then each enabled evaluator; with
        validation splits (`data.val_fraction`) the same again on them, as val/* (client/<i>/val_acc)."""
        start, inside = time.perf_counter(), self._seconds["evaluators"]
        try:
            metrics = evaluate_clients(ctx)
            for evaluator in self.evaluators:
                metrics.update(self.run_evaluator(evaluator, ctx))
            if self.data.has_validation:
                val_ctx = dataclasses.replace(ctx, data=self.data.validation_view())  # shares ctx.personalized
                val = evaluate_clients(val_ctx)
                for evaluator in self.evaluators:
                    if evaluator.on_validation:
                        val.update(self.run_evaluator(evaluator, val_ctx))
                metrics.update(validation_keys(val))
        finally:
            ctx.personalized.clear()  # the evaluation is over: the personalised copies go
            self._seconds["eval"] += time.perf_counter() - start - (self._seconds["evaluators"] - inside)
        return metrics

    def run_evaluator(self, evaluator: Evaluator, ctx: EvalContext) -> dict[str, float]:
        """One evaluator's metrics, its exceptions and its result's faults reported as its own
        (fl/core/evaluator_check.py)."""
        start = time.perf_counter()
        with blamed("trainer.evaluators", evaluator.name, type(evaluator).evaluate):
            result = evaluator.evaluate(ctx)
        self._seconds["evaluators"] += time.perf_counter() - start
        return checked_metrics(evaluator, result, ctx.round, model_finite=self.diverged is None)

    def score_local_model(self, ctx: EvalContext, cid: int) -> None:
        """Each evaluator that scores local models, on client cid's, right after its local training."""
        start = time.perf_counter()
        for evaluator in self.evaluators:
            with blamed("trainer.evaluators", evaluator.name, type(evaluator).on_local_model):
                evaluator.on_local_model(ctx, cid)
        self._seconds["evaluators"] += time.perf_counter() - start

    # ---- local work ---------------------------------------------------------------------------
    def load_client(self, rnd: int, cid: int, read_ahead: bool = False) -> ClientModule:
        """Swap client `cid` into the module: the server's broadcast, then the client's own state. `read_ahead`:
        the caller goes through its clients in order (evaluation), so the next one's state is read meanwhile."""
        if cid >= 0 and not self.owns(cid):  # its state is on another process: never train it from scratch
            raise RuntimeError(f"client {cid} belongs to process {cid % self.fabric.world_size}, not "
                               f"{self.fabric.global_rank}: go through clients range(rank, n, world_size)")
        if read_ahead and cid >= 0 and cid + self.fabric.world_size < self.data.num_clients:
            self.store.prefetch(cid + self.fabric.world_size)
        m = self.module
        m.cid, m.round = cid, rnd
        payload = self.server.broadcast(cid)
        self._last_broadcast_bytes = payload_bytes(payload)
        m.receive(payload)
        state = self.store.get(cid) if cid >= 0 else None
        m.load_client_state(state)
        if self.scaler is not None:
            # Under 16-mixed every client keeps its own loss scale (and growth count) in its state, from the
            # initial scale on its first visit: which steps the scaler skips then depends on the client's own
            # history only, not on the clients this process trained before it nor on a resume, so 1 process ==
            # N processes and resumed == uninterrupted. (One scale reset every round would skip the first steps
            # of every client's round again and again.) The global model (cid -1) starts from the initial scale.
            self.scaler.load_state_dict((state or {}).get(LOSS_SCALE, self._initial_scale))
        return m

    def local_work(self, rnd: int, cids: list[int]) -> Iterator[tuple[Upload, LocalResult]]:
        """Each client's local work, in order: one client at a time, or `trainer.parallel_clients` at once."""
        if self.parallel is None or self.module.finetuning:
            for cid in cids:
                yield self.train_client(rnd, cid)
            return
        k = self.cfg.trainer.parallel_clients
        for group in (cids[i:i + k] for i in range(0, len(cids), k)):
            trained = self.parallel.train(rnd, group, lambda cid: self.load_client(rnd, cid))
            for cid, (params, logs, steps) in zip(group, trained):
                m = self.load_client(rnd, cid)
                m.num_train = len(m.train_split(self.data, cid))
                m.on_local_train_start()  # what it records of the received model (SCAFFOLD's x), as before training
                with torch.no_grad():
                    for name, p in m.named_parameters():
                        if name in params:
                            p.copy_(params[name])
                m.functional_train_end(steps)
                yield self.finish_client(self.context(rnd), cid, logs)

    def train_client(self, rnd: int, cid: int) -> tuple[Upload, LocalResult]:
        """Client cid's local work in round rnd: its upload and what it leaves behind (state, logs)."""
        ctx = self.context(rnd)
        m = self.load_client(rnd, cid)
        if m.finetuning:
            return self.finetune_client(ctx, m)
        state = self.store.get(cid)
        optimizer = self.fabric.setup_optimizers(m.configure_optimizers())
        if m.keep_optimizer_state and state is not None and "optimizer" in state:
            # a copy: on the CPU load_state_dict keeps the stored tensors, and the steps below would change them in
            # place, so a checkpoint of the round before (a Ctrl-C mid-round) would hold this round's moments
            optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
            for group in optimizer.param_groups:  # the stored lr is last round's; the schedule sets this one's
                group["lr"] = m.lr
        t = self.cfg.trainer
        logs = m.fit_local(optimizer, epochs=t.local_epochs, steps=t.local_steps)
        return self.finish_client(ctx, cid, logs, optimizer)

    def finish_client(self, ctx: EvalContext, cid: int, logs: dict[str, float],
                      optimizer=None) -> tuple[Upload, LocalResult]:
        """After client cid's local training (its model in the module): its upload and what it leaves behind."""
        m = self.module
        upload = m.upload()
        norm = parameter_norm(upload.params)  # non-finite exactly when a parameter is
        fault = None if math.isfinite(logs.get("loss", 0.0)) and math.isfinite(norm) else (
            Divergence(ctx.round, cid, self.cfg.method.name, NON_FINITE))
        if fault is None:  # a faulty local model is not scored: a robust aggregator may go on without it
            self.score_local_model(ctx, cid)
        new_state = self.with_loss_scale(m.client_state())
        if m.keep_optimizer_state:
            new_state["optimizer"] = to_cpu(optimizer.state_dict())
        result = LocalResult(cid, new_state, to_cpu(upload.message), logs, fault,
                             bytes_down=self._last_broadcast_bytes,
                             norms=(norm, initial_norm(self._initial_norms, upload.params)))
        return upload, result

    def finetune_client(self, ctx: EvalContext, m: ClientModule) -> tuple[Upload, LocalResult]:
        """A fine-tuning round's local work: every parameter of the client's model (the global model on its first
        such round, its own afterwards) trained with `finetune_step` by a fresh optimizer; nothing is sent."""
        t = self.cfg.trainer
        state = self.store.get(m.cid)
        first = state is None or set(state["private"]) != set(m.state_dict())  # the global model comes down once
        optimizer = self.fabric.setup_optimizers(build_optimizer(self.cfg, m.parameters(), m.lr))
        logs = m.fit_local(optimizer, epochs=t.local_epochs, steps=t.local_steps, purpose="finetune", hooks=False,
                           step=m.finetune_step)
        self.score_local_model(ctx, m.cid)
        fault = None if math.isfinite(logs.get("loss", 0.0)) and all_finite(m.private_state()) else (
            Divergence(ctx.round, m.cid, self.cfg.method.name, f"{NON_FINITE} (fine-tuning)"))
        result = LocalResult(m.cid, self.with_loss_scale(m.client_state()), {}, logs, fault,
                             bytes_down=self._last_broadcast_bytes if first else 0)
        return Upload(weight=float(m.num_train)), result

    def with_loss_scale(self, state: dict) -> dict:
        """A client's state with its loss scale after its local work (16-mixed; see load_client)."""
        if self.scaler is not None:
            state[LOSS_SCALE] = self.scaler.state_dict()
        return state

    def _train_metrics(self, results: list[LocalResult]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for r in results:
            for k, v in r.logs.items():
                metrics[f"client/{r.cid}/{k}"] = v
        for k in dict.fromkeys(k for r in results for k in r.logs):  # a client without data logs nothing: not a 0
            logged = [r.logs[k] for r in results if k in r.logs]
            metrics[f"train/{k}"] = sum(logged) / len(logged)
        metrics["train/clients"] = float(len(results))
        return metrics

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self, rnd: int) -> None:
        """Everything a resumed run needs; random draws derive from (seed, round, client, purpose), so
        the round is the whole RNG state."""
        state = {
            "round": rnd,
            "rng": {"seed": int(self.cfg.seed), "next_round": rnd + 1},
            "server": self.server.state_dict(),
            "clients": self.client_states(),
            "history": self.history,
            "callbacks": self._callback_states,
            "stopped": self.stopped,
            "fingerprint": self.data.fingerprint(),
            "config": OmegaConf.to_container(self.cfg, resolve=True),  # resume refuses a config.yaml edited since
            "diverged": None if self.diverged is None else self.diverged.as_dict(),
        }
        save_checkpoint(self.fabric, self.ckpt_path, state)
        self.store.checkpointed()
        self.fabric.call("on_checkpoint", RoundContext(rnd, self.fabric, self.data, self.cfg), self.ckpt_path)

    def callback_states(self) -> list[dict]:
        return [copy.deepcopy(cb.state_dict()) for cb in self.callbacks]  # a copy: callbacks go on changing theirs

    def client_states(self) -> dict:
        """Every process's part of the store, for the checkpoint (the only time states cross processes): the
        states themselves (in memory) or which round's file holds each (state.cache_mb). Gathered on process 0,
        the one that writes the checkpoint; the others get {}."""
        parts = gather_to_zero(self.fabric, self.store.state_dict())
        return {} if parts is None else {cid: s for part in parts for cid, s in sorted(part.items())}

    def restore(self, state: dict, path: Path) -> None:
        """Continue from a checkpoint (read by state.read_checkpoint); raises CheckpointError when it does not
        belong to this run's data or model."""
        if state["fingerprint"] != self.data.fingerprint():
            raise CheckpointError(f"{path} was written for another data split than this config's")
        expected = {k: tuple(v.shape) for k, v in self.server.global_params.items()}
        try:
            self.server.load_state_dict(state["server"], self.fabric.device)
        except (RuntimeError, KeyError, TypeError) as err:  # a server state of another method
            raise CheckpointError(f"{path} does not fit this run's method: {str(err).splitlines()[0][:160]}") from None
        found = {k: tuple(v.shape) for k, v in self.server.global_params.items()}
        if found != expected:  # another model's tensors: name the first that differs
            key = next(k for k in sorted(expected.keys() | found.keys()) if expected.get(k) != found.get(k))
            raise CheckpointError(f"{path} does not fit this run's model: {key} has shape {found.get(key)} there, "
                                  f"{expected.get(key)} here")
        self.store.load_state_dict(state["clients"], self.owns)
        states = state.get("callbacks", [])
        if len(states) != len(self.callbacks):
            raise CheckpointError(f"{path} holds the state of {len(states)} callback(s), this run has "
                                  f"{len(self.callbacks)}")
        for callback, saved in zip(self.callbacks, states):
            callback.load_state_dict(copy.deepcopy(saved))
        self._callback_states, self.stopped = self.callback_states(), state.get("stopped")
        self.history = list(state["history"])
        self.diverged = Divergence(**state["diverged"]) if state.get("diverged") else None
        self.start_round = state["round"] + 1
