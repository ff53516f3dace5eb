"""Framework overhead and memory.

1. Times N rounds of FedAvg (small CNN, 20 clients, full participation) through the framework's round
   loop and through a bare hand-written PyTorch loop doing the same SGD steps on the same data in the
   same order, interleaved over several repeats, and prints the ratio of the medians. Both end with the
   same global model (checked), so they did the same work.
2. Runs 1000 clients with private heads (FedPer) in a child process and reports its peak memory.
3. --whole-process: whole processes, interleaved over the repeats: `python -m fl.train`'s work (bench/fl_phases.py:
   the same entry steps, its wall time split by phase: imports, setup (config, data, Fabric, run directory), training,
   evaluation, checkpoints, finish, exit) against bench/bare_fedavg.py, bare PyTorch doing the same work (the same
   clients, rounds, model, data and batches, and one evaluation of the final model giving the same per-client
   accuracies, checked, the cheapest correct way: one pass over the official test set, gathered by index). The run
   is FedAvg on the setting of 1. with data.test_split=official, --rounds rounds and one evaluation at the end;
   fl's own evaluators are off (trainer.evaluators=[]): their diagnostics are work the bare script does not do; fl
   runs twice per repeat, its partition heatmaps off (the same diagnostics argument) and on (its default).
   Both processes get fl's thread policy (OMP_WAIT_POLICY=PASSIVE unless the environment sets it), so the ratio is
   the framework's, not the policy's (bench/contention.py measures that).

    python bench/fedavg_overhead.py [--rounds 5] [--repeats 5] [--clients-memory 1000] [--device cpu]
    python bench/fedavg_overhead.py --whole-process [--rounds 6] [--repeats 5]
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import orchestrator  # noqa: E402
from fl.config import load_config  # noqa: E402
from fl.core import batch_indices, build_model  # noqa: E402
from fl.core.batches import eval_batch_size  # noqa: E402
from fl.core.loop import sample_clients  # noqa: E402
from fl.core.seeding import derive_seed, generator, seed_torch  # noqa: E402
from fl.data import build_data  # noqa: E402
from fl.run.cpu_threads import env_for_one_of  # noqa: E402

BENCH = ROOT / "bench"
PHASES = ("imports", "setup", "training", "evaluation", "checkpoints", "finish", "exit")
BARE_PHASES = ("imports", "load", "training", "evaluation", "exit")


def bench_config(tmp: str, rounds: int, device: str) -> list[str]:
    return ["method.name=fedavg", "data.num_clients=20", "data.embedded.samples_per_class=500", "model.name=cnn",
            "model.width=16", "trainer.batch_size=32", "trainer.local_epochs=1", "trainer.participation=1.0",
            f"trainer.rounds={rounds + 1}", f"trainer.eval_every={rounds + 1}", "optim.lr=0.05",
            "optim.momentum=0.9", f"fabric.accelerator={device}", "logger.wandb.mode=disabled",
            f"logger.output_dir={tmp}", f"data.root={tmp}/data"]


def framework_rounds(cfg, data, rounds: int) -> tuple[float, dict]:
    orch = orchestrator(cfg, Path(tempfile.mkdtemp()), data)
    fabric, server = orch.fabric, orch.server
    _sync(fabric.device)
    start = time.perf_counter()
    for rnd in range(rounds):
        orch.run_round(rnd)  # sampling, broadcast, local training, aggregation, server step (no eval)
    _sync(fabric.device)
    return time.perf_counter() - start, {k[len("model."):]: v for k, v in server.global_params.items()}


def bare_rounds(cfg, data, rounds: int, device: torch.device) -> tuple[float, dict]:
    """What a researcher would write by hand: the same steps, no framework."""
    clients = [(c.train.x.to(device), c.train.y.to(device)) for c in data.clients]
    seed_torch(cfg.seed, 0, -1, "init")
    model = build_model(cfg, data.input_shape, data.num_classes).to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    _sync(device)
    start = time.perf_counter()
    for rnd in range(rounds):
        sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        total = 0
        for cid in sample_clients(cfg.seed, rnd, len(clients), cfg.trainer.participation):
            x, y = clients[cid]
            model.load_state_dict(state)
            opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum)
            seed_torch(cfg.seed, rnd, cid, "train")
            for _, idx in batch_indices(len(y), cfg.trainer.batch_size, generator(cfg.seed, rnd, cid, "train"),
                                        epochs=cfg.trainer.local_epochs):
                if idx is None:
                    continue
                idx = idx.to(device)
                loss = F.cross_entropy(model(data.prepare(x[idx])), y[idx])  # uint8 -> normalised floats
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            for k, v in model.state_dict().items():
                sums[k].add_(v.double(), alpha=len(y))
            total += len(y)
        state = {k: (s / total).to(state[k].dtype) for k, s in sums.items()}
    _sync(device)
    return time.perf_counter() - start, state


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def overhead(rounds: int, repeats: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(bench_config(tmp, rounds, device))
        data = build_data(cfg)
        dev = torch.device("cuda" if device == "cuda" else "cpu")
        fw, bare = [], []
        framework_rounds(cfg, data, 1)  # warm-up both paths (allocator, kernels)
        bare_rounds(cfg, data, 1, dev)
        for rep in range(repeats):  # alternate which path runs first, so drift favours neither
            if rep % 2:
                t_bare, g_bare = bare_rounds(cfg, data, rounds, dev)
            t_fw, g_fw = framework_rounds(cfg, data, rounds)
            if not rep % 2:
                t_bare, g_bare = bare_rounds(cfg, data, rounds, dev)
            fw.append(t_fw)
            bare.append(t_bare)
        diff = max(float((g_fw[k].double() - g_bare[k].double().to(g_fw[k].device)).abs().max()) for k in g_bare)
        steps = sum(-(-len(c.train) // cfg.trainer.batch_size) for c in data.clients) * rounds
    return {"rounds": rounds, "repeats": repeats, "device": device, "sgd_steps_per_repeat": steps,
            "framework_s_median": statistics.median(fw), "bare_s_median": statistics.median(bare),
            "ratio": statistics.median(fw) / statistics.median(bare), "framework_s": fw, "bare_s": bare,
            "max_abs_param_diff": diff, "torch_threads": torch.get_num_threads()}


def whole_config(tmp: str, rounds: int) -> list[str]:
    """The run both processes do: the setting of bench_config, each client tested on its share of the official test
    split, one evaluation (the last round) and one checkpoint (the last round, as every run writes), no evaluators."""
    kept = [a for a in bench_config(tmp, rounds, "cpu") if not a.startswith(("trainer.rounds", "trainer.eval_every"))]
    return kept + [f"trainer.rounds={rounds}", f"trainer.eval_every={rounds}", "trainer.checkpoint_every=0",
        "data.test_split=official", "trainer.evaluators=[]", "logger.progress=false"]


def bare_inputs(cfg, data, path: Path) -> None:
    """What bench/bare_fedavg.py reads: the run's data, draws and hyperparameters (see its docstring)."""
    m, t = data.num_clients, cfg.trainer
    c, h, _ = data.input_shape
    torch.save({
        "train": [(client.train.x, client.train.y) for client in data.clients],
        "test_x": data.global_test.x, "test_y": data.global_test.y,
        "test_rows": [client.test_rows for client in data.clients], "mean": data.mean, "std": data.std,
        "sampled": [sample_clients(cfg.seed, r, m, t.participation, t.sampling) for r in range(t.rounds)],
        "seeds": [[derive_seed(cfg.seed, r, cid, "train") for cid in range(m)] for r in range(t.rounds)],
        "init_seed": derive_seed(cfg.seed, 0, -1, "init"), "model": (c, h, cfg.model.width, data.num_classes),
        "lr": cfg.optim.lr, "momentum": cfg.optim.momentum, "batch_size": t.batch_size,
        "eval_batch_size": eval_batch_size(cfg, "cpu")}, path)


