"""What an evaluation costs against the number of forwards and the evaluation batch size.

The workload is issue 35's: FedAvg on the quickstart setting (20 clients, embedded data, the small CNN) with each
client's test set drawn from the official test split (`data.test_split=official`), after one training round. For each
`trainer.eval_batch_size` it times `Orchestrator.evaluate` (the per-client accuracies, the pooled accuracy and the
default evaluators) two ways, interleaved over the repeats:

* shared: as the loop runs it, each distinct test image scored once per distinct model (here: the global model on
  the official test set, every client's counts gathered from those predictions by index);
* per-client: every client's own pass over its test split, as before (`shares_global_passes` patched to False).

It counts the images that went through the model (a forward pre-hook on the model), checks that both ways give the
same metrics bit for bit, and counts the test rows whose logits differ between a client's own batches and the pooled
batches, and those whose predicted label differs. Then a bare loop times the model alone over the official test
set at each batch size (ms per image, the fastest of 3 x --repeats passes): what it measures fastest on a CPU is
the CPU default of trainer.eval_batch_size (fl/core/batches.py). data.image_size=32 gives 32 px images.

    python bench/eval_cost.py [--batch-sizes 8 16 32 64 128 256 1024] [--repeats 5] [--threads N] [--bare-only]
                              [key=value ...]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fl.run.cpu_threads import sleep_at_barriers  # noqa: E402

sleep_at_barriers()  # a run's thread policy (fl/train.py), before torch loads

import torch  # noqa: E402

from bench.harness import orchestrator  # noqa: E402
from fl.config import load_config  # noqa: E402
from fl.core import evaluation  # noqa: E402
from fl.core.loop import Orchestrator  # noqa: E402

WORKLOAD = ["method.name=fedavg", "data.test_split=official", "logger.wandb.mode=disabled", "logger.progress=false",
            "trainer.rounds=1", "trainer.eval_every=1"]


def build(tmp: str, extra: list[str]) -> Orchestrator:
    cfg = load_config([*WORKLOAD, f"logger.output_dir={tmp}", f"data.root={tmp}/data", *extra])
    orch = orchestrator(cfg, Path(tmp) / "run")
    orch.run_round(0)  # a trained global model; its evaluation is not timed
    return orch


class ImageCount:
    """Images through the model's forward, counted by a pre-hook."""

    def __init__(self, model: torch.nn.Module):
        self.images = 0
        model.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.images += len(args[0])


def evaluate_once(orch: Orchestrator, shared: bool, counter: ImageCount) -> tuple[float, dict, int]:
    """(seconds, metrics, images) of one evaluation of round 0."""
    before = counter.images
    with contextlib.nullcontext() if shared else mock.patch.object(evaluation, "shares_global_passes",
                                                                   lambda ctx: False):
        start = time.perf_counter()
        metrics = orch.evaluate(orch.context(0))
        seconds = time.perf_counter() - start
    return seconds, metrics, counter.images - before


def row_agreement(orch: Orchestrator) -> tuple[int, int, int]:
    """(rows, rows whose logits differ bitwise, rows whose predicted label differs) between each client's own
    batches and the pooled batches of the official test set, for the global model at the current batch size."""
    m, data = orch.module, orch.data
    ctx = orch.context(0)
    ctx.load_client(-1)
    pooled = torch.cat([logits for logits, _ in m.eval_pass(data.pooled_test())])
    rows = bits = labels = 0
    for cid in range(data.num_clients):
        where = data.pooled_test_rows(cid)
        if where is None:
            continue
        own = torch.cat([logits for logits, _ in m.eval_pass(data.clients[cid].test)] or [pooled[:0]])
        ref = pooled[where]
        rows += len(own)
        bits += int((own != ref).any(1).sum())
        labels += int((own.argmax(1) != ref.argmax(1)).sum())
    return rows, bits, labels


def bare_forward(orch: Orchestrator, batch_sizes: list[int], repeats: int) -> dict[int, float]:
    """Seconds per image of the model alone over the official test set (prepared once), in eval mode, at each batch
    size: the fastest of `repeats` passes (the least disturbed by other work), the sizes interleaved."""
    model, data = orch.module.model.eval(), orch.data
    x = data.prepare(data.global_test.x.to(orch.fabric.device), torch.float32)
    best = dict.fromkeys(batch_sizes, float("inf"))
    with torch.no_grad():
        for rep in range(repeats):
            for b in batch_sizes if rep % 2 == 0 else batch_sizes[::-1]:
                start = time.perf_counter()
                for i in range(0, len(x), b):
                    model(x[i:i + b])
                best[b] = min(best[b], (time.perf_counter() - start) / len(x))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 1024])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    p.add_argument("--bare-only", action="store_true", help="only the model alone at each batch size")
    p.add_argument("overrides", nargs="*", help="key=value given to the run's config")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        orch = build(tmp, args.overrides)
        counter = ImageCount(orch.module.model)
        data = orch.data
        tests = sum(len(c.test) for c in data.clients)
        print(f"FedAvg, {data.num_clients} clients, data.test_split=official: {len(data.global_test)} official test "
              f"images, {tests} in the clients' test sets; {torch.get_num_threads()} torch threads, "
              f"load average {os.getloadavg()[0]:.2f} at the start")
        times = {(b, s): [] for b in args.batch_sizes for s in (True, False)}
        images, results = {}, {}
        for rep in range(0 if args.bare_only else args.repeats):  # interleaved: drift favours no configuration
            for b in args.batch_sizes:
                orch.cfg.trainer.eval_batch_size = b
                for shared in ((True, False) if rep % 2 == 0 else (False, True)):
                    seconds, metrics, n = evaluate_once(orch, shared, counter)
                    times[b, shared].append(seconds)
                    images[b, shared] = n
                    results[b, shared] = metrics
        print(f"\n{'batch':>6} {'mode':>10} {'images':>8} {'eval s':>8} {'ms/image':>9}  same metrics")
        for b in args.batch_sizes if not args.bare_only else []:
            same = results[b, True] == results[b, False]
            for shared in (True, False):
                t = statistics.median(times[b, shared])
                n = images[b, shared]
                print(f"{b:>6} {'shared' if shared else 'per-client':>10} {n:>8} {t:>8.3f} {1e3 * t / n:>9.3f}"
                      f"  {'yes' if same else 'NO'}")
        bare = bare_forward(orch, args.batch_sizes, 3 * args.repeats)
        print(f"\n{'batch':>6} {'bare ms/image':>14} {'rows':>6} {'logits differ':>14} {'label differs':>14}")
        for b in args.batch_sizes:
            orch.cfg.trainer.eval_batch_size = b
            rows, bits, labels = row_agreement(orch) if not args.bare_only else (0, 0, 0)
            print(f"{b:>6} {1e3 * bare[b]:>14.4f} {rows:>6} {bits:>14} {labels:>14}")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
