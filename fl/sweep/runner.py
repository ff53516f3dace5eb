"""Run a W&B sweep file offline, or write one from a method's declared search ranges.

    python -m fl.sweep sweeps/X.yaml [--seeds 0,1,2] [--parallel N] [--count N] [--out DIR] [key=value ...]
    python -m fl.sweep --make conf=NAME params=method.lam[,method.mu] [out=FILE] [method=grid|random|bayes]
                       [metric=KEY] [goal=maximize|minimize] [seeds=0,1,2] [run_cap=N] [key=value ...]

Each point x seed is one `python -m fl.train` run in <out>/<sweep name>/<point>-s<seed>/ (default out:
outputs/sweeps). A run is finished when its directory has summary.json; running the same command again
reuses finished runs, resumes a run that has a checkpoint, and restarts one that died before its first
checkpoint; a directory made with another resolved config stops the sweep (exit 2) rather than mixing.
Extra key=value arguments go to every run (e.g. trainer.rounds=5). The seeds are the file's
`seed` parameter values, or --seeds (which replaces them), or the config's own seed. At the end it prints
each point's metric (mean ± std over seeds) and the best point by the file's metric and goal, and writes
<sweep dir>/sweep.json. Exit codes: 0 all runs finished, 1 some run failed, 2 a bad sweep file or
parameter (before anything runs), 130 interrupted.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml
from omegaconf import OmegaConf

from fl.config import ConfigError, load_config
from fl.report.aliases import current_names
from fl.report.runs import flatten
from fl.run.cpu_threads import env_for_one_of
from fl.sweep import warm_worker
from fl.sweep.run_lock import release, try_lock
from fl.sweep.spec import Sweep, check_metric, expand, grid_values, load_sweep, make_sweep, point_args


@dataclass
class Job:
    point_id: str
    point: dict
    seed: Optional[int]
    run_dir: Path
    config: dict = field(default_factory=dict)  # the resolved config it runs, flattened (logger.* left out)
    seconds: Optional[float] = None  # wall time of its run in this invocation (None: reused, or not run)
    cpu_seconds: Optional[float] = None  # the CPU time its process used (user + system): unlike the wall time, it
                                         # does not grow when other work shares the CPU
    sweep: Optional[Sweep] = None    # the sweep and the extra arguments it runs with (plan_points sets them), so
    extra: Optional[list[str]] = None  # jobs of several sweeps run in one queue (fl.reproduce)

    @property
    def finished(self) -> bool:
        """summary.json is written at the end, and when a run stops because it diverged: rerunning it would
        diverge again. A damaged one (`damage`) is not finished: it is run again, not counted as reused."""
        return (self.run_dir / "summary.json").is_file() and self.damage is None

    @property
    def damage(self) -> Optional[str]:
        """Why a directory holding summary.json cannot be reused (None: it can, or it holds no summary): a report
        would skip it, and its cell would silently count one run fewer."""
        summary = self.run_dir / "summary.json"
        if not summary.is_file():
            return None
        if not (self.run_dir / "config.yaml").is_file():
            return "it has summary.json but no config.yaml"
        try:
            content = json.loads(summary.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as err:
            return f"its summary.json cannot be read ({type(err).__name__})"
        return None if isinstance(content, dict) else "its summary.json is not a JSON object"

    @property
    def diverged(self) -> bool:
        return self.finished and "diverged" in json.loads((self.run_dir / "summary.json").read_text())


def point_id(index: int, point: dict) -> str:
    """p<index>-<short readable values>-<hash>: stable for the same point, distinct for different ones."""
    slug = "_".join(f"{k.split('.')[-1]}{v}" for k, v in point.items())
    slug = re.sub(r"[^A-Za-z0-9._+-]", "", slug)[:40]
    digest = hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"p{index:03d}-{slug}-{digest}" if slug else f"p{index:03d}-{digest}"


def sweep_seeds(sweep: Sweep, requested: Optional[list[int]]) -> tuple[list[Optional[int]], Optional[str]]:
    if requested:
        note = "--seeds replaces the file's seed values" if "seed" in sweep.params else None
        return list(requested), note
    if "seed" in sweep.params:
        return [int(s) for s in grid_values("seed", sweep.params["seed"])], None
    return [None], None


def train_argv(sweep: Sweep, job: Job, extra: list[str]) -> list[str]:
    """The run's fl.train arguments. Its progress stays on: written to the run's log file (not a terminal), it is
    one plain line per evaluation round, so `tail -f logs/<run>.log` follows the run."""
    if job.damage is not None:  # kept beside it, as it was, and run again from the start
        aside = next(p for i in range(1, 10**6) if not (p := job.run_dir.with_name(f"{job.run_dir.name}.damaged{i}"))
                     .exists())
        print(f"warning: {job.run_dir}: {job.damage}; moved to {aside.name} and run again", file=sys.stderr,
              flush=True)
        job.run_dir.rename(aside)
    if (job.run_dir / "checkpoints" / "last.ckpt").is_file():  # died mid-run: continue from its checkpoint
        return [f"resume={job.run_dir}", *[a for a in extra if a.startswith(("logger.", "fabric."))]]
    if job.run_dir.exists():  # died before its first checkpoint: start it again
        shutil.rmtree(job.run_dir)
    return [*sweep.point_argv(job.point), *([f"seed={job.seed}"] if job.seed is not None else []),
            *extra, f"logger.output_dir={job.run_dir.parent}", f"logger.run_name={job.run_dir.name}",
            f"logger.wandb.group=sweep-{sweep.name}"]


def run_jobs(sweep: Optional[Sweep], jobs: list[Job], extra: list[str], parallel: int) -> list[Job]:
    """Runs the unfinished jobs, `parallel` at a time (each with its own sweep and extra arguments where
    plan_points set them, else `sweep` and `extra`); returns the ones that failed. A run another invocation is
    training (it holds the run's lock, fl/sweep/run_lock.py) is waited for, then reused. A run on one process goes to a
    warm worker (fl/sweep/warm_worker.py: imports paid once per worker; FL_FRESH_PROCESSES=1 starts each run as its
    own process instead), a run on several processes is its own `python -m fl.train`."""
    todo = [j for j in jobs if not j.finished]
    done = len(jobs) - len(todo)
    if done:
        names = ", ".join(j.run_dir.name for j in jobs if j.finished)
        print(f"reusing {done} of {len(jobs)} runs, finished earlier with the same config: {names}; "
              f"{len(todo)} to go")
    folders = list(dict.fromkeys(j.run_dir.parent / "logs" for j in jobs))
    for logs in folders:
        logs.mkdir(parents=True, exist_ok=True)
    running: list[tuple[Job, object, float, Optional[int]]] = []  # (job, its Popen or Worker, start, lock)
    idle: list[warm_worker.Worker] = []
    failed, waiting = [], set()
    # each run's share of the cores, OpenMP threads that sleep at barriers (fl/run/cpu_threads.py); stdout and stderr
    # reach the log in the order they were written
    env = {**env_for_one_of(min(parallel, max(1, len(todo)))), "PYTHONUNBUFFERED": "1"}
    env.pop("FL_RUN_DIR", None)
    warm = warm_worker.available() and os.environ.get("FL_FRESH_PROCESSES", "") in ("", "0")
    if todo:
        shown = str(folders[0]) if len(folders) == 1 else "<sweep dir>/logs"
        print(f"each run's output: {shown}/<run>.log (one line per evaluation round; tail -f to follow)", flush=True)
    try:
        while todo or running:
            for job in list(todo):
                if len(running) >= parallel:
                    break
                lock = try_lock(job.run_dir)
                if lock is None:  # another invocation is training it
                    if job.run_dir not in waiting:
                        waiting.add(job.run_dir)
                        print(f"waiting for {job.run_dir.name}: another invocation is running it", flush=True)
                    continue
                todo.remove(job)
                if job.finished:  # finished by the other invocation while this one waited
                    release(lock)
                    done += 1
                    print(f"[{done}/{len(jobs)}] {job.run_dir.name} finished by another invocation; reused",
                          flush=True)
                    continue
                log_file = job.run_dir.parent / "logs" / f"{job.run_dir.name}.log"
                argv = train_argv(job.sweep or sweep, job, job.extra if job.extra is not None else extra)
                in_warm = warm and warm_worker.single_process(job.config)
                with log_file.open("w") as log:
                    log.write(" ".join([sys.executable, "-m", "fl.train", *argv])
                              + ("  (in a warm process: fl/sweep/warm_worker.py)\n" if in_warm else "\n"))
                if in_warm:
                    worker = idle.pop() if idle else warm_worker.Worker(env)
                    worker.start(argv, log_file)
                    handle: object = worker
                else:
                    with log_file.open("a") as log:
                        handle = subprocess.Popen([sys.executable, "-m", "fl.train", *argv], stdout=log,
                                                  stderr=subprocess.STDOUT, env=env)
                running.append((job, handle, time.time(), lock))
            time.sleep(0.2 if running else 1.0)
            for item in list(running):
                job, handle, start, lock = item
                code = _ended(job, handle)
                if code is None:
                    continue
                running.remove(item)
                if isinstance(handle, warm_worker.Worker):
                    if code == 0 and handle.alive:
                        idle.append(handle)
                    else:
                        handle.close()
                release(lock)
                done += 1
                job.seconds = time.time() - start
                status = "done" if code == 0 and job.finished else f"FAILED (exit {code})"
                metric = (job.sweep or sweep).metric
                value = _metric_value(job, metric)
                shown = f" {metric}={value:.4f}" if value is not None else ""
                log_file = job.run_dir.parent / "logs" / f"{job.run_dir.name}.log"
                print(f"[{done}/{len(jobs)}] {job.run_dir.name} {status}{shown} ({job.seconds:.0f} s)"
                      + ("" if status == "done" else f"; log: {log_file}"), flush=True)
                if status != "done":
                    failed.append(job)
    except KeyboardInterrupt:
        for _, handle, _, _ in running:
            handle.terminate()
        for _, handle, _, lock in running:
            handle.wait() if isinstance(handle, subprocess.Popen) else handle.close()
            release(lock)
        raise
    finally:
        for worker in idle:
            worker.close()
    return failed


def _ended(job: Job, handle) -> Optional[int]:
    """The run's exit code once it ended (None while it runs); its CPU time goes to the job."""
    if isinstance(handle, warm_worker.Worker):
        result = handle.result()
        if result is None:
            return None
        code, job.cpu_seconds = result
        return code
    return handle.returncode if _reaped(job, handle) else None


def _reaped(job: Job, proc: subprocess.Popen) -> bool:
    """Whether the run's process ended; where the OS reports it (wait4), the CPU time it used goes to the job."""
    if not hasattr(os, "wait4"):
        return proc.poll() is not None
    if proc.returncode is not None:
        return True
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere
        return proc.poll() is not None
    if pid == 0:
        return False
    proc.returncode = os.waitstatus_to_exitcode(status)
    job.cpu_seconds = usage.ru_utime + usage.ru_stime
    return True


def test_counterpart(metric: Optional[str]) -> Optional[str]:
    """The test metric a validation metric selects for: val/X -> test/X."""
    return "test/" + metric[len("val/"):] if metric and metric.startswith("val/") else None


def _metric_value(job: Job, metric: Optional[str]) -> Optional[float]:
    """The value W&B's sweep reads: the run's last logged value of the metric (summary.json's final; a run finished
    before a metric was renamed is read under its new name); None for a run that diverged (trainer.on_divergence): its
    last value is not a result."""
    if metric is None or not job.finished or job.diverged:
        return None
    return current_names(json.loads((job.run_dir / "summary.json").read_text())["final"]).get(metric)


def results(sweep: Sweep, jobs: list[Job]) -> list[dict]:
    by_point: dict[str, dict] = {}
    for job in jobs:
        entry = by_point.setdefault(job.point_id, {"point": job.point_id, "params": job.point, "values": [],
                                                   "test_values": [], "runs": []})
        entry["runs"].append(str(job.run_dir))
        entry.setdefault("diverged", []).extend([str(job.run_dir)] if job.diverged else [])
        for key, metric in (("values", sweep.metric), ("test_values", test_counterpart(sweep.metric))):
            value = _metric_value(job, metric)
            if value is not None:
                entry[key].append(value)
    for entry in by_point.values():
        for key, prefix in (("values", ""), ("test_values", "test_")):
            v = entry[key]
            entry[prefix + "mean"] = statistics.mean(v) if v else None
            entry[prefix + "std"] = statistics.stdev(v) if len(v) > 1 else 0.0 if v else None
    return list(by_point.values())


def best_point(sweep: Sweep, table: list[dict]) -> Optional[dict]:
    scored = [e for e in table if e["mean"] is not None]
    if not scored or sweep.metric is None:
        return None
    pick = max if sweep.goal == "maximize" else min
    return pick(scored, key=lambda e: e["mean"])


def print_results(sweep: Sweep, table: list[dict], seeds: list) -> None:
    if sweep.metric is None:
        print("the sweep file has no metric; no best point chosen")
        return
    test = test_counterpart(sweep.metric)
    shown = f"; {test} beside it" if test else ""
    print(f"\n{sweep.metric} (final value; mean ± std over seeds {seeds}), goal: {sweep.goal}{shown}")

    def beside(e: dict) -> str:
        return f"  {test}={e['test_mean']:.4f} ± {e['test_std']:.4f}" if test and e["test_mean"] is not None else ""

    for e in table:
        params = " ".join(point_args(e["params"])) or "(no parameters)"
        diverged = f"  ({len(e['diverged'])} diverged, left out)" if e.get("diverged") else ""
        if e["mean"] is None:
            print(f"  {e['point']:<40} {params:<40} no finished run" + (diverged and " that did not diverge"))
        else:
            print(f"  {e['point']:<40} {params:<40} {e['mean']:.4f} ± {e['std']:.4f}  (n={len(e['values'])})"
                  + beside(e) + diverged)
    best = best_point(sweep, table)
    if best is not None:
        print(f"best: {' '.join(point_args(best['params']))}  {sweep.metric}={best['mean']:.4f} ± {best['std']:.4f}"
              + beside(best))


def _seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds={text!r}: expected comma-separated integers, e.g. 0,1,2") from None


def make_main(argv: list[str]) -> int:
    opts, overrides = {}, []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and "." in key:  # a config key (method.name=fedprox): a fixed argument of the sweep's command
            overrides.append(arg)
            continue
        if not sep or key not in ("conf", "params", "out", "method", "metric", "goal", "seeds", "run_cap"):
            raise ConfigError(f"--make: argument {arg!r} is not one of conf=, params=, out=, method=, metric=, "
                              "goal=, seeds=, run_cap=, or a config key=value (method.name=fedprox)")
        opts[key] = value
    if "conf" not in opts or "params" not in opts:
        raise ConfigError("--make needs conf=NAME and params=method.X[,method.Y]")
    if opts.get("method", "grid") not in ("grid", "random", "bayes"):
        raise ConfigError(f"method={opts['method']!r} is not valid; choices: bayes, grid, random")
    doc = make_sweep(opts["conf"], opts["params"].split(","), opts.get("method"),
                     opts.get("metric"), opts.get("goal"),
                     _seed_list(opts["seeds"]) if "seeds" in opts else None, int(opts.get("run_cap", 20)), overrides)
    text = (f"# W&B sweep over {opts['params']} of {' '.join(['conf=' + opts['conf'], *overrides])} (ranges declared "
            "in the method's config).\n"
            f"# Online: wandb sweep FILE, then wandb agent <id>. Offline: python -m fl.sweep FILE\n"
            + yaml.safe_dump(doc, sort_keys=False))
    out = opts.get("out")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}")
    else:
        print(text, end="")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "--make":
            return make_main(argv[1:])
        usage = __doc__.split("\n\n")[1]  # the module docstring's two commands: a sweep file, and --make
        p = argparse.ArgumentParser(prog="python -m fl.sweep", description=__doc__.split("\n\n")[0],
                                    formatter_class=argparse.RawDescriptionHelpFormatter,
                                    epilog="write a sweep file from a method's declared search ranges:\n"
                                    + usage[usage.index("    python -m fl.sweep --make"):])
        p.add_argument("file")
        p.add_argument("overrides", nargs="*", help="key=value passed to every run")
        p.add_argument("--seeds", help="comma-separated seeds; each point runs once per seed")
        p.add_argument("--parallel", type=int, default=1, help="runs at once (subprocesses)")
        p.add_argument("--count", type=int, help="random / bayes: number of points (default: the file's run_cap)")
        p.add_argument("--sweep-seed", type=int, default=0, help="seed of the random expansion")
        p.add_argument("--out", default="outputs/sweeps", help="the sweep's directory is OUT/<sweep name>")
        p.add_argument("--dry-run", action="store_true", help="print the runs and stop")
        args = p.parse_intermixed_args(argv)
        if args.parallel < 1 or (args.count is not None and args.count < 1):
            raise ConfigError("--parallel and --count must be >= 1")
        sweep = load_sweep(args.file)
        for note in sweep.notes:
            print(f"note: {note}")
        seeds, note = sweep_seeds(sweep, _seed_list(args.seeds) if args.seeds else None)
        if note:
            print(f"note: {note}")
        out = Path(args.out) / sweep.name
        bad = [a for a in args.overrides if "=" not in a]
        if bad:
            raise ConfigError(f"argument {bad[0]!r} is not key=value")
        sweep_points = expand(sweep, count=args.count, seed=args.sweep_seed)
        jobs = plan_points(sweep, sweep_points, out, seeds, args.overrides)
        check_reuse(jobs)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"sweep {sweep.name}: {sweep.requested_method} over {', '.join(k for k in sweep.params if k != 'seed')}"
          f"; {len(jobs) // len(seeds)} points x {len(seeds)} seeds = {len(jobs)} runs in {out}")
    seeded = " seed=<seed>" if seeds != [None] else ""
    print(f"each run: python -m fl.train {' '.join(sweep.fixed_args)} <the point's parameters>{seeded} "
          f"{' '.join(args.overrides)}".rstrip())  # the overrides after the point's: they win, as in train_argv
    if args.dry_run:
        for job in jobs:
            print(f"  {job.run_dir.name}  {' '.join(point_args(job.point))}  {'(finished)' if job.finished else ''}")
        return 0
    try:
        failed = run_jobs(sweep, jobs, args.overrides, args.parallel)
    except KeyboardInterrupt:
        print("\ninterrupted; run the same command again to continue", file=sys.stderr)
        return 130
    table = results(sweep, jobs)
    manifest = {"name": sweep.name, "file": str(Path(args.file)), "method": sweep.requested_method,
                "metric": sweep.metric, "goal": sweep.goal, "seeds": seeds, "overrides": args.overrides,
                "points": table, "best": best_point(sweep, table)}
    (out / "sweep.json").write_text(json.dumps(manifest, indent=2, default=str))
    print_results(sweep, table, seeds)
    print(f"\nSweep directory: {out}  (compare: python -m fl.report {out})")
    return 1 if failed else 0


