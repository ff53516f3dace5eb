"""A sweep's or a reproduction's runs in warm processes (fl/sweep/warm_worker.py, issue 45 item 2): the same numbers
bit for bit as each run alone, each run isolated from the ones before it in the same process (its environment,
torch's flags, the plug-ins it may name), its output in its own log, and a failing run failing alone."""
from __future__ import annotations

import pytest
import yaml

from fl.run.train import main
from fl.sweep.runner import Job, plan_points, run_jobs
from fl.sweep.spec import load_sweep
from fl.testing import same_state
from tests.core.test_plugin_outputs import isolated_registry  # noqa: F401  (a fixture)
from tests.helpers import load_ckpt, read_metrics, tiny
from tests.sweep.test_sweep import doc

# a plug-in module: method zz_warm_plugin is FedAvg under another name
PLUGIN = ("from dataclasses import dataclass\n\n"
          "from fl.config import MethodConfig\n"
          "from fl.core import ClientModule, Server, register_method\n\n\n"
          "@dataclass\nclass Config(MethodConfig):\n    name: str = 'zz_warm_plugin'\n\n\n"
          "register_method('zz_warm_plugin', Config, ClientModule, Server)\n")


def sweep_jobs(tmp_path, parameters: dict, *extra: str):
    """A sweep over `parameters` (name -> {"values": [...]}, one point per position), planned at seed 0."""
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump(doc(name="warm", parameters=parameters)))
    sweep = load_sweep(path)
    points = [dict(zip(parameters, v)) for v in zip(*(p["values"] for p in parameters.values()))]
    args = [a for a in tiny(tmp_path, *extra) if not a.startswith("logger.output_dir=")]
    return sweep, plan_points(sweep, points, tmp_path / "sweeps" / "warm", [0], args), args


@pytest.mark.slow
def test_runs_in_one_warm_process_equal_each_run_alone_and_are_isolated(tmp_path, monkeypatch,
                                                                        isolated_registry):  # noqa: F811
    """Four runs in one worker: deterministic algorithms on in the second (a global torch flag), a plug-in module
    in the third; each equals the same run alone, and the fourth, naming the plug-in's method without the plug-in,
    fails as it would alone (the worker forgot it)."""
    (tmp_path / "zz_warm_module.py").write_text(PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    parameters = {"method.name": {"values": ["fedavg", "fedprox", "zz_warm_plugin"]},
                  "fabric.deterministic": {"values": [False, True, False]},
                  "plugins": {"values": [[], [], ["zz_warm_module"]]}}
    sweep, jobs, args = sweep_jobs(tmp_path, parameters, "trainer.rounds=2")
    forgot = Job("p003-forgot", {"method.name": "zz_warm_plugin"}, 0, jobs[0].run_dir.with_name("p003-forgot-s0"),
                 config=jobs[0].config, sweep=sweep, extra=args)
    failed = run_jobs(sweep, [*jobs, forgot], [], parallel=1)
    assert failed == [forgot]
    logs = [(j.run_dir.parent / "logs" / f"{j.run_dir.name}.log").read_text() for j in [*jobs, forgot]]
    assert all(log.splitlines()[0].endswith("(in a warm process: fl/sweep/warm_worker.py)") for log in logs)
    assert "error: method.name='zz_warm_plugin' is not valid" in logs[3]
    assert all(log.count("test/acc_mean_clients") >= 1 for log in logs[:3])  # each run's own summary, in its log
    assert all(j.cpu_seconds and j.cpu_seconds > 0 for j in jobs)
    for job in jobs:  # the same run alone
        alone = tmp_path / "alone" / job.run_dir.name
        argv = [*sweep.point_argv(job.point), "seed=0", *args, f"logger.output_dir={alone.parent}",
                f"logger.run_name={alone.name}"]
        assert main(argv) == 0
        assert read_metrics(alone) == read_metrics(job.run_dir), job.run_dir.name
        a, b = load_ckpt(alone), load_ckpt(job.run_dir)
        assert same_state(a["server"], b["server"]) == [] and same_state(a["clients"], b["clients"]) == []


@pytest.mark.slow
def test_a_failed_run_ends_its_worker_and_the_next_run_gets_a_fresh_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parameters = {"optim.lr": {"values": [1e30, 0.05]}}  # the first diverges (exit 1), the second trains
    sweep, jobs, _ = sweep_jobs(tmp_path, parameters, "trainer.rounds=2")
    failed = run_jobs(sweep, jobs, [], parallel=1)
    assert failed == [jobs[0]] and jobs[1].finished
    assert "non-finite" in (jobs[0].run_dir.parent / "logs" / f"{jobs[0].run_dir.name}.log").read_text()


@pytest.mark.slow
def test_fresh_processes_on_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FL_FRESH_PROCESSES", "1")
    sweep, jobs, _ = sweep_jobs(tmp_path, {"optim.lr": {"values": [0.05]}}, "trainer.rounds=1")
    assert run_jobs(sweep, jobs, [], parallel=1) == []
    log = (jobs[0].run_dir.parent / "logs" / f"{jobs[0].run_dir.name}.log").read_text()
    assert "warm process" not in log.splitlines()[0] and "test/acc_mean_clients" in log


def test_only_single_process_runs_go_to_a_warm_worker():
    from fl.sweep.warm_worker import single_process

    one = {"fabric.strategy": "auto", "fabric.devices": 1, "fabric.num_nodes": 1, "fabric.accelerator": "cpu"}
    assert single_process(one) and single_process({**one, "fabric.deterministic": True})
    assert not single_process({**one, "fabric.strategy": "ddp", "fabric.devices": 2})
    assert not single_process({**one, "fabric.devices": 2}) and not single_process({**one, "fabric.num_nodes": 2})
    assert not single_process({**one, "fabric.accelerator": "cuda", "fabric.deterministic": True})
    assert not single_process({})  # a job planned without its config: its own process
