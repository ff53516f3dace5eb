"""The CPU thread policy (fl/run/cpu_threads.py): the entry points make OpenMP threads sleep at barriers before torch
loads (a user's OMP_WAIT_POLICY is kept), and runs started side by side divide the cores between them."""
from __future__ import annotations

import json

import pytest

from fl.run import cpu_threads
from fl.sweep import runner
from fl.sweep.runner import Job
from fl.sweep.spec import parse_sweep
from tests.helpers import ROOT, run_cli

# the value of OMP_WAIT_POLICY when torch is first imported, printed then, while the entry point runs as
# `python -m <module> --help`; the process ends there (what it would do after torch loads cannot change the value)
PROBE = """
import importlib.abc, json, os, runpy, sys
class Watch(importlib.abc.MetaPathFinder):
    seen = False
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not Watch.seen:
            Watch.seen = True
            print("AT_TORCH " + json.dumps(os.environ.get("OMP_WAIT_POLICY")), flush=True)
            os._exit(0)
sys.meta_path.insert(0, Watch())
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("module", ["fl.train", "fl", "fl.sweep", "fl.reproduce"])
@pytest.mark.parametrize("given", [None, "ACTIVE"])
def test_entry_points_make_openmp_threads_sleep_at_barriers_before_torch_loads(module, given):
    done = run_cli([module], cwd=ROOT, script=("-c", PROBE), env={"OMP_WAIT_POLICY": given})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = [json.loads(ln.removeprefix("AT_TORCH ")) for ln in done.stdout.splitlines() if ln.startswith("AT_TORCH ")]
    assert seen == [given or "PASSIVE"], done.stdout[-2000:]


def test_processes_side_by_side_get_their_share_of_the_cores_unless_the_environment_sets_it(monkeypatch):
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 8)
    assert cpu_threads.env_for_one_of(3, {}) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"}
    assert cpu_threads.env_for_one_of(16, {}) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    assert cpu_threads.env_for_one_of(1, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}  # alone: torch's own default
    given = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3", "PATH": "/bin"}
    assert cpu_threads.env_for_one_of(2, given) == given


def test_a_sweep_with_parallel_runs_divides_the_cores_between_them(tmp_path, monkeypatch):
    envs = []

    class Finished:  # a run that has ended: the runner reads its exit code and moves on
        returncode = 0

        def __init__(self, cmd, stdout, stderr, env):
            envs.append(env)

    monkeypatch.setattr(runner.subprocess, "Popen", Finished)
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    sweep = parse_sweep({"program": "fl.train", "method": "grid", "metric": {"name": "test/acc_mean_clients"},
                         "parameters": {"optim.lr": {"values": [0.1]}}})
    jobs = [Job(f"p{i}", {}, 0, tmp_path / f"run{i}") for i in range(3)]
    runner.run_jobs(sweep, jobs, [], parallel=4)  # 3 runs at once: 8 // 3 threads each
    assert [(e["OMP_NUM_THREADS"], e["OMP_WAIT_POLICY"]) for e in envs] == [("2", "PASSIVE")] * 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    envs.clear()
    runner.run_jobs(sweep, jobs, [], parallel=2)
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["1"] * 3
