"""Client state at scale: peak RSS, round time, checkpoint time and size, disk used and bytes exchanged between
processes, for the in-memory store (state.cache_mb=null) and the disk-backed one (state.cache_mb=MiB).

    python bench/state_store.py ditto1000 [--cache-mb 2048] [--in-memory]
    python bench/state_store.py fedmosaic [--cache-mb 2048] [--in-memory]
    python bench/state_store.py ddp [--cache-mb 64]
    python bench/state_store.py run -- <fl.train arguments>     (any run, measured the same way)

Each run is `fl.train` in a child process (this file with --child, which times every checkpoint and counts what
crosses processes, then calls fl.run.train.main); peak RSS is each process's own ru_maxrss from the operating
system, written at its exit. Prints one Markdown row per run; the figures are in bench/README.md.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = {
    # Ditto keeps a whole personal ResNet-18 per client (45 MB); 1000 clients, 10% a round, 3 rounds
    "ditto1000": ["method.name=ditto", "data.name=embedded", "data.num_clients=1000",
                  "data.embedded.samples_per_class=1000", "data.partition.name=iid", "model.name=resnet18",
                  "trainer.participation=0.1", "trainer.rounds=3", "trainer.local_steps=1", "trainer.batch_size=8",
                  "trainer.eval_every=3", "trainer.checkpoint_every=1", "trainer.evaluators=[]"],
    # fedmosaic_domainnet's state: 30 clients x (AlexNet-BN + Adam), on the twin's images at 64 px (AlexNet's least)
    "fedmosaic": ["conf=fedmosaic_domainnet_synthetic", "model.name=alexnet_bn", "data.image_size=64",
                  "trainer.rounds=2", "trainer.local_steps=1", "trainer.batch_size=8", "trainer.eval_every=2",
                  "trainer.checkpoint_every=1", "trainer.evaluators=[]"],
    # a stateful method on 2 processes: what crosses them each round
    "ddp": ["method.name=ditto", "data.num_clients=40", "trainer.participation=0.5", "trainer.rounds=4",
            "trainer.checkpoint_every=2", "model.width=16", "trainer.evaluators=[]"],
}


# ---- the child: one fl.train run, measured from inside ------------------------------------------------------------
def instrument(report: Path) -> dict:
    """Count what crosses processes and time every checkpoint in this process; at exit, write the counts and the
    process's peak RSS to <report>.rank<r> (JSON). Returns the dict, for a caller to add its own figures."""
    import fl.core.evaluation as evaluation
    import fl.core.exchange as exchange
    import fl.core.loop as loop

    rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    stats = {"rank": rank, "checkpoints": [], "gathered_bytes": 0, "reduced_bytes": 0, "checkpoint_gathered_bytes": 0}
    gather = exchange.gather_objects

    def counted_gather(fabric, obj):
        if fabric.world_size > 1:  # what this process sends to the others (a pickled broadcast)
            stats["gathered_bytes"] += len(pickle.dumps(obj))
        return gather(fabric, obj)

    for module in (exchange, loop, evaluation):
        if hasattr(module, "gather_objects"):
            module.gather_objects = counted_gather
    reduce = exchange.exchange

    def counted_exchange(fabric, acc, results):
        if fabric.world_size > 1:
            stats["reduced_bytes"] += sum(v.numel() * 8 for v in acc.sums.values())
        return reduce(fabric, acc, results)

    loop.exchange = counted_exchange
    save = loop.Orchestrator.save

    def timed_save(self, rnd):
        written, gathered = getattr(self.store, "files_written", 0), stats["gathered_bytes"]
        start = time.perf_counter()
        save(self, rnd)
        stats["checkpoint_gathered_bytes"] += stats["gathered_bytes"] - gathered
        stats["checkpoints"].append({"round": rnd, "seconds": time.perf_counter() - start,
                                     "bytes": self.ckpt_path.stat().st_size if self.ckpt_path.exists() else 0,
                                     "state_files_written": getattr(self.store, "files_written", 0) - written})

    loop.Orchestrator.save = timed_save

    def write_report():
        stats["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            stats["peak_device_bytes"] = torch.cuda.max_memory_allocated()
        with open(report.with_name(f"{report.name}.rank{rank}"), "w") as f:
            json.dump(stats, f)

    atexit.register(write_report)
    return stats


def child(argv: list[str], report: Path) -> int:
    instrument(report)
    from fl.run.train import main
    return main(argv)


# ---- the parent: runs, reads, prints ------------------------------------------------------------------------------
def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def measure(args: list[str], label: str, out: Path) -> dict:
    run = out / label
    shutil.rmtree(run, ignore_errors=True)
    report = out / f"{label}.json"
    for old in out.glob(f"{label}.json.rank*"):
        old.unlink()
    argv = [*args, "logger.wandb.mode=disabled", "logger.progress=false", f"logger.output_dir={out}",
            f"logger.run_name={label}"]
    start = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--child", str(report), "--", *argv], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob(f"{label}.json.rank*"))]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] if (
        run / "metrics.jsonl").exists() else []
    result = {"label": label, "exit": res.returncode, "wall_s": wall, "ranks": ranks,
              "round_s": [r.get("time/round_s") for r in rows], "state_dir_bytes": du(run / "client_states"),
              "ckpt_dir_bytes": du(run / "checkpoints"),
              "stderr": res.stderr.strip().splitlines()[-1:] if res.returncode else []}
    return result