def plan_points(sweep: Sweep, points: list[dict], out: Path, seeds: list, extra: list[str],
                indices: Optional[list[int]] = None) -> list[Job]:
    """Every (point, seed) run, each checked by fl.config before anything runs. `indices`: the points' places in the
    sweep's whole expansion (a subset keeps the run names the whole sweep gives them); default their order here."""
    jobs = []
    for i, point in zip(indices or range(len(points)), points):
        pid = point_id(i, point)
        for seed in seeds:
            argv = sweep.point_argv(point) + ([f"seed={seed}"] if seed is not None else []) + extra
            try:
                cfg = load_config(argv + ["logger.wandb.mode=disabled"])
                check_metric(sweep.metric, sweep.goal, cfg, "the sweep's ")
            except ConfigError as err:
                raise ConfigError(f"point {pid} ({' '.join(point_args(point))}): {err}") from None
            jobs.append(Job(pid, point, seed, out / f"{pid}-s{cfg.seed}", comparable(OmegaConf.to_container(cfg)),
                            sweep=sweep, extra=list(extra)))
    return jobs


def comparable(config: dict) -> dict:
    """The keys that decide a run's numbers: everything but logging and the resume pointer."""
    return {k: v for k, v in flatten(config).items() if not k.startswith("logger.") and k != "resume"}


