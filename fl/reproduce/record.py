"""What a reproduction writes beside its Markdown: reproduce.json, the record `--check` re-runs from, and
timings.json.

reproduce.json holds the cells and verdicts, and the record of every run: its fl.train overrides and seed, a hash of
its resolved config, its status, its seconds, the value of each cell it was selected for (in the paper's units) and
its final metrics as summary.json has them; and the provenance: the commit (git rev-parse HEAD, and whether the
tree had changes other than published outputs and timings), the versions of the packages the numbers depend on,
Python, the machine, torch's CPU capability and the CPU (its model and the instruction sets kernels are chosen by).
bench/reproduce/PAPER.json is this file of the committed output (bench/reproduce_budget.py --publish copies it
there)."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

from fl.reproduce.paper import ROOT
from fl.reproduce.plan import DOUBLED, Plan

PACKAGES = ("torch", "lightning", "numpy", "omegaconf", "PyYAML", "torchvision", "torchmetrics", "cvxpy", "scipy")


def run_key(run_dir: Path) -> str:
    """<sweep folder>/<run>: a run's name in a record, timings.json and twin_seconds.json (a point's, less -s<seed>)."""
    return f"{run_dir.parent.name}/{run_dir.name}"


def config_hash(config: dict) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def run_argv(job) -> list[str]:
    """The run's fl.train overrides (those of its point, its seed, then every run's and its column's)."""
    return [*job.sweep.point_argv(job.point), *([f"seed={job.seed}"] if job.seed is not None else []), *job.extra]


def deciding(argv: list[str]) -> list[str]:
    """The overrides that can decide a run's numbers: all but logger.* (where its files go, what it draws), as the
    reuse check compares configs (fl.sweep.runner.comparable)."""
    return [a for a in argv if not str(a).startswith("logger.")]


def _git(*args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


# What a reproduction writes or times, not what its runs read: published outputs beside the tree's code do not make
# it differ from its commit (bench/reproduce_budget.py publishes each paper as it ends, before the next renders).
NOT_INPUTS = ("bench/reproduce", "fl/reproduce/twin_seconds.json")


# The instruction sets by which torch and its libraries (oneDNN, MKL) pick their float kernels: two CPUs that agree on
# these and on torch's capability run the same kernels (docs/reproduce.md, "The record and --check")
KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_info() -> dict:
    """The CPU's model name and which of KERNEL_FLAGS it has (Linux's /proc/cpuinfo; elsewhere the platform's processor
    string and no flags)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or None, "flags": None}
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    have = set(fields.get("flags", "").split())
    return {"model": fields.get("model name"), "flags": [f for f in KERNEL_FLAGS if f in have]}


def provenance() -> dict:
    """The commit, whether the tree differs from it (outside NOT_INPUTS), and the versions the numbers depend on."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".", *(f":(exclude){path}" for path in NOT_INPUTS))
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import torch  # the CPU kernels a run used decide its bits (ATEN_CPU_CAPABILITY, docs/reproducibility.md)

    return {"commit": head.strip() if head else None, "dirty": bool(status.strip()) if status is not None else None,
            "versions": versions, "python": platform.python_version(), "machine": platform.machine(),
            "system": platform.system(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"), "cpu": cpu_info()}


def run_records(plan: Plan, runs: dict, results: dict, doubled: dict, timings: dict) -> list[dict]:
    """One entry per planned run (see the module docstring); `runs`: run dir -> fl.report Run of the finished ones;
    `doubled`: the cells at twice the twin's budget (claims.py), their values named <table>/<column>/<row>@x2;
    `timings`: timings.json's runs."""
    selected: dict[str, dict] = {}
    for suffix, cells in (("", results), (f"@x{DOUBLED}", doubled)):
        for key, cell in cells.items():
            for seed, source in cell.sources.items():
                selected.setdefault(source, {})[f"{key.table}/{key.column}/{key.row}{suffix}"] = cell.seeds[seed]
    out = []
    for group in plan.groups.values():
        for job in group.jobs.values():
            run = runs.get(str(job.run_dir))
            status = "failed" if run is None else "diverged" if run.diverged else "finished"
            entry = {"run": run_key(job.run_dir), "sweep": group.ref.sweep, "point": job.point, "seed": job.seed,
                     "overrides": run_argv(job), "config_sha1": config_hash(job.config), "status": status,
                     "seconds": timings.get(run_key(job.run_dir)), "selected": selected.get(str(job.run_dir), {})}
            if run is not None:
                entry["final"] = run.summary.get("final", {})
                if run.diverged:
                    entry["diverged"] = run.diverged
            out.append(entry)
    return out


def _cells(cells: dict) -> list[dict]:
    return [{"table": k.table, "column": k.column, "row": k.row, "mean": c.mean, "std": c.std, "n": c.n,
             "seeds": {str(s): v for s, v in c.seeds.items()}, "runs": c.chosen, "notes": c.notes}
            for k, c in cells.items()]


def write_json(path: Path, report, results: dict, doubled: dict, command: dict, records: list[dict]) -> None:
    doc = {"paper": report.paper.id, "scale": report.scale, "seeds": report.seeds, "command": command,
           "provenance": provenance(), "cells": _cells(results), f"cells_x{DOUBLED}": _cells(doubled),
           "claims": [{"id": r.claim.id, "verdict": r.verdict, "printed": r.label, "cause": r.cause, "held": r.held,
                       "failed": r.failed, "of": r.named, "note": r.note,
                       "checks": [{"label": ch.label, "verdict": ch.verdict, "detail": ch.detail, "exists": ch.counts,
                                   "regime": ch.regime, "regime_why": ch.regime_why, "budget": ch.budget,
                                   f"at_x{DOUBLED}": ch.doubled_detail, "cause": ch.cause}
                                  for ch in r.checks]}
                      for r in report.claims],
           "twin": report.setting, "left": report.left, "notes": report.notes, "runs": records}
    path.write_text(json.dumps(doc, indent=2, default=str))


def write_timings(path: Path, plan: Plan, start: float, load: float) -> dict:
    """Each run's wall and CPU time in this invocation, added to those of earlier invocations
    (bench/reproduce_budget.py gathers them), with the load average around it; returns every run's."""
    runs = {run_key(j.run_dir): {"wall_s": j.seconds, "cpu_s": j.cpu_seconds}
            for j in plan.jobs if j.seconds is not None}
    old = json.loads(path.read_text()).get("runs", {}) if path.is_file() else {}
    walls = [r["wall_s"] for r in runs.values()]
    path.write_text(json.dumps({"runs": {**old, **runs}, "wall_s": time.time() - start,
                                "load_start": load, "load_end": os.getloadavg()[0],
                                "median_run_s": statistics.median(walls) if walls else None}, indent=2))
    return {**old, **runs}
