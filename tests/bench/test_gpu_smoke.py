"""bench/gpu_smoke.py: its dry run on the CPU (every part, the CUDA-only rows marked), the twin of every method, the
bitwise comparison of two runs and the per-step sync count (fed warnings here, as set_sync_debug_mode raises them
on CUDA)."""
from __future__ import annotations

import warnings

import pytest
import torch

from bench import gpu_smoke
from fl.config import load_config
from fl.core import registry
from tests.helpers import ROOT, TINY, load_ckpt, run_cli, run_tiny

DRY_RUN_METHODS = ("fedavg", "pfedfda")  # a global model, and float32 islands under autocast


def test_every_method_has_a_twin_that_loads_as_that_method():
    registry.load_plugins()
    twins = gpu_smoke.synthetic_twins()
    shipped = {m for m, spec in registry.METHODS.items() if spec.client_cls.__module__.startswith("fl.")}
    assert set(twins) >= shipped - {"centralized", "fedacd_base", "fedavg_ft", "fedrep", "local",
                                                  "scaffold"}  # these run the quickstart under their own name
    for method in shipped:
        conf, extra = twins.get(method, ("quickstart", [f"method.name={method}"]))
        assert load_config([f"conf={conf}", *extra]).method.name == method


def test_same_run_is_bitwise_and_names_the_first_difference(out):
    a = run_tiny(out, "trainer.rounds=2", name="a")
    b = run_tiny(out, "trainer.rounds=2", name="b")
    assert gpu_smoke.same_run(a, b) == (True, "")
    state = load_ckpt(b)
    key = next(iter(state["server"]["global_params"]))
    state["server"]["global_params"][key] = state["server"]["global_params"][key] + 1e-7
    torch.save(state, b / "checkpoints" / "last.ckpt")
    same, detail = gpu_smoke.same_run(a, b)
    assert not same and key in detail
    assert gpu_smoke.same_run(a, b, atol=1e-6) == (True, "")


def test_the_sync_counter_counts_warnings_inside_training_steps_after_the_first_round(out, monkeypatch):
    from fl.methods.fedavg import FedAvgClient

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)  # no CUDA here: the test warns itself
    step = FedAvgClient.training_step

    def syncing_step(self, batch, batch_idx):
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # what set_sync_debug_mode('warn') raises
        return step(self, batch, batch_idx)

    monkeypatch.setattr(FedAvgClient, "training_step", syncing_step)
    counter = gpu_smoke.SyncCounter()
    with counter:
        assert gpu_smoke.Smoke("cpu", out).run([*TINY, "trainer.rounds=2", "fabric.cpu_threads=1"], "syncs")[0] == 0
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # outside a step: not counted
    assert counter.steps > 0 and counter.syncs == counter.steps  # one a step, round 0 left out
    (where, n), = counter.where.most_common()
    assert where.startswith("fl/core/client.py:") and n == counter.steps


@pytest.mark.slow
def test_the_dry_run_on_the_cpu_runs_every_part_and_meets_its_targets(tmp_path):
    # two methods in the precision part, not the seed papers' six: every method's 16-mixed and bf16-mixed round is
    # tests/core/test_precision.py's; here the part itself is checked
    res = run_cli(["--device", "cpu", "--methods", *DRY_RUN_METHODS, "--keep", str(tmp_path / "runs")], cwd=ROOT,
                  script=("bench/gpu_smoke.py",), timeout=1500)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    rows = [line.split(" | ") for line in res.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    parts = {r[0].lstrip("| ") for r in rows}
    assert parts == set(gpu_smoke.PARTS)
    cases = {(r[0].lstrip("| "), r[1]): r[2] for r in rows}
    assert all("n/a on cpu" in result for (part, _), result in cases.items() if part == "syncs")
    twice = cases[("determinism", "quickstart twice, fabric.deterministic=true")]
    assert twice == "bitwise equal"
    assert cases[("determinism", "1 vs 2 processes (gloo), fabric.deterministic=true")] == "bitwise equal"
    compiled = cases[("compile", "quickstart, parallel_clients=8 compile=true (eager)")]
    assert compiled.startswith("1 graph(s) (0 recompiles), 0 graph breaks")
    precision = [result for (part, case), result in cases.items() if part == "precision" and "(" in case]
    assert len(precision) == len(DRY_RUN_METHODS) and all("FAILED" not in p for p in precision)
