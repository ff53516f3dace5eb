"""fl against PFLlib on one CPU workload, as whole processes: FedAvg, 20 clients, PFLlib's FedAvgCNN (registered into
fl from outside: bench/pfllib_cnn.py), the embedded 3x32x32 data (20 clients, 500 samples a class), SGD lr 0.01
without momentum, batch 32 with drop_last, --rounds rounds and one evaluation, each framework's own way (PFLlib:
before the first round, every client's test and training data; fl: after the last round, at its defaults or with
its evaluators off), W&B off. The clients' data are written in PFLlib's layout (<pfllib>/dataset/<NAME>/train and
test, one .npz a client, normalised as fl normalises them), so both train on the same images. Each repeat runs every
variant once, the order rotated; both get fl's thread policy (OMP_WAIT_POLICY=PASSIVE). Prints the median wall time
of each and its ratio to PFLlib's.

    python bench/pfllib_compare.py --pfllib DIR [--python PY] [--repeats 3] [--rounds 6] [--ks 1 4] [--threads N]

DIR: a checkout of https://github.com/TsingZ0/PFLlib (measured at d832e76); PY: an interpreter with PFLlib's
requirements (scikit-learn, h5py, calmsize, ujson and torch; default: this one). --threads N: OMP_NUM_THREADS=N for
every process of both frameworks (default: unset, torch's own choice, one thread a core).
"""
from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl.config import load_config  # noqa: E402
from fl.data import build_data  # noqa: E402
from fl.run.cpu_threads import env_for_one_of  # noqa: E402

NAME = "Cifar10flbench"  # PFLlib picks FedAvgCNN's 32 px size (dim=1600) for a dataset named Cifar10*
CLIENTS = 20


def fl_args(tmp: str, rounds: int) -> list[str]:
    return ["method.name=fedavg", f"data.num_clients={CLIENTS}", "data.embedded.channels=3", "data.image_size=32",
            "data.embedded.samples_per_class=500", f"data.root={tmp}/data", "model.name=pfllib_cnn",
            "plugins=[bench.pfllib_cnn]", "optim.lr=0.01", "optim.momentum=0", "trainer.batch_size=32",
            "trainer.drop_last=true", f"trainer.rounds={rounds}", f"trainer.eval_every={rounds}",
            "trainer.participation=1.0", "logger.wandb.mode=disabled", "logger.progress=false",
            f"logger.output_dir={tmp}/runs"]


def write_pfllib_data(cfg, folder: Path) -> None:
    """Each client's training and test split as PFLlib reads them: <folder>/{train,test}/<i>.npz holding
    data={'x': float32 images normalised as fl does, 'y': int64 labels}."""
    data = build_data(cfg)
    mean = np.asarray(data.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(data.std, dtype=np.float32).reshape(1, -1, 1, 1)
    for split in ("train", "test"):
        (folder / split).mkdir(parents=True, exist_ok=True)
    for i, client in enumerate(data.clients):
        for split, part in (("train", client.train), ("test", client.test)):
            x = (part.x.numpy().astype(np.float32) / 255 - mean) / std
            with open(folder / split / f"{i}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": x, "y": part.y.numpy().astype(np.int64)})


def timed(command: list[str], cwd: Path, name: str, env: dict) -> float:
    start = time.time()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{(done.stderr or done.stdout)[-2000:]}")
    return time.time() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pfllib", required=True, type=Path, help="a checkout of PFLlib (its system/ folder inside)")
    p.add_argument("--python", default=sys.executable, help="an interpreter with PFLlib's requirements")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 4], help="fl's trainer.parallel_clients values")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS of every process, both frameworks")
    args = p.parse_args()
    env = env_for_one_of(1)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    system = args.pfllib / "system"
    if not (system / "main.py").is_file():
        print(f"--pfllib: {args.pfllib} has no system/main.py; give a checkout of PFLlib", file=sys.stderr)
        raise SystemExit(2)
    compileall.compile_dir(ROOT / "fl", quiet=1)  # as an installed package is (bench/fedavg_overhead.py)
    print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = fl_args(tmp, args.rounds)
        write_pfllib_data(load_config(base), args.pfllib / "dataset" / NAME)
        commands = {"PFLlib": ([args.python, "main.py", "-data", NAME, "-m", "CNN", "-algo", "FedAvg",
                                "-gr", str(args.rounds - 1), "-dev", "cpu", "-nc", str(CLIENTS), "-ncl", "10",
                                "-lbs", "32", "-lr", "0.01", "-eg", str(args.rounds), "-t", "1", "-jr", "1"], system)}
        for k in args.ks:
            for label, extra in (("defaults", []), ("evaluators off", ["trainer.evaluators=[]"])):
                commands[f"fl K={k}, {label}"] = ([sys.executable, "-m", "fl.train", *base,
                                                   f"trainer.parallel_clients={k}", *extra], ROOT)
        for name, (command, cwd) in commands.items():  # untimed: the data cache, the page cache
            timed(command, cwd, name, env)
        names, times = list(commands), {name: [] for name in commands}
        for rep in range(args.repeats):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                times[name].append(timed(*commands[name], name, env))
    pfllib = statistics.median(times["PFLlib"])
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads is not None else "threads: torch's default"
    print(f"FedAvg, {CLIENTS} clients, FedAvgCNN, {args.rounds} rounds, whole processes, median of {args.repeats}, "
          f"{threads}:")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"  {name:28s} {median:6.2f} s   ratio to PFLlib {median / pfllib:.2f}   "
              f"(runs: {', '.join(f'{t:.1f}' for t in runs)})")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
