"""Paper-scale rehearsal: a paper config with its dataset replaced by random images of the real dataset's shapes and
counts (no download), the real model, clients and partition, one round on this machine's device.

    python bench/paper_scale.py conf=NAME [key=value ...] [--local-steps N] [--timeout S]
    python bench/paper_scale.py --all [--local-steps N] [--timeout S]     (every paper config, one row each)

Prints one Markdown row per config: seconds per round (training + evaluation), the projected wall time of the full
run, peak host RSS and device memory, the client-state store (after the round, and projected to every client),
checkpoint size and write time, the bytes a round sends between server and clients, and the round's data time (the
time the loop waited for its batches and made them) with the image cache's build when the run wrote it. A config that
cannot run at its paper scale (a pool larger than this machine's memory that its loader cannot memory-map, a partition
that cannot be built, a process killed for memory, a round longer than --timeout) is a row with the one-line reason,
never a skipped line.

The stand-ins of the datasets whose loaders write an image cache (fl/data/cache.py: TinyImageNet, DomainNet,
Office-Caltech10, PACS, iWildCam) go through it, under <--out>/cache unless data.cache_dir is given: written once
(seeded random pixels, the first rehearsal of that dataset pays for it, inside --timeout), then read into memory or
memory-mapped as data.cache says (auto: memory-mapped when the pool takes more than data.cache_auto_fraction of the
memory available). Delete <--out>/cache afterwards: iWildCam's is 24.2 GiB.

Projection: T = R * t_train + E * t_eval + C * t_ckpt, with R = trainer.rounds, E the rounds that evaluate
(trainer.eval_every and the last), C the rounds that checkpoint (trainer.checkpoint_every and the last), and the
round measured here: round 0 with its evaluation forced, t_train = its time less its evaluation. With --local-steps N
every local pass the override shortened is projected at its paper length (local_steps, or local_epochs x batches of
the client's data) at the measured seconds per batch (the time the training loop spends on a batch); the rest of the
round (server step, state swaps, uploads) is taken as measured. A config that refuses the override (a method that
needs more local steps) runs its round at full length. Later rounds that cost more or less than round 0
(fine-tuning rounds, FedMosaic's votes, pFedFDA's full last round) are projected at round 0's cost.

Each config runs in a child process (this file with --child), measured by bench/state_store.py's `instrument`.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.state_store import du, instrument  # noqa: E402
from fl.core.batches import count_batches  # noqa: E402
from fl.data.sources import domains  # noqa: E402
from fl.reproduce.timing import duration  # noqa: E402


@dataclass(frozen=True)
class RealData:
    """A real dataset's size: images per domain in its train and test splits ({"": n} without domains)."""
    shape: tuple[int, int, int]  # C, H, W as the loader returns them by default (data.image_size resizes H, W)
    classes: int
    train: dict[str, int]
    test: dict[str, int]
    source: str
    cameras: Optional[tuple[int, int]] = None  # iWildCam: cameras in the train split, and other cameras in the test


def _held_out(spec: domains.DomainDataset, images: list[int]) -> tuple[dict[str, int], dict[str, int]]:
    """Per-domain (train, test) counts of a dataset of `images` per domain, split as the loader splits it."""
    test = [round(spec.test_fraction * n) for n in images]
    return dict(zip(spec.domains, (n - t for n, t in zip(images, test)))), dict(zip(spec.domains, test))


# DomainNet-10: FedBN's split pickles hold the images; their sizes are not published. Estimate: DomainNet's own
# ~70/30 split and "about 100+ samples per client" at 5% of the smallest domain (med-air/FedBN issue #6).
_DOMAINNET = dict.fromkeys(domains.DOMAINNET.domains, 2600), dict.fromkeys(domains.DOMAINNET.domains, 1100)
_OFFICE = _held_out(domains.OFFICE_CALTECH10, [958, 1123, 157, 295])  # Gong et al. 2012
_PACS = _held_out(domains.PACS, [2048, 2344, 1670, 3929])  # Li et al. 2017

