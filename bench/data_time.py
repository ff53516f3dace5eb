"""Data time vs round time for the quickstart (or any config): is batching ever the bottleneck?

Round time: `Orchestrator.run_round` (sampling, swaps, local training, aggregation; no evaluation).
Data time: the data path of the same round on its own, i.e. shuffled index generation, the gather of the
batch from the client's device tensors and the uint8 -> float normalisation, for the same clients and
batches. Prints both medians over the measured rounds and their ratio.

    python bench/data_time.py [conf=quickstart] [key=value ...]
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import orchestrator  # noqa: E402
from fl.config import load_config  # noqa: E402
from fl.core import batch_indices  # noqa: E402
from fl.core.loop import Orchestrator, sample_clients  # noqa: E402
from fl.core.seeding import generator  # noqa: E402


def data_path(orch: Orchestrator, rnd: int) -> float:
    cfg, t = orch.cfg, orch.cfg.trainer
    dtype = next(orch.module.parameters()).dtype  # the dtype the client module feeds its model (Fabric's precision)
    start = time.perf_counter()
    for cid in sample_clients(cfg.seed, rnd, orch.data.num_clients, t.participation):
        train = orch.data.clients[cid].train
        for _, idx in batch_indices(len(train), t.batch_size, generator(cfg.seed, rnd, cid, "train"),
                                    epochs=t.local_epochs, steps=t.local_steps, drop_last=t.drop_last):
            if idx is not None:
                idx = idx.to(train.y.device)
                orch.data.prepare(train.x[idx], dtype), train.y[idx]
    return time.perf_counter() - start


def main() -> None:
    rounds = 10
    with tempfile.TemporaryDirectory() as tmp:
        argv = list(sys.argv[1:]) + [f"trainer.rounds={rounds + 2}", f"trainer.eval_every={rounds + 2}",
                                             "logger.wandb.mode=disabled", f"data.root={tmp}"]
        cfg = load_config(argv)
        orch = orchestrator(cfg, Path(tmp))
        orch.run_round(0)  # warm-up
        full, dat = [], []
        for rnd in range(1, rounds + 1):
            t0 = time.perf_counter()
            orch.run_round(rnd)
            full.append(time.perf_counter() - t0)
            dat.append(data_path(orch, rnd))
    f, d = statistics.median(full), statistics.median(dat)
    print(f"{cfg.data.name}, {cfg.data.num_clients} clients, participation {cfg.trainer.participation}, "
          f"batch {cfg.trainer.batch_size}, model {cfg.model.name}, {rounds} rounds on {orch.fabric.device}")
    print(f"  round time (median)  {f * 1000:.1f} ms")
    print(f"  data time (median)   {d * 1000:.1f} ms")
    print(f"  data / round         {100 * d / f:.1f} %")


if __name__ == "__main__":
    main()