def row(r: dict) -> str:
    rss = " / ".join(f"{x['peak_rss_mb']:.0f}" for x in r["ranks"]) or "?"
    ckpts = r["ranks"][0]["checkpoints"] if r["ranks"] else []
    ck = "; ".join(f"r{c['round']}: {c['seconds']:.2f} s, {c['state_files_written']} files" for c in ckpts)
    rounds = ", ".join(f"{t:.1f}" for t in r["round_s"] if t is not None)
    rounds_run = max(1, len(r["round_s"]))
    crossed = " / ".join(
        f"{(x['gathered_bytes'] - x['checkpoint_gathered_bytes'] + x['reduced_bytes']) / rounds_run / 2**20:.2f} + "
        f"{x['checkpoint_gathered_bytes'] / 2**20:.1f}" for x in r["ranks"])
    return (f"| {r['label']} | {r['exit']} | {rss} MiB | {rounds} s | {ck} | {r['state_dir_bytes'] / 2**30:.2f} GiB "
            f"| {r['ckpt_dir_bytes'] / 2**20:.1f} MiB | {crossed} | {r['wall_s']:.0f} s |")


HEADER = ("| run | exit | peak RSS per process | round times | checkpoints (time, state files written) "
          "| state dir | checkpoint dir | sent to the other process: per round + at checkpoints (MiB, per process) "
          "| wall |\n|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[4:], Path(sys.argv[2]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=[*SCENARIOS, "run"])
    p.add_argument("--cache-mb", type=float, default=2048.0)
    p.add_argument("--in-memory", action="store_true", help="also run with state.cache_mb=null")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "fl_state_bench")
    p.add_argument("extra", nargs="*", help="fl.train arguments (after --)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    base = SCENARIOS.get(a.scenario, []) + a.extra + ["fabric.cpu_threads=2"]
    runs = [(f"{a.scenario}-disk{a.cache_mb:g}", base + [f"state.cache_mb={a.cache_mb}"])]
    if a.in_memory or a.scenario == "ddp":
        runs.append((f"{a.scenario}-memory", base))
    if a.scenario == "ddp":
        two = ["fabric.strategy=ddp", "fabric.devices=2", "fabric.cpu_threads=1"]
        runs = [("ddp-1proc-memory", base), ("ddp-2proc-memory", base + two),
                (f"ddp-2proc-disk{a.cache_mb:g}", base + two + [f"state.cache_mb={a.cache_mb}"])]
    print(HEADER)
    results = []
    for label, args in runs:
        r = measure(args, label, a.out)
        results.append(r)
        print(row(r), flush=True)
        if r["exit"]:
            print(f"  ({label} exited {r['exit']}: {' '.join(r['stderr'])})")
    (a.out / f"{a.scenario}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