def read_saved_config(path: Path) -> dict:
    """A run directory's config.yaml as comparable keys; ConfigError in one line when it cannot be read: a run whose
    config is unknown can be neither reused nor compared, and deleting it is the user's call."""
    try:
        saved = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:  # YAML's and OmegaConf's errors alike
        first = (f"{err.problem}, line {err.problem_mark.line + 1}"
                 if isinstance(err, yaml.MarkedYAMLError) and err.problem and err.problem_mark else
                 (str(err).strip().splitlines() or [type(err).__name__])[0])
        raise ConfigError(f"{path} cannot be read ({first}), so its run can be neither reused nor compared: delete "
                          f"{path.parent} to run it again, or use another --out") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} is not a mapping of config keys, so its run can be neither reused nor compared: "
                          f"delete {path.parent} to run it again, or use another --out")
    return comparable(saved)


def check_reuse(jobs: list[Job]) -> None:
    """The jobs whose directories already hold a run (finished or not) made with the same resolved config; a
    directory made with another config (say trainer.rounds=3 for a smoke test) stops the sweep in one line
    rather than having its numbers reported as this sweep's. Keys the saved config lacks (written by an older
    framework) are not compared."""
    for job in jobs:
        saved_file = job.run_dir / "config.yaml"
        if not saved_file.is_file():
            continue
        saved = read_saved_config(saved_file)
        for key in sorted(saved.keys() & job.config.keys()):
            if saved[key] != job.config[key]:
                raise ConfigError(f"{job.run_dir} was run with {key}={saved[key]!r}, this sweep asks for "
                                  f"{key}={job.config[key]!r}; use another --out (or delete that directory) "
                                  "rather than mix the two")