def timed_process(args: list[str], name: str) -> tuple[dict, str]:
    """Runs `python SCRIPT T0 ARGS...` (`args`: SCRIPT, ARGS...; T0: the wall clock now) and returns its phases (the
    `PHASES {json}` line of its stderr) with `exit` (its end as seen here minus the time it reported returning) and
    `total`, and its stdout."""
    start = time.time()
    done = subprocess.run([sys.executable, args[0], str(start), *args[1:]], cwd=ROOT, env=env_for_one_of(1),
                          capture_output=True, text=True)
    end = time.time()
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
    line = next(row for row in reversed(done.stderr.splitlines()) if row.startswith("PHASES "))
    phases = json.loads(line[len("PHASES "):])
    phases["exit"] = end - phases.pop("returned_at")
    phases["total"] = end - start
    return phases, done.stdout


FL_RUNS = {"fl": [], "fl_plots": ["logger.partition_plots=true"]}  # the bare script's work; and with fl's heatmaps


def whole_process(rounds: int, repeats: int, warm_up: bool = True) -> dict:
    """`repeats` rounds of three processes, their order rotated: fl doing the bare script's work (the partition
    heatmaps off, as the evaluators: diagnostics the bare script does not draw), fl with its heatmaps (its default),
    and the bare script. fl's modules are byte-compiled first, as an installed package's are (a machine that sets
    PYTHONDONTWRITEBYTECODE would otherwise compile them in every process)."""
    compileall.compile_dir(ROOT / "fl", quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        args = [*whole_config(tmp, rounds), "logger.partition_plots=false"]
        cfg = load_config(args)
        data = build_data(cfg)  # the data cache the runs read
        inputs = Path(tmp) / "bare_inputs.pt"
        bare_inputs(cfg, data, inputs)
        names = [*FL_RUNS, "bare"]

        def command(name: str, run: str) -> list[str]:
            if name == "bare":
                return [str(BENCH / "bare_fedavg.py"), str(inputs)]
            return [str(BENCH / "fl_phases.py"), *args, *FL_RUNS[name], f"logger.run_name={run}"]

        if warm_up:  # untimed: the files are in the page cache, the data cache is read
            for name in names:
                timed_process(command(name, f"warm-up-{name}"), name)
        runs = {name: [] for name in names}
        for rep in range(repeats):  # rotate which runs first, so drift favours none
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                phases, out = timed_process(command(name, f"{name}-{rep}"), name)
                runs[name].append(phases)
                if name == "bare":
                    accuracy = json.loads(next(r for r in out.splitlines() if r.startswith("ACCURACY "))[9:])
            for name in FL_RUNS:
                row = json.loads((Path(tmp) / f"{name}-{rep}" / "metrics.jsonl").read_text().splitlines()[-1])
                same = ([row[f"client/{i}/acc"] for i in range(data.num_clients)] == accuracy["clients"]
                        and abs(row["test/acc_global_micro"] - accuracy["pooled"]) < 1e-6)
                if not same:
                    raise SystemExit(f"repeat {rep}: {name}'s per-client accuracies differ from the bare script's: "
                                     "the runs did not do the same work")
    median = lambda side, key: statistics.median(r[key] for r in runs[side])  # noqa: E731
    result = {"rounds": rounds, "repeats": repeats, "clients": data.num_clients,
              "official_test": len(data.global_test), "same_accuracies": True,
              "bare": {k: median("bare", k) for k in (*BARE_PHASES, "total")}, "bare_runs": runs["bare"],
              "load_average": os.getloadavg()}
    for name in FL_RUNS:
        result[name] = {k: median(name, k) for k in (*PHASES, "total")}
        result[name + "_setup_parts"] = {k: statistics.median(r["setup_parts"][k] for r in runs[name])
                                         for k in runs[name][0]["setup_parts"]}
        result[name + "_runs"] = runs[name]
        result[name + "_ratio"] = result[name]["total"] / result["bare"]["total"]
        result[name + "_pair_ratios"] = [f["total"] / b["total"] for f, b in zip(runs[name], runs["bare"])]
    return result


def memory(num_clients: int, device: str) -> dict:
    """Peak RSS of a child process running FedPer (private heads) on `num_clients` clients."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["method.name=fedper", f"data.num_clients={num_clients}", "data.embedded.samples_per_class=4000",
                "data.partition.alpha=1.0", "model.width=16", "trainer.rounds=3", "trainer.participation=0.1",
                "trainer.eval_every=3", "trainer.checkpoint_every=3", f"fabric.accelerator={device}",
                "logger.wandb.mode=disabled", "logger.progress=false", f"logger.output_dir={tmp}",
                f"data.root={tmp}/data", "logger.run_name=mem"]
        code = ("import resource,sys,time,torch; from fl.run.train import main; t=time.perf_counter(); "
                "rc=main(sys.argv[1:]); dt=time.perf_counter()-t; "
                "cuda=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0; "
                "print('RESULT', rc, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, cuda, dt)")
        out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True)
        line = next(row for row in out.stdout.splitlines() if row.startswith("RESULT"))
        _, rc, rss_kb, cuda, seconds = line.split()
        ckpt = Path(tmp) / "mem" / "checkpoints" / "last.ckpt"
        return {"clients": num_clients, "exit_code": int(rc), "peak_rss_mib": int(rss_kb) / 1024,
                "peak_cuda_mib": int(cuda) / 2**20, "seconds": float(seconds),
                "checkpoint_mib": ckpt.stat().st_size / 2**20 if ckpt.exists() else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clients-memory", type=int, nargs="*", default=[20, 1000])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--whole-process", action="store_true", help="fl's whole process against a bare script's (CPU)")
    args = p.parse_args()
    if args.whole_process:
        print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
        w = whole_process(args.rounds, args.repeats)
        print(f"FedAvg, {w['clients']} clients, small CNN, {w['rounds']} rounds and one evaluation "
              f"({w['official_test']} official test images), whole processes, median of {w['repeats']}:")
        for name, label in (("fl", "fl, the bare script's work (heatmaps off)"), ("fl_plots", "fl, its heatmaps on")):
            print(f"  {label}:\n    " + "  ".join(f"{k} {w[name][k]:.2f}" for k in PHASES)
                  + f"  = {w[name]['total']:.2f} s")
            print("    setup: " + "  ".join(f"{k} {v:.2f}" for k, v in w[name + "_setup_parts"].items()))
        print("  bare PyTorch:\n    " + "  ".join(f"{k} {w['bare'][k]:.2f}" for k in BARE_PHASES)
              + f"  = {w['bare']['total']:.2f} s")
        for name in FL_RUNS:
            pairs = ", ".join(f"{r:.2f}" for r in w[name + "_pair_ratios"])
            print(f"  ratio {name} / bare = {w[name + '_ratio']:.3f}   (per repeat: {pairs})")
        print("  same per-client accuracies: checked every repeat")
        print(f"load average {w['load_average'][0]:.2f} at the end")
        if args.json:
            Path(args.json).write_text(json.dumps({"whole_process": w}, indent=2))
        return
    res = {"overhead": overhead(args.rounds, args.repeats, args.device)}
    o = res["overhead"]
    print(f"FedAvg, 20 clients, small CNN, {o['rounds']} rounds x {o['repeats']} repeats on {o['device']} "
          f"({o['sgd_steps_per_repeat']} SGD steps each, {o['torch_threads']} torch threads)")
    print(f"  framework  median {o['framework_s_median']:.3f} s")
    print(f"  bare loop  median {o['bare_s_median']:.3f} s")
    print(f"  ratio framework / bare = {o['ratio']:.3f}   "
          f"(same final model: max |diff| = {o['max_abs_param_diff']:.1e})")
    res["memory"] = []
    for n in args.clients_memory:
        m = memory(n, args.device)
        res["memory"].append(m)
        print(f"FedPer with {m['clients']} clients (private heads), 10% participation, 3 rounds: "
              f"exit {m['exit_code']}, "
              f"peak RSS {m['peak_rss_mib']:.0f} MiB, peak CUDA {m['peak_cuda_mib']:.0f} MiB, "
              f"{m['seconds']:.1f} s, checkpoint {m['checkpoint_mib']:.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