REAL = {
    "cifar10": RealData((3, 32, 32), 10, {"": 50_000}, {"": 10_000}, "Krizhevsky 2009: 50,000 / 10,000"),
    "cifar100": RealData((3, 32, 32), 100, {"": 50_000}, {"": 10_000}, "Krizhevsky 2009: 50,000 / 10,000"),
    "cifar20": RealData((3, 32, 32), 20, {"": 50_000}, {"": 10_000}, "CIFAR-100's images, 20 coarse labels"),
    "tinyimagenet": RealData((3, 64, 64), 200, {"": 100_000}, {"": 10_000}, "TinyImageNet-200: 500 / class + val"),
    "fmnist": RealData((1, 28, 28), 10, {"": 60_000}, {"": 10_000}, "Xiao et al. 2017: 60,000 / 10,000"),
    "emnist": RealData((1, 28, 28), 62, {"": 697_932}, {"": 116_323}, "Cohen et al. 2017, byclass split"),
    "domainnet": RealData((3, 256, 256), 10, *_DOMAINNET, "estimate, see _DOMAINNET"),
    "office_caltech10": RealData((3, 256, 256), 10, *_OFFICE, "Gong et al. 2012: 2,533 images, 4 domains"),
    "pacs": RealData((3, 224, 224), 7, *_PACS, "Li et al. 2017: 9,991 images, 4 domains"),
    "iwildcam": RealData((3, 224, 224), 182, {"": 129_809}, {"": 42_791},
                         "WILDS v2.0: train 129,809 images / 243 cameras, OOD test 42,791 / 48", cameras=(243, 48)),
}
PAPER_CONFIGS_EXCLUDED = ("quickstart", "fedprox_embedded", "personalized_embedded", "hybrid_synthetic",
                          "fedpals_synthetic")  # generated data: already runnable as they are


def standin_pool(name: str, d):
    """The Pool the real loader of `name` would return, with random uint8 pixels and balanced random labels of the
    real counts and shapes (seeded, so every run rehearses the same partition). The datasets whose real loader goes
    through the image cache (fl/data/cache.py) go through it here too, written once under data.cache_dir (the
    rehearsal sets it) and read into memory or memory-mapped as `data.cache` says; the others are made in memory, as
    their loaders read them."""
    import torch

    from fl.config import ConfigError
    from fl.core import Split
    from fl.data.base import Pool
    from fl.data.cache import MAPPED, available_memory, cached_images, parts_of

    real = REAL[name]
    c, h, w = real.shape
    if d.image_size:
        h = w = int(d.image_size)
    counts = {"train": sum(real.train.values()), "test": sum(real.test.values())}
    gen = torch.Generator().manual_seed(0)
    domain_names = [k for k in real.train if k]
    if name in MAPPED:
        parts = parts_of(counts, c * h * w)
        fill = lambda i: torch.randint(0, 256, (parts[i], c, h, w), dtype=torch.uint8,  # noqa: E731
                                       generator=torch.Generator().manual_seed(i))  # seeded per part: resumable
        x = cached_images(d, dataset=name, folder=Path(d.root) / "paper_scale", tag=f"{h}px-standin", counts=counts,
                          key=f"standin-v1-{c}x{h}x{w}-{counts}", shape=(c, h, w), parts=parts, fill=fill)
    else:
        need = sum(counts.values()) * c * h * w
        if need > 0.9 * available_memory():
            raise ConfigError(f"data.name={name}: the pool alone is {need / 2**30:.1f} GiB of uint8 images "
                              f"({sum(counts.values())} x {c}x{h}x{w}), more than the "
                              f"{available_memory() / 2**30:.1f} GiB this machine has free; the real loader holds "
                              "the same in memory")
        x = {k: torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=gen) for k, n in counts.items()}

    def split(part: str, counts: dict[str, int], camera_ids: Optional[range]) -> Split:
        n = sum(counts.values())
        y = torch.randperm(n, generator=gen) % real.classes  # every class equally often
        if camera_ids is not None:
            domain = torch.tensor(camera_ids)[torch.randint(0, len(camera_ids), (n,), generator=gen)]
        elif domain_names:
            domain = torch.cat([torch.full((counts[k],), i) for i, k in enumerate(domain_names)])
        else:
            domain = None
        return Split(x[part], y, domain)

    cams = real.cameras
    train = split("train", real.train, range(cams[0]) if cams else None)
    test = split("test", real.test, range(cams[0], sum(cams)) if cams else None)
    mean, std = _statistics(name)
    pool = Pool(name, train, test, real.classes, [f"class{k}" for k in range(real.classes)],
                [f"camera{i}" for i in range(sum(cams))] if cams else domain_names, mean, std)
    if name == "cifar20":  # FedDRM partitions CIFAR-20 on 100 fine labels: 5 per coarse class
        fine = [s.y * 5 + torch.randint(0, 5, s.y.shape, generator=gen) for s in (train, test)]
        pool.fine_labels = (fine[0], fine[1])
    return pool


