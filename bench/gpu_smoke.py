"""The first GPU run in one command: does every method run in every precision, does training keep the GPU busy, is
a run reproducible, and how fast is it. Prints one table.

    python bench/gpu_smoke.py --device cuda [--parts precision syncs determinism compile throughput]
                              [--methods fedavg pfedfda ...] [--keep DIR]
    python bench/gpu_smoke.py --device cpu       # a dry run of the same checks at tiny sizes (minutes)

Parts (all by default):
- precision: every registered method on its synthetic twin (the first conf/*_synthetic.yaml of the method; FedAvg's is
  the quickstart, and a method without one runs the quickstart under its name) for 2 rounds of a few local steps,
  in 32-true, bf16-mixed and 16-mixed: each run's exit code, its headline metric and the gap to 32-true. The dry
  run on a CPU runs FedAvg and the seed papers' methods on a tiny quickstart instead (a twin's model takes minutes
  there), and, as Fabric would run 16-mixed as bf16 on a CPU, gives Fabric a real fp16 autocast and loss scaler
  (`MixedPrecision("16-mixed", "cpu")`), the path CUDA takes.
- syncs: FedAvg, FedDRM, FedPALS, pFedFDA and FedACD on the quickstart under
  `torch.cuda.set_sync_debug_mode("warn")`: the host-device synchronisations per local training step after the
  first round (target 0), and where in fl/ the most frequent ones come from. CUDA only.
- determinism: the quickstart twice with `fabric.deterministic=true` (metrics, global model and client states
  compared bitwise), once without it (its time is the flag's cost), and with 1 against 2 devices (`fabric.strategy=ddp`,
  two processes: on a CPU, gloo).
- compile: the quickstart with `trainer.parallel_clients=8 trainer.compile=true`: graphs compiled (1 = no recompile)
  and graph breaks (target 1 and 0), against the same run uncompiled. The dry run on a CPU compiles with Dynamo's
  eager backend (the same graphs and breaks; inductor's CPU kernels are tests/core/test_parallel_clients.py's, and
  building them costs a fresh machine tens of seconds of C++).
- throughput: client-updates per second of FedAvg's local training, sequential vs K at once vs a PFLlib-style loop
  (bench/client_throughput.py's loops).

Every row shows the peak GPU memory of what it ran (CUDA). The runs go to a temporary directory (`--keep DIR` keeps
them). The checks are runs, not assertions: a failing run is a row that says so, and the exit code is 1 when any row
misses its target.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import fl.run.train  # noqa: E402
from bench import client_throughput  # noqa: E402
from fl.config import load_config  # noqa: E402
from fl.config.load import available_confs  # noqa: E402
from fl.core import registry  # noqa: E402
from fl.report.tables import DEFAULT_METRIC  # noqa: E402

PARTS = ("precision", "syncs", "determinism", "compile", "throughput")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
SYNC_METHODS = ("fedavg", "feddrm", "fedpals", "pfedfda", "fedacd")
# How much each part runs: "cuda" at the twins' sizes (few local steps), "cpu" tiny (a dry run of the checks)
SCALE = {
    "cuda": SimpleNamespace(local_steps=5, rounds=2, quick=["trainer.rounds=3"], backend="inductor",
                            throughput={"clients": 64, "samples": 100, "batch": 50, "ks": [8, 32], "rounds": 3}),
    "cpu": SimpleNamespace(local_steps=2, rounds=2, backend="eager",
                           quick=["trainer.rounds=2", "data.num_clients=8", "data.embedded.samples_per_class=40",
                                  "model.width=4", "fabric.cpu_threads=1"],
                           throughput={"clients": 8, "samples": 24, "batch": 8, "ks": [4], "rounds": 1}),
}
# What a method needs besides the quickstart's settings (the dry run and the syncs part run it there)
NEEDS = {"fedpals": ["data.target.distribution=partition"], "fedmosaic": ["data.public_size=100"],
         "fedct": ["data.public_size=100"]}
# The dry run's methods by default (every method takes too long on a CPU): FedAvg and the five seed papers'
SEED_METHODS = ["fedavg", "feddrm", "fedpals", "fedmosaic", "pfedfda", "fedacd"]


@dataclass
class Row:
    part: str
    case: str
    result: str
    target: str
    ok: bool | None  # None: nothing to compare (n/a, a measurement)
    peak: str = ""


class Smoke:
    def __init__(self, device: str, workdir: Path):
        self.device, self.workdir = device, workdir
        self.scale = SCALE[device]
        self.rows: list[Row] = []
        self.count = 0

    # ---- running fl.train ------------------------------------------------------------------------------------
    def base(self, name: str) -> list[str]:
        return [f"fabric.accelerator={self.device}", "logger.wandb.mode=disabled", "logger.progress=false",
                f"logger.output_dir={self.workdir / 'outputs'}", f"data.root={self.workdir / 'data'}",
                f"logger.run_name={name}"]

    def run(self, args: list[str], name: str) -> tuple[int, str, float, Path]:
        """fl.train in this process: exit code, the last line it printed to stderr (or the exception), seconds,
        and the run directory."""
        err = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):  # warnings go to `err`
            try:
                rc = fl.run.train.main(self.base(name) + args)
            except Exception as exc:  # a crash is a row, not the end of the smoke test
                rc = -1
                err.write(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n")
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if line.startswith(("error", "notice"))), lines[-1] if lines
                    else "")
        return rc, last[:160], time.perf_counter() - start, self.workdir / "outputs" / name

    def run_processes(self, args: list[str], name: str, devices: int) -> tuple[int, str, Path]:
        """fl.train in new processes (`devices` of them, Fabric's ddp when more than one)."""
        ddp = ["fabric.strategy=ddp", f"fabric.devices={devices}"] if devices > 1 else ["fabric.devices=1"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("FL_RUN_DIR", None)
        res = subprocess.run([sys.executable, "-m", "fl.train", *self.base(name), *args, *ddp], cwd=self.workdir,
                             env=env, capture_output=True, text=True, timeout=900)
        last = next((line for line in reversed(res.stderr.splitlines()) if line.strip()), "")
        return res.returncode, last[:160], self.workdir / "outputs" / name

    def name(self, label: str) -> str:
        self.count += 1
        return f"{self.count:03d}-{label}"

    @contextlib.contextmanager
    def peak(self):
        """Peak GPU memory of the block, in MiB, as a one-item list filled on exit ('' off CUDA)."""
        out = [""]
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        yield out
        if self.device == "cuda":
            torch.cuda.synchronize()
            out[0] = f"{torch.cuda.max_memory_allocated() / 2 ** 20:.0f}"

    def add(self, part, case, result, target, ok, peak="") -> None:
        self.rows.append(Row(part, case, result, target, ok, peak if self.device == "cuda" else "n/a on cpu"))

    def na(self, part: str, case: str, why: str, target: str = "") -> None:
        self.rows.append(Row(part, case, why, target, None, "n/a" if self.device == "cuda" else "n/a on cpu"))

    # ---- precision ------------------------------------------------------------------------------------------
    def precision(self, methods: list[str]) -> None:
        twins = synthetic_twins() if self.device == "cuda" else {}
        for method in methods:
            if self.device == "cuda":  # the twin, for 2 rounds of a few local steps
                conf, extra = twins.get(method, ("quickstart", [f"method.name={method}"]))
                args = [f"conf={conf}", *extra, f"trainer.rounds={self.scale.rounds}", "trainer.eval_every=1000",
                        f"trainer.local_steps={self.scale.local_steps}"]
            else:  # the dry run: the tiny quickstart under the method's name (a twin's model is minutes on a CPU)
                conf, extra = "quickstart", [f"method.name={method}", *NEEDS.get(method, [])]
                args = [f"conf={conf}", *extra, *self.scale.quick, "trainer.eval_every=1000",
                        f"trainer.local_steps={self.scale.local_steps}"]
            headline = registry.METHODS[method].headline or DEFAULT_METRIC
            results, ok, peaks = {}, True, []
            for precision in PRECISIONS:
                with self.peak() as peak, self.fp16_on_cpu(precision == "16-mixed"):
                    rc, last, secs, run_dir = self.run(args + [f"fabric.precision={precision}"],
                                                       self.name(f"{method}-{precision}"))
                peaks.append(peak[0])
                value = read_final(run_dir, headline) if rc == 0 else None
                loss = read_final(run_dir, "train/loss") if rc == 0 else None
                results[precision] = (rc, last, secs, value, loss)
                ok &= rc == 0 and value is not None and loss is not None
            ref, ref_loss = results["32-true"][3:]
            parts = []
            for precision, (rc, last, secs, value, loss) in results.items():
                if rc != 0 or value is None or loss is None:
                    why = f"exit {rc}: {last}" if rc != 0 else f"no finite {headline} or train/loss"
                    parts.append(f"{precision}: FAILED ({why})")
                elif precision == "32-true" or ref is None or ref_loss is None:
                    parts.append(f"{precision}: {value:.4f}, train/loss {loss:.4f} ({secs:.0f} s)")
                else:
                    parts.append(f"{precision}: {value:.4f} ({value - ref:+.4f}), train/loss {loss - ref_loss:+.2g} "
                                 f"({secs:.0f} s)")
            self.add("precision", f"{method} ({conf}{' tiny' if self.device == 'cpu' else ''}), {headline}",
                     "; ".join(parts),
                     "exit 0, finite, near 32-true", ok, "/".join(p for p in peaks if p))
        left = sorted(set(registry.METHODS) - set(methods))
        if left:
            self.na("precision", f"the other {len(left)} methods", f"not run: --methods {' '.join(left)} adds them "
                    "(every method is the default on cuda)")

    @contextlib.contextmanager
    def fp16_on_cpu(self, on: bool):
        """On a CPU, Fabric runs precision=16-mixed as bf16-mixed; give it fp16 autocast and a loss scaler instead."""
        if not on or self.device != "cpu":
            yield
            return
        from lightning.fabric import Fabric
        from lightning.fabric.plugins.precision import MixedPrecision

        original = fl.run.train.make_fabric

        def fp16_fabric(cfg, callbacks, loggers):
            f = cfg.fabric
            return Fabric(accelerator="cpu", devices=f.devices, strategy=f.strategy, num_nodes=f.num_nodes,
                          callbacks=callbacks, loggers=loggers,
                          plugins=[MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))])

        fl.run.train.make_fabric = fp16_fabric
        try:
            yield
        finally:
            fl.run.train.make_fabric = original

    # ---- syncs ----------------------------------------------------------------------------------------------
    def syncs(self, methods: list[str]) -> None:
        for method in [m for m in SYNC_METHODS if m in methods]:
            if self.device != "cuda":
                self.na("syncs", f"{method} (quickstart): host syncs per training step",
                        "n/a on cpu: torch.cuda.set_sync_debug_mode watches CUDA streams only", "0")
                continue
            counter = SyncCounter()
            with self.peak() as peak, counter:
                rc, last, secs, _ = self.run([f"method.name={method}", *NEEDS.get(method, []), *self.scale.quick],
                                             self.name(f"syncs-{method}"))
            if rc != 0:
                self.add("syncs", f"{method} (quickstart)", f"FAILED (exit {rc}: {last})", "0", False, peak[0])
                continue
            per_step = counter.syncs / max(counter.steps, 1)
            where = ", ".join(f"{loc} ({n})" for loc, n in counter.where.most_common(3))
            self.add("syncs", f"{method} (quickstart): host syncs per training step, rounds >= 1",
                     f"{per_step:.2f} ({counter.syncs} in {counter.steps} steps){'; ' + where if where else ''}",
                     "0", counter.syncs == 0, peak[0])

    # ---- determinism ----------------------------------------------------------------------------------------
    def determinism(self) -> None:
        args = ["conf=quickstart", *self.scale.quick]
        runs = {}
        for label, flag in (("a", "true"), ("b", "true"), ("off", "false")):
            with self.peak() as peak:
                rc, last, secs, run_dir = self.run(args + [f"fabric.deterministic={flag}"],
                                                   self.name(f"deterministic-{label}"))
            runs[label] = (rc, last, secs, run_dir, peak[0])
        (rc_a, last_a, secs_a, dir_a, peak_a), (rc_b, _, secs_b, dir_b, _) = runs["a"], runs["b"]
        if rc_a or rc_b:
            self.add("determinism", "quickstart twice, fabric.deterministic=true", f"FAILED (exit {rc_a}/{rc_b}: "
                     f"{last_a})", "bitwise equal", False, peak_a)
        else:
            same, detail = same_run(dir_a, dir_b)
            self.add("determinism", "quickstart twice, fabric.deterministic=true",
                     "bitwise equal" if same else f"differ: {detail}", "bitwise equal", same, peak_a)
        rc_off, _, secs_off, dir_off, peak_off = runs["off"]
        if rc_off == 0 and rc_a == 0:
            same, detail = same_run(dir_a, dir_off)
            self.add("determinism", "its cost: the same run with fabric.deterministic=false",
                     f"{secs_off:.1f} s against {min(secs_a, secs_b):.1f} s deterministic; its numbers "
                     f"{'bitwise equal' if same else 'differ: ' + detail}", "", None, peak_off)
        if self.device == "cuda" and torch.cuda.device_count() < 2:
            self.na("determinism", "1 vs 2 GPUs, fabric.deterministic=true",
                    f"n/a: needs 2 GPUs, {torch.cuda.device_count()} visible", "bitwise equal")
            return
        devices = "GPUs" if self.device == "cuda" else "processes (gloo)"
        # the 1-device side is run a above (fabric.devices=1 is the default)
        rc2, last2, two = self.run_processes(args + ["fabric.deterministic=true"], self.name("devices-2"), 2)
        if rc_a or rc2:
            self.add("determinism", f"1 vs 2 {devices}", f"FAILED (exit {rc_a}/{rc2}: {last_a or last2})",
                     "bitwise equal", False)
        else:
            same, detail = same_run(dir_a, two)
            self.add("determinism", f"1 vs 2 {devices}, fabric.deterministic=true",
                     "bitwise equal" if same else f"differ: {detail}", "bitwise equal", same)

    # ---- compile --------------------------------------------------------------------------------------------
    def compile(self) -> None:
        from torch._dynamo.utils import counters

        args = ["conf=quickstart", "trainer.parallel_clients=8", *self.scale.quick]
        with self.peak() as peak:
            rc_e, last_e, secs_e, eager = self.run(args, self.name("k8-eager"))
        torch.compiler.reset()
        counters.clear()
        with self.peak() as peak_c:
            rc, last, secs, compiled = self.run(args + ["trainer.compile=true",
                                                        f"trainer.compile_backend={self.scale.backend}"],
                                                self.name("k8-compiled"))
        case = f"quickstart, parallel_clients=8 compile=true ({self.scale.backend})"
        if rc or rc_e:
            self.add("compile", case, f"FAILED (exit {rc}/{rc_e}: "
                     f"{last or last_e})", "1 graph, 0 breaks", False, peak_c[0])
            return
        graphs = counters["stats"]["unique_graphs"]
        breaks = sum(counters["graph_break"].values())
        same, detail = same_run(eager, compiled, atol=1e-4)
        self.add("compile", case,
                 f"{graphs} graph(s) ({max(graphs - 1, 0)} recompiles), {breaks} graph breaks; {secs:.0f} s against "
                 f"{secs_e:.0f} s uncompiled (compilation included); metrics "
                 f"{'within 1e-4 of' if same else 'differ from'} uncompiled{'' if same else ': ' + detail}",
                 "1 graph, 0 breaks", graphs == 1 and breaks == 0 and same, f"{peak_c[0]} ({peak[0]} eager)")

    # ---- throughput -----------------------------------------------------------------------------------------
    def throughput(self) -> None:
        t = self.scale.throughput
        a = SimpleNamespace(device=self.device, data_root=str(self.workdir / "data"), **t)
        model = client_throughput.MODELS["quickstart cnn"]
        loops = [("sequential (fl)", 1)] + [(f"K = {k} vmapped", k) for k in t["ks"]] + [("PFLlib-style", None)]
        base = None
        for label, k in loops:
            with self.peak() as peak, contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                orch = client_throughput.orchestrator(client_throughput.config(a, model, k or 1),
                                                      self.workdir / self.name(f"throughput-{k}"))
                times = (client_throughput.framework_rounds(orch, a) if k else client_throughput.pfllib_rounds(orch, a))
            rate = a.clients / sorted(times)[len(times) // 2]
            base = base or rate
            self.add("throughput", f"FedAvg client-updates/s, quickstart cnn, {a.clients} clients x {a.samples} "
                     f"samples, batch {a.batch}: {label}", f"{rate:.1f} ({rate / base:.2f}x sequential)", "", None,
                     peak[0])

    # ---- the table ------------------------------------------------------------------------------------------
    def table(self) -> str:
        lines = ["| part | case | result | target | ok | peak GPU MiB |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            ok = {True: "yes", False: "**no**", None: ""}[r.ok]
            lines.append(f"| {r.part} | {r.case} | {r.result} | {r.target} | {ok} | {r.peak} |")
        return "\n".join(lines)


class SyncCounter:
    """Counts the 'synchronizing CUDA operation' warnings of torch.cuda.set_sync_debug_mode('warn') raised inside
    local training steps (between one batch's index draw and the next) of rounds >= 1, and the fl/ lines that
    raise them."""

    def __init__(self):
        self.syncs = self.steps = 0
        self.where: Counter = Counter()
        self.round, self.in_step = 0, False

    def __enter__(self):
        import fl.core.client
        import fl.core.loop

        self._stack = contextlib.ExitStack()
        self._warnings = self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("always")
        self._show = warnings.showwarning
        warnings.showwarning = self.on_warning
        original_indices, original_round = fl.core.client.batch_indices, fl.core.loop.Orchestrator.run_round
        counter = self

        def batch_indices(*args, **kwargs):
            for item in original_indices(*args, **kwargs):
                counter.in_step = item[1] is not None and counter.round >= 1
                counter.steps += counter.in_step
                yield item
                counter.in_step = False

        def run_round(orch, rnd):
            counter.round = rnd
            return original_round(orch, rnd)

        fl.core.client.batch_indices, fl.core.loop.Orchestrator.run_round = batch_indices, run_round
        self._stack.callback(setattr, fl.core.client, "batch_indices", original_indices)
        self._stack.callback(setattr, fl.core.loop.Orchestrator, "run_round", original_round)
        torch.cuda.set_sync_debug_mode("warn")
        self._stack.callback(torch.cuda.set_sync_debug_mode, "default")
        return self

    def on_warning(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message) or not self.in_step:
            return
        self.syncs += 1
        frames = [f for f in traceback.extract_stack()[:-1] if "/fl/" in f.filename]
        if frames:
            f = frames[-1]
            self.where[f"{Path(f.filename).relative_to(ROOT)}:{f.lineno}"] += 1

    def __exit__(self, *exc):
        warnings.showwarning = self._show
        self._stack.close()
        return False


def synthetic_twins() -> dict[str, tuple[str, list[str]]]:
    """method -> (config, extra overrides): the smallest synthetic twin of each method (fewest training samples in
    the pool, then name; the quickstart for FedAvg)."""
    sizes: dict[str, tuple[int, str]] = {}
    for conf in available_confs():
        if conf.endswith("_synthetic") or conf.endswith("_embedded"):
            cfg = load_config([f"conf={conf}"])
            e = cfg.data.get("embedded")  # a generated dataset without it (fedpals_synthetic) counts as largest
            pool = float("inf") if e is None else e.samples_per_class * e.num_classes * (
                e.num_domains if cfg.data.name == "embedded_domains" else 1)
            sizes[cfg.method.name] = min(sizes.get(cfg.method.name, (pool, conf)), (pool, conf))
    return {"fedavg": ("quickstart", []), **{m: (conf, []) for m, (_, conf) in sizes.items() if m != "fedavg"},
            "fedct": (sizes["fedmosaic"][1], ["method.name=fedct"]),  # FedMosaic's baseline needs its public set
            "fedavg_mixup": (sizes["fedacd"][1], ["method.name=fedavg_mixup"])}  # FedACD's Table 5 baseline


def read_final(run_dir: Path, key: str) -> float | None:
    """The run's final value of `key` (summary.json), None when missing or not finite."""
    try:
        value = json.loads((run_dir / "summary.json").read_text())["final"][key]
    except (OSError, KeyError, ValueError):
        return None
    return value if isinstance(value, (int, float)) and abs(value) < float("inf") else None


def same_run(a: Path, b: Path, atol: float = 0.0) -> tuple[bool, str]:
    """Whether two runs logged the same metrics (time/* aside) and hold the same global model and client states:
    bitwise (atol 0) or within atol; and where they first differ."""
    rows = [[{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
             for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (a, b)]
    if [r.keys() for r in rows[0]] != [r.keys() for r in rows[1]]:
        return False, "different metric keys"
    for ra, rb in zip(*rows):
        for k in ra:
            if abs(ra[k] - rb[k]) > atol:
                return False, f"{k} at round {ra['round']}: {ra[k]!r} vs {rb[k]!r}"
    ckpts = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=False) for d in (a, b)]
    tensors = [flat(c["server"]["global_params"], "global/") | flat(c["clients"], "clients/") for c in ckpts]
    if tensors[0].keys() != tensors[1].keys():
        return False, "different tensors in the checkpoints"
    for k, va in tensors[0].items():
        vb = tensors[1][k]
        if va.shape != vb.shape:
            return False, f"{k}: shapes {tuple(va.shape)} vs {tuple(vb.shape)}"
        if not (torch.equal(va, vb) if atol == 0 else torch.allclose(va, vb, rtol=0, atol=atol)):
            return False, f"{k}: max |diff| {float((va.double() - vb.double()).abs().max()):.3g}"
    return True, ""


def flat(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    """The floating-point tensors of a nested dict, by path."""
    if torch.is_tensor(tree):
        return {prefix: tree} if tree.is_floating_point() else {}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}/").items()}
    return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True, choices=["cuda", "cpu"])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--methods", nargs="+", default=None, help="the methods of the precision and syncs parts "
                   f"(default: every registered method; on a CPU {' '.join(SEED_METHODS)})")
    p.add_argument("--keep", default=None, help="write the runs under this directory and keep them")
    a = p.parse_args(argv)
    registry.load_plugins()
    for name in ("lightning", "lightning.fabric"):  # "Using bfloat16 AMP" at every run: the table says it
        logging.getLogger(name).setLevel(logging.WARNING)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device; --device cpu runs the dry run", file=sys.stderr)
        return 2
    methods = a.methods or (sorted(registry.METHODS) if a.device == "cuda" else SEED_METHODS)
    unknown = sorted(set(methods) - set(registry.METHODS))
    if unknown:
        print(f"error: --methods {' '.join(unknown)}: not registered; choices: {', '.join(sorted(registry.METHODS))}",
              file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        workdir = Path(a.keep) if a.keep else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir.mkdir(parents=True, exist_ok=True)
        smoke = Smoke(a.device, workdir.resolve())
        device = torch.cuda.get_device_name() if a.device == "cuda" else f"CPU, {os.cpu_count()} cores"
        print(f"gpu_smoke on {device}; torch {torch.__version__}; parts: {' '.join(a.parts)}", file=sys.stderr)
        start = time.perf_counter()
        for part in a.parts:
            print(f"  {part} ...", file=sys.stderr, flush=True)
            if part in ("precision", "syncs"):
                getattr(smoke, part)(methods)
            else:
                getattr(smoke, part)()
        print(smoke.table())
        print(f"\n{len(smoke.rows)} rows in {time.perf_counter() - start:.0f} s on {device}", file=sys.stderr)
    return 1 if any(r.ok is False for r in smoke.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
