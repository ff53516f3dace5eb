"""Client-updates per second: the sequential loop, K clients at once (`trainer.parallel_clients=K`, vmapped) and a
PFLlib-style loop (a DataLoader and a copy of the model per client per round), on the same work.

    python bench/client_throughput.py [--device cpu|cuda] [--threads N] [--clients 64] [--samples 100]
                                      [--batch 50] [--ks 4 16 64] [--rounds 3] [--compile]

--compile adds, for each K, the same loop with the vmapped step compiled (`trainer.compile=true`), in the same process
so that the two are timed side by side.

The work: FedAvg's local training of every client for one epoch over its `--samples` samples in batches of
`--batch` (pFedFDA's setting: batch 50), SGD with momentum 0.9, for the quickstart CNN (16 px, 1 channel) and
pFedFDA's CIFAR CNN (`cifarnet`, 32 px, 3 channels), on the embedded data split IID. A round is timed from the
first client's load to the last client's upload (the framework's own path: `Orchestrator.local_work`); the first
round is a warm-up, the figure is the median of the others. Prints one Markdown row per model and mode.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from fl.config import load_config  # noqa: E402
from fl.core.loop import Orchestrator  # noqa: E402
from fl.core.optim import build_optimizer  # noqa: E402

MODELS = {
    "quickstart cnn": ["model.name=cnn", "model.width=16", "data.embedded.channels=1", "data.image_size=16"],
    "pFedFDA cifarnet": ["model.name=cifarnet", "data.embedded.channels=3", "data.image_size=32"],
}


def config(a, model: list[str], k: int, compiled: bool = False):
    per_class = a.clients * a.samples // 10
    return load_config([
        "method.name=fedavg", "data.name=embedded", f"data.num_clients={a.clients}", "data.partition.name=iid",
        f"data.embedded.samples_per_class={per_class}", "data.val_fraction=0", *model,
        "optim.name=sgd", "optim.lr=0.01", "optim.momentum=0.9", f"trainer.batch_size={a.batch}",
        "trainer.local_epochs=1", f"trainer.parallel_clients={k}", f"fabric.accelerator={a.device}",
        f"trainer.compile={str(compiled).lower()}", "trainer.evaluators=[]", f"data.root={a.data_root}",
        "logger.wandb.mode=disabled"])


def orchestrator(cfg, run_dir: Path) -> Orchestrator:
    torch.compiler.reset()  # compiled code of the previous model or K: its guards would use up the recompile limit
    return harness.orchestrator(cfg, run_dir)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def framework_rounds(orch: Orchestrator, a) -> list[float]:
    """Seconds of each round's local training of every client, through the framework's loop."""
    cids = list(range(a.clients))
    times = []
    for rnd in range(a.rounds + 1):
        sync(a.device)
        start = time.perf_counter()
        for _ in orch.local_work(rnd, cids):
            pass
        sync(a.device)
        times.append(time.perf_counter() - start)
    return times[1:]


def pfllib_rounds(orch: Orchestrator, a) -> list[float]:
    """The same work the way PFLlib's clients do it: each round, each client deep-copies the model and iterates a
    DataLoader over its (already preprocessed) tensors."""
    m, data = orch.module, orch.data
    device = orch.fabric.device
    clients = [(data.prepare(c.train.x, torch.float32).cpu(), c.train.y.cpu()) for c in data.clients]
    times = []
    for _ in range(a.rounds + 1):
        sync(a.device)
        start = time.perf_counter()
        for x, y in clients:
            model = copy.deepcopy(m.model)
            opt = build_optimizer(orch.cfg, model.parameters())
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=a.batch,
                                                 shuffle=True)
            model.train()
            for xb, yb in loader:
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
        sync(a.device)
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--samples", type=int, default=100, help="training samples per client")
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--ks", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    p.add_argument("--compile", action="store_true", help="also each K with trainer.compile=true (torch.compile)")
    p.add_argument("--data-root", default=str(Path(tempfile.gettempdir()) / "fl_bench_data"))
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"{a.clients} clients x {a.samples} samples, batch {a.batch}, 1 epoch, SGD momentum 0.9; device "
          f"{a.device}{'' if a.device == 'cuda' else f', {torch.get_num_threads()} threads'}; median of "
          f"{a.rounds} rounds after a warm-up\n")
    print("| model | loop | client-updates/s | vs sequential | round (s) |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, model in MODELS.items():
            rows = []
            seq_orch = orchestrator(config(a, model, 1), Path(tmp) / "seq")
            rows.append(("sequential (fl)", framework_rounds(seq_orch, a)))
            for k in a.ks:
                for compiled in (False, True) if a.compile else (False,):
                    orch = orchestrator(config(a, model, k, compiled), Path(tmp) / f"k{k}{compiled}")
                    rows.append((f"K = {k} vmapped{' + compile' if compiled else ''}", framework_rounds(orch, a)))
            rows.append(("PFLlib-style", pfllib_rounds(seq_orch, a)))
            base = a.clients / statistics.median(rows[0][1])
            for name, times in rows:
                rate = a.clients / statistics.median(times)
                print(f"| {label} | {name} | {rate:.0f} | {rate / base:.2f}x | {statistics.median(times):.3f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