def _statistics(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The normalisation the real loader uses."""
    from fl.data.sources import cifar, iwildcam, mnist, tinyimagenet

    modules = {"cifar10": cifar, "cifar100": cifar, "cifar20": cifar, "fmnist": mnist, "emnist": mnist,
               "tinyimagenet": tinyimagenet, "iwildcam": iwildcam}
    if name in modules:
        return modules[name].MEAN, modules[name].STD
    spec = {"domainnet": domains.DOMAINNET, "office_caltech10": domains.OFFICE_CALTECH10, "pacs": domains.PACS}[name]
    return spec.mean, spec.std


# ---- the child: one config, one round, measured from inside -------------------------------------------------------
def child(argv: list[str], report: Path, local_steps: Optional[int]) -> int:
    from functools import partial

    import fl.core.client as client
    import fl.core.loop as loop
    import fl.data.cache as image_cache
    from fl.config import ConfigError
    from fl.config.load import load_config
    from fl.core.registry import DATASETS
    from fl.run.train import main

    for name in REAL:  # the real loader's registration (its settings) with the stand-in's pool
        DATASETS[name] = dataclasses.replace(DATASETS[name], fn=partial(standin_pool, name))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the parent's timeout: exit through atexit
    stats = instrument(report)

    @atexit.register  # runs before instrument's report is written: how far a stopped round got
    def so_far():
        if "round_s" not in stats and "round_start" in stats:
            now = time.perf_counter()
            stats["train_s"] = stats.get("eval_start", now) - stats["round_start"]
            stats["eval_so_far_s"] = now - stats["eval_start"] if "eval_start" in stats else None

    stats.update(batches_run=0, batches_paper=0, batch_s=0.0, eval_s=0.0, data_s=0.0)
    phase_file = report.with_name(report.name + ".phase")

    def phase(text: str) -> None:
        phase_file.write_text(text)

    phase("loading the config and building the pool and partition")
    paper = load_config(argv).trainer  # the config as the paper runs it, before --local-steps
    if local_steps is not None:
        try:
            load_config(argv + [f"trainer.local_steps={local_steps}"])
        except ConfigError as err:  # e.g. a method that needs more local steps: the round runs at full length
            stats["full_length"] = f"--local-steps {local_steps} refused ({str(err).splitlines()[0]})"
            local_steps = None
    stats["paper"] = {"rounds": paper.rounds, "eval_every": paper.eval_every,
                      "checkpoint_every": paper.checkpoint_every}
    counted, ahead, make_batch = client.batch_indices, client.one_ahead, client.ClientModule.make_batch
    training = weakref.WeakSet()  # the round's local passes (batch_indices' generators), as against evaluations

    def counting(n, batch_size, gen, *, epochs=None, steps=None, drop_last=False):
        batches = counted(n, batch_size, gen, epochs=epochs, steps=steps, drop_last=drop_last)
        if "eval_start" in stats:  # an evaluation that fine-tunes (FedBABU, -FT): its time is the evaluation's
            return batches
        shortened = local_steps is not None and steps == local_steps
        full = count_batches(n, batch_size, paper.local_epochs, paper.local_steps, drop_last) if shortened else \
            count_batches(n, batch_size, epochs, steps, drop_last)
        stats["batches_paper"] += full
        training.add(batches)
        return batches

    def timed(items, fetch):
        """one_ahead, timed: the time it takes to hand over each batch (the wait for its data) is data time, and
        for a local pass that wait plus the time until the next batch is asked for is the batch's time."""
        local, batches = items in training, ahead(items, fetch)
        while True:
            start = time.perf_counter()
            item = next(batches, None)
            waited = time.perf_counter() - start
            stats["data_s"] += waited
            if item is None:
                return
            start = time.perf_counter()
            yield item  # the caller trains on the batch before it asks for the next one
            if local and item[1] is not None:
                stats["batches_run"] += 1
                stats["batch_s"] += waited + time.perf_counter() - start

    def timed_make_batch(self, *args, **kwargs):
        start = time.perf_counter()
        out = make_batch(self, *args, **kwargs)
        stats["data_s"] += time.perf_counter() - start
        return out

    build = image_cache.build

    def timed_build(*args, **kwargs):
        phase("writing the image cache")
        start = time.perf_counter()
        out = build(*args, **kwargs)
        stats["cache_build_s"] = time.perf_counter() - start
        phase("loading the config and building the pool and partition")
        return out

    image_cache.build, client.one_ahead, client.ClientModule.make_batch = timed_build, timed, timed_make_batch
    client.batch_indices = counting
    evaluate = loop.Orchestrator.evaluate

    def timed_evaluate(self, ctx):
        phase(f"round 0 evaluation ({stats['batches_run']} training batches done)")
        start = stats["eval_start"] = time.perf_counter()
        out = evaluate(self, ctx)
        stats["eval_s"] += time.perf_counter() - start
        return out

    def rehearse(self, progress=None):
        """Round 0 of the run with its evaluation and a checkpoint, then stop."""
        phase("round 0 training")
        self.is_eval_round = lambda rnd: True
        start = stats["round_start"] = time.perf_counter()
        metrics = self.run_round(0)
        metrics["time/round_s"] = stats["round_s"] = time.perf_counter() - start
        stats["clients"] = metrics.get("train/clients")
        stats["bytes_up"], stats["bytes_down"] = metrics.get("comm/bytes_up"), metrics.get("comm/bytes_down")
        self.history.append({"round": 0, **metrics})
        self.fabric.log_dict(metrics, step=0)
        phase("writing the checkpoint")
        self.save(0)
        stats["state_bytes"], stats["state_bytes_all"] = store_bytes(self.store, self.data.num_clients)
        phase("done")
        return self.history

    loop.Orchestrator.evaluate = timed_evaluate
    loop.Orchestrator.fit = rehearse
    return main(argv + ([f"trainer.local_steps={local_steps}"] if local_steps is not None else []))


def store_bytes(store, num_clients: int) -> tuple[int, int]:
    """Bytes of the client states held after the round, and the same at that mean size for every client."""
    from fl.core.state import ClientStateStore, state_bytes

    held = store.state_dict()
    if isinstance(store, ClientStateStore):
        now = sum(state_bytes(s) for s in held.values())
    else:  # the disk-backed store: one file per client, held names each one's round
        now = sum(store.path(cid, named["round"]).stat().st_size for cid, named in held.items())
    return now, now * num_clients // len(held) if held else 0


# ---- the parent: one child per config, with a timeout --------------------------------------------------------------
@dataclass
class Result:
    conf: str
    exit: Optional[int]
    wall_s: float
    why: str = ""
    stats: dict = field(default_factory=dict)
    rss_mb: Optional[float] = None
    ckpt_bytes: int = 0
    state_dir_bytes: int = 0


def peak_rss_mb(pid: int) -> Optional[float]:
    """VmHWM of a live process (its peak RSS so far), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rehearse(conf: str, overrides: list[str], out: Path, local_steps: Optional[int], timeout: float) -> Result:
    run = out / conf
    shutil.rmtree(run, ignore_errors=True)
    report = out / f"{conf}.json"
    for old in out.glob(f"{conf}.json.*"):
        old.unlink()
    cache = [] if any(o.startswith("data.cache_dir=") for o in overrides) else [f"data.cache_dir={out / 'cache'}"]
    argv = [f"conf={conf}", *cache, *overrides, "logger.wandb.mode=disabled", "logger.progress=false",
            f"logger.output_dir={out}", f"logger.run_name={conf}"]
    cmd = [sys.executable, __file__, "--child", str(report), str(local_steps or 0), "--", *argv]
    start = time.perf_counter()
    with open(out / f"{conf}.stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        polled, code = None, None
        while code is None and time.perf_counter() - start < timeout:
            polled = peak_rss_mb(proc.pid) or polled
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=0.5)
        timed_out = code is None
        if timed_out:  # SIGTERM: the child writes what it measured so far; SIGKILL if it does not stop
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - start
    phase = report.with_name(report.name + ".phase")
    ranks = sorted(out.glob(f"{conf}.json.rank*"))
    stats = json.loads(ranks[0].read_text()) if ranks else {}
    r = Result(conf, code, wall, stats=stats, rss_mb=stats.get("peak_rss_mb", polled),
               ckpt_bytes=du(run / "checkpoints"), state_dir_bytes=du(run / "client_states"))
    where = phase.read_text() if phase.exists() else "starting"
    if timed_out and where == "done":  # the round was measured; it was writing the run's summary
        r.exit = 0
    elif timed_out:
        r.why = f"timeout: no round within {timeout:.0f} s (stopped during {where})"
    elif code < 0 and -code == signal.SIGKILL:
        r.why = f"killed by the operating system (out of memory?) during {where}"
    elif code != 0:
        lines = (out / f"{conf}.stderr").read_text().strip().splitlines()
        r.why = (lines[-1] if lines else f"exit {code}")[:300]
    return r


def projection(s: dict, local_steps: Optional[int]) -> Optional[float]:
    """T = R * t_train + E * t_eval + C * t_ckpt (module docstring)."""
    if "round_s" not in s:
        return None
    p = s["paper"]
    rounds, every = p["rounds"], p["checkpoint_every"]
    evals = sum(1 for r in range(rounds) if (r + 1) % p["eval_every"] == 0 or r == rounds - 1)
    ckpts = sum(1 for r in range(rounds) if r == rounds - 1 or (every and (r + 1) % every == 0))
    train = s["round_s"] - s["eval_s"]
    if local_steps is not None and s["batches_run"]:  # only the batches scale; the server step does not
        train += s["batch_s"] * (s["batches_paper"] / s["batches_run"] - 1)
    ckpt = s["checkpoints"][0]["seconds"] if s.get("checkpoints") else 0.0
    return rounds * train + evals * s["eval_s"] + ckpts * ckpt


def mib(n: Optional[float]) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


HEADER = ("| config | clients trained | round: train + eval | projected full run | peak RSS | peak device memory "
          "| client states: after round 0 / all clients | checkpoint: size, write time | bytes per round: up + down "
          "| data time in the round | status |\n|---|---|---|---|---|---|---|---|---|---|---|")


def row(r: Result, local_steps: Optional[int]) -> str:
    s = r.stats
    if "round_s" not in s:
        rss = "?" if not r.rss_mb else f"{r.rss_mb:.0f} MiB" if "peak_rss_mb" in s else f"≥ {r.rss_mb:.0f} MiB"
        if s.get("eval_so_far_s") is not None:  # stopped during the evaluation: lower bounds from what it measured
            least = {**s, "round_s": s["train_s"] + s["eval_so_far_s"], "eval_s": s["eval_so_far_s"]}
            return (f"| {r.conf} | | {s['train_s']:.1f} + > {s['eval_so_far_s']:.1f} s{batches(s, local_steps)} "
                    f"| > {duration(projection(least, local_steps))} ({s['paper']['rounds']} rounds) | {rss} "
                    f"| | | | | | **cannot run**: {r.why} |")
        if s.get("train_s") is not None:
            return (f"| {r.conf} | | > {s['train_s']:.0f} s ({s['batches_run']} batches) | "
                    f"> {duration(s['paper']['rounds'] * s['train_s'])} ({s['paper']['rounds']} rounds) | {rss} "
                    f"| | | | | | **cannot run**: {r.why} |")
        return f"| {r.conf} | | | | {rss} | | | | | | **cannot run**: {r.why} |"
    total = projection(s, local_steps)
    device = mib(s["peak_device_bytes"]) if s.get("peak_device_bytes") else "— (CPU)"
    ck = s["checkpoints"][0] if s.get("checkpoints") else None
    ckpt = f"{mib(r.ckpt_bytes + r.state_dir_bytes)}, {ck['seconds']:.2f} s" if ck else "?"
    status = "ok" if r.exit == 0 else f"exit {r.exit}: {r.why}"
    return (f"| {r.conf} | {s.get('clients', 0):.0f} | {s['round_s'] - s['eval_s']:.1f} + {s['eval_s']:.1f} s"
            f"{batches(s, local_steps)} | {duration(total)} ({s['paper']['rounds']} rounds) | {r.rss_mb:.0f} MiB "
            f"| {device} | {mib(s.get('state_bytes'))} / {mib(s.get('state_bytes_all'))} | {ckpt} "
            f"| {mib(s['bytes_up'])} + {mib(s['bytes_down'])} | {data_time(s)} | {status} |")


def data_time(s: dict) -> str:
    """Seconds the round waited for its batches (one_ahead) and made them (make_batch), and the image cache's build
    when this run wrote it."""
    text = f"{s['data_s']:.1f} s" if "data_s" in s else "?"
    return text + (f" (image cache written in {s['cache_build_s']:.0f} s first)" if s.get("cache_build_s") else "")


def batches(s: dict, local_steps: Optional[int]) -> str:
    if s.get("full_length"):
        return f" (all {s['batches_run']} batches: {s['full_length']})"
    return f" ({s['batches_run']} of {s['batches_paper']} batches)" if local_steps else ""


def print_table(results: Path) -> int:
    """The table of a results.jsonl; a file that is missing or not one this script wrote: one line, exit 2."""
    try:
        lines = results.read_text().splitlines()
    except OSError as err:
        return _fail(f"--table {results}: cannot read it ({err.strerror or type(err).__name__})")
    except UnicodeDecodeError:
        return _fail(f"--table {results}: not a text file; give a results.jsonl this script wrote")
    last = {}
    for number, line in enumerate(lines, 1):
        try:
            saved = json.loads(line)
            steps = saved.pop("local_steps")
            saved.pop("overrides")
            last[saved["conf"]] = (Result(**saved), steps)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            return _fail(f"--table {results}, line {number}: not a row this script writes to results.jsonl "
                         f"({type(err).__name__}: {str(err).splitlines()[0][:80] if str(err) else ''})")
    print(HEADER)
    for conf in sorted(last):
        print(row(*last[conf]))
    return 0


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def paper_configs() -> list[str]:
    from fl.config.load import available_confs
    return [c for c in available_confs() if not c.endswith("_synthetic") and c not in PAPER_CONFIGS_EXCLUDED]


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        steps = int(sys.argv[3]) or None
        return child(sys.argv[5:], Path(sys.argv[2]), steps)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("args", nargs="*", help="conf=NAME and key=value overrides (given to every config with --all)")
    p.add_argument("--all", action="store_true", help="every paper config (conf/*.yaml without a _synthetic twin)")
    p.add_argument("--local-steps", type=int, default=None, help="run N local steps per client, project the rest")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one config may take")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "fl_paper_scale")
    p.add_argument("--keep", action="store_true", help="keep each run's directory (checkpoints, states)")
    p.add_argument("--table", type=Path, help="print the table of a results.jsonl these runs wrote (the last row per "
                                              "config, in config order), and run nothing")
    a = p.parse_intermixed_args()
    if a.local_steps is not None and a.local_steps < 1:
        return _fail(f"--local-steps {a.local_steps}: it must be >= 1 (leave it out to run the paper's local epochs)")
    if a.table:
        return print_table(a.table)
    confs = [x.split("=", 1)[1] for x in a.args if x.startswith("conf=")]
    overrides = [x for x in a.args if not x.startswith("conf=")]
    if a.all == bool(confs):
        p.error("give conf=NAME or --all")
    known = paper_configs()
    bad = [c for c in confs if c not in known]
    if bad:
        p.error(f"conf={bad[0]} is not a paper config; choices: {', '.join(known)}")
    a.out.mkdir(parents=True, exist_ok=True)
    print(HEADER, flush=True)
    for conf in known if a.all else confs:
        r = rehearse(conf, overrides, a.out, a.local_steps, a.timeout)
        print(row(r, a.local_steps), flush=True)
        with open(a.out / "results.jsonl", "a") as f:
            f.write(json.dumps({**r.__dict__, "local_steps": a.local_steps, "overrides": overrides}) + "\n")
        if not a.keep:
            shutil.rmtree(a.out / conf, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
