"""Sweep files (W&B format) and the offline runner: expansion, validation, resume, --make, and every
sweeps/*.yaml checked against the config schema."""
import copy
import json
import math

import pytest
import yaml

from fl.config import ConfigError, load_config
from fl.sweep.runner import Job, train_argv
from fl.sweep.runner import main as sweep_main
from fl.sweep.spec import check_metric, expand, grid_values, load_sweep, parse_sweep, point_args
from tests.helpers import ROOT, TINY, run_cli

BASE = {
    "program": "fl.train",
    "command": ["${env}", "python", "-m", "fl.train", "conf=quickstart", "${args_no_hyphens}"],
    "method": "grid",
    "metric": {"name": "test/acc_mean_clients", "goal": "maximize"},
    "parameters": {"optim.lr": {"values": [0.01, 0.05, 0.1]}, "trainer.local_epochs": {"values": [1, 2]},
                   "seed": {"values": [0, 1]}},
}


def doc(**changes):
    d = copy.deepcopy(BASE)
    d.update(changes)
    return d


def test_grid_expansion_is_the_cartesian_product_without_seed():
    sweep = parse_sweep(doc())
    points = expand(sweep)
    assert len(points) == 3 * 2
    assert {(p["optim.lr"], p["trainer.local_epochs"]) for p in points} == {
        (lr, e) for lr in (0.01, 0.05, 0.1) for e in (1, 2)}
    assert all("seed" not in p for p in points)  # seeds are repeats of a point, not points
    assert sweep.fixed_args == ["conf=quickstart"]


def test_grid_over_int_and_q_uniform_and_nested_parameters():
    sweep = parse_sweep(doc(parameters={
        "trainer": {"parameters": {"rounds": {"distribution": "int_uniform", "min": 2, "max": 5}}},
        "optim.momentum": {"distribution": "q_uniform", "min": 0.0, "max": 0.5, "q": 0.25},
        "optim.name": {"value": "sgd"}}))
    points = expand(sweep)
    assert len(points) == 4 * 3 * 1
    assert sorted({p["trainer.rounds"] for p in points}) == [2, 3, 4, 5]
    assert sorted({p["optim.momentum"] for p in points}) == [0.0, 0.25, 0.5]


def test_grid_refuses_a_continuous_distribution_naming_the_parameter():
    bad = doc(parameters={"optim.lr": {"distribution": "log_uniform_values", "min": 1.0e-3, "max": 1.0}})
    with pytest.raises(ConfigError, match=r"parameters\.optim\.lr: method grid needs"):
        parse_sweep(bad)


def test_random_expansion_count_ranges_and_seeding():
    d = doc(method="random", run_cap=7, parameters={
        "optim.lr": {"distribution": "log_uniform_values", "min": 1.0e-3, "max": 1.0},
        "optim.momentum": {"distribution": "uniform", "min": 0.0, "max": 0.9},
        "trainer.local_epochs": {"distribution": "int_uniform", "min": 1, "max": 3},
        "optim.name": {"values": ["sgd", "adam"]}})
    sweep = parse_sweep(d)
    points = expand(sweep)
    assert len(points) == 7
    assert len(expand(sweep, count=12)) == 12
    assert points == expand(parse_sweep(d))  # same file, same seed: the same points (resume finds its runs)
    assert points != expand(sweep, seed=1)
    for p in expand(sweep, count=200):
        assert 1e-3 <= p["optim.lr"] <= 1.0 and 0.0 <= p["optim.momentum"] <= 0.9
        assert p["trainer.local_epochs"] in (1, 2, 3) and p["optim.name"] in ("sgd", "adam")
    # log-uniform: about half the draws below the geometric midpoint sqrt(1e-3 * 1)
    lrs = [p["optim.lr"] for p in expand(sweep, count=400)]
    assert 0.4 < sum(v < math.sqrt(1e-3) for v in lrs) / len(lrs) < 0.6


def test_bayes_runs_as_random_with_a_note():
    sweep = parse_sweep(doc(method="bayes", run_cap=3, parameters={
        "optim.lr": {"distribution": "uniform", "min": 0.01, "max": 0.1}}))
    assert sweep.method == "random" and sweep.requested_method == "bayes"
    assert "random" in sweep.notes[0]
    assert len(expand(sweep)) == 3


def test_random_without_a_count_is_an_error():
    sweep = parse_sweep(doc(method="random", parameters={"optim.lr": {"distribution": "uniform", "min": 0.1,
                                                                                "max": 0.2}}))
    with pytest.raises(ConfigError, match="run_cap"):
        expand(sweep)


@pytest.mark.parametrize("change, field", [
    ({"method": "hyperband"}, "method"),
    ({"metric": {"name": "test/acc", "goal": "up"}}, "metric.goal"),
    ({"metric": "test/acc"}, "metric"),
    ({"command": ["python", "train.py", "${args_no_hyphens}"]}, "command"),
    ({"command": ["python", "-m", "fl.train", "conf=quickstart"]}, "command"),
    ({"command": ["python", "-m", "fl.train", "${args_json}", "${args_no_hyphens}"]}, "command"),
    ({"parameters": {}}, "parameters"),
    ({"parameters": {"optim.lr": [0.1, 0.2]}}, "parameters.optim.lr"),
    ({"parameters": {"optim.lr": {"valuez": [0.1]}}}, "parameters.optim.lr"),
    ({"method": "random", "parameters": {"optim.lr": {"distribution": "gamma", "min": 0, "max": 1}}},
     "parameters.optim.lr.distribution"),
    ({"method": "random", "parameters": {"optim.lr": {"distribution": "uniform", "min": 1.0, "max": 0.1}}},
     "parameters.optim.lr"),
    ({"method": "random", "parameters": {"optim.lr": {"distribution": "uniform", "min": "1e-4", "max": 0.1}}},
     "parameters.optim.lr.min"),
    ({"run_cap": 0}, "run_cap"),
])
def test_malformed_files_name_the_bad_field(change, field):
    with pytest.raises(ConfigError) as err:
        parse_sweep(doc(**change))
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


@pytest.mark.slow
def test_cli_bad_file_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc(method="grdi")))
    res = run_cli([str(path), "--out", str(tmp_path)], cwd=tmp_path, script=("-m", "fl.sweep"))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "method: 'grdi' is not valid" in res.stderr
    # a bad parameter key is caught by the config schema before anything runs
    path.write_text(yaml.safe_dump(doc(parameters={"optim.lrr": {"values": [0.1]}})))
    assert sweep_main([str(path), "--out", str(tmp_path)]) == 2
    assert "unknown key 'optim.lrr'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_dead_run_without_checkpoint_is_restarted_and_one_with_a_checkpoint_resumed(tmp_path):
    sweep = parse_sweep(doc())
    run_dir = tmp_path / "p000-x-s0"
    (run_dir / "checkpoints").mkdir(parents=True)
    job = Job("p000-x", {"optim.lr": 0.1}, 0, run_dir)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert train_argv(sweep, job, ["trainer.rounds=3", "logger.wandb.mode=disabled"])[:1] == [f"resume={run_dir}"]
    (run_dir / "checkpoints" / "last.ckpt").unlink()
    argv = train_argv(sweep, job, ["trainer.rounds=3"])
    assert not run_dir.exists()  # nothing to resume from: start again under the same name
    assert "optim.lr=0.1" in argv and f"logger.run_name={run_dir.name}" in argv and "seed=0" in argv


@pytest.mark.parametrize("damage, said", [
    ("no_config", "it has summary.json but no config.yaml"),
    ("truncated", "its summary.json cannot be read (JSONDecodeError)"),
    ("not_an_object", "its summary.json is not a JSON object"),
])
def test_a_damaged_finished_run_is_not_reused_but_kept_aside_and_run_again(damage, said, tmp_path, capsys):
    sweep = parse_sweep(doc())
    run_dir = tmp_path / "p000-x-s0"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "summary.json").write_text(json.dumps({"final": {"test/acc_mean_clients": 0.5}}))
    job = Job("p000-x", {"optim.lr": 0.1}, 0, run_dir)
    assert job.finished and job.damage is None
    if damage == "no_config":
        (run_dir / "config.yaml").unlink()
    else:
        (run_dir / "summary.json").write_text('{"final": {"test/acc' if damage == "truncated" else "[1, 2]")
    assert not job.finished and job.damage == said  # counted as a run to go, never as a reused one
    argv = train_argv(sweep, job, ["trainer.rounds=3"])
    assert capsys.readouterr().err.strip() == f"warning: {run_dir}: {said}; moved to p000-x-s0.damaged1 and run again"
    assert not run_dir.exists() and (tmp_path / "p000-x-s0.damaged1" / "summary.json").is_file()  # nothing lost
    assert "optim.lr=0.1" in argv and f"logger.run_name={run_dir.name}" in argv  # from the start, not resumed


def test_a_diverged_run_is_finished_but_its_metric_is_left_out_of_the_point(tmp_path, capsys):
    from fl.sweep.runner import print_results, results

    sweep = parse_sweep(doc())
    jobs = []
    for seed, acc, diverged in ((0, 0.9, False), (1, 0.1, True)):
        run_dir = tmp_path / f"p000-x-s{seed}"
        run_dir.mkdir()
        summary = {"final": {"test/acc_mean_clients": acc}}
        if diverged:  # what fl.train writes when trainer.on_divergence stops (or warns about) a run
            summary["diverged"] = {"round": 3, "client": 1, "method": "fedavg", "reason": "training loss 1e+06 > ..."}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "config.yaml").write_text(f"seed: {seed}\n")  # a run writes it when it starts
        jobs.append(Job("p000-x", {"optim.lr": 0.1}, seed, run_dir))
    assert all(j.finished for j in jobs) and [j.diverged for j in jobs] == [False, True]
    table = results(sweep, jobs)
    assert table[0]["values"] == [0.9] and table[0]["mean"] == 0.9 and table[0]["diverged"] == [str(jobs[1].run_dir)]
    print_results(sweep, table, [0, 1])
    assert "0.9000 ± 0.0000  (n=1)  (1 diverged, left out)" in capsys.readouterr().out


def test_a_run_another_invocation_holds_is_waited_for_then_reused_not_trained_again(tmp_path, capsys):
    """The other invocation is this test: it holds the run's lock, finishes the run (summary.json), lets go."""
    import threading

    from fl.sweep.run_lock import release, try_lock
    from fl.sweep.runner import run_jobs

    run_dir = tmp_path / "p000-x-s0"
    held = try_lock(run_dir)
    assert held is not None and try_lock(run_dir) is None  # one holder at a time, even within a process

    def finish():
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text("seed: 0\n")
        (run_dir / "summary.json").write_text(json.dumps({"final": {}}))
        release(held)

    timer = threading.Timer(1.5, finish)
    timer.start()
    job = Job("p000-x", {}, 0, run_dir)
    assert run_jobs(parse_sweep(doc()), [job], [], 1) == []
    timer.join()
    out = capsys.readouterr().out
    assert "waiting for p000-x-s0: another invocation is running it" in out
    assert "[1/1] p000-x-s0 finished by another invocation; reused" in out and " done " not in out
    assert not (tmp_path / "logs" / "p000-x-s0.log").exists()  # nothing was started here
    release(try_lock(run_dir))


def test_a_damaged_config_of_a_run_is_named_in_one_line(tmp_path):
    from fl.sweep.runner import check_reuse

    run_dir = tmp_path / "p000-x-s0"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("# partition fingerprint: x\nseed: [\n")
    with pytest.raises(ConfigError) as err:
        check_reuse([Job("p000-x", {}, 0, run_dir, {"seed": 0})])
    assert str(err.value).count("\n") == 0 and f"{run_dir / 'config.yaml'} cannot be read" in str(err.value)
    assert f"delete {run_dir} to run it again" in str(err.value)


@pytest.mark.slow
def test_offline_sweep_runs_groups_resumes_and_picks_the_best(tmp_path, capsys):
    """The command runs the sweep; again (in this process, as the later invocations), it reruns only the run that lost
    its summary; with other settings it refuses to pass the finished runs for them."""
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(yaml.safe_dump(doc(name="tiny", parameters={
        "method.name": {"value": "fedprox"}, "method.mu": {"values": [0.0, 1.0]}})))
    args = [str(sweep_file), "--seeds", "0", "--parallel", "2", "--out", str(tmp_path / "sweeps"),
            *TINY, "trainer.rounds=2", f"data.root={tmp_path / 'data'}"]
    res = run_cli(args, cwd=tmp_path, script=("-m", "fl.sweep"))
    assert res.returncode == 0, res.stderr + res.stdout
    out = tmp_path / "sweeps" / "tiny"
    runs = sorted(p.parent for p in out.glob("*/summary.json"))
    assert len(runs) == 2 and all(r.name.endswith("-s0") for r in runs)
    finals = {r.name: json.loads((r / "summary.json").read_text())["final"]["test/acc_mean_clients"] for r in runs}
    manifest = json.loads((out / "sweep.json").read_text())
    best = max(finals.values())
    assert manifest["best"]["mean"] == pytest.approx(best)
    assert f"test/acc_mean_clients={best:.4f}" in res.stdout.split("best:")[1]

    # half-done: the second run lost its summary (it died after its last checkpoint)
    done, half = runs
    (half / "summary.json").unlink()
    stamp = (done / "summary.json").stat().st_mtime_ns
    capsys.readouterr()
    assert sweep_main(args) == 0
    said = capsys.readouterr().out
    assert f"reusing 1 of 2 runs, finished earlier with the same config: {done.name}; 1 to go" in said
    assert (done / "summary.json").stat().st_mtime_ns == stamp  # not rerun
    assert (half / "summary.json").is_file()
    log = (out / "logs" / f"{half.name}.log").read_text()
    assert f"resume={half}" in log.splitlines()[0]
    assert json.loads((half / "summary.json").read_text())["final"]["test/acc_mean_clients"] == finals[half.name]

    # the real command after a smoke test: other settings never pass for the finished runs
    assert sweep_main(args + ["trainer.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "trainer.rounds=2" in err and "trainer.rounds=3" in err and "--out" in err
    assert (done / "summary.json").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_make_writes_a_valid_sweep_file_from_declared_ranges(tmp_path, capsys):
    out = tmp_path / "lam.yaml"
    res = run_cli(["--make", "conf=fedpals_cifar10_c2_synthetic", "params=method.lam", f"out={out}"],
                  cwd=tmp_path, script=("-m", "fl.sweep"))
    assert res.returncode == 0, res.stderr
    sweep = load_sweep(out)
    assert sweep.method == "random" and sweep.run_cap
    assert sweep.metric == "val/target_acc" and sweep.goal == "maximize"  # FedPALS tunes lambda on validation
    assert sweep.params["method.lam"] == {"distribution": "log_uniform_values", "min": 1.0, "max": 1e4}
    for point in expand(sweep):
        load_config(sweep.fixed_args + point_args(point))
    assert sweep_main(["--make", "conf=fedpals_cifar10_c2_synthetic", "params=method.ess_frac", "seeds=0,1"]) == 0
    made = tmp_path / "made.yaml"
    made.write_text(capsys.readouterr().out)
    made = load_sweep(made)
    assert made.method == "grid" and grid_values("seed", made.params["seed"]) == [0, 1]
    assert made.params["method.ess_frac"] == {"values": [0.1, 0.25, 0.5, 0.75, 1.0]}
    assert sweep_main(["--make", "conf=fedpals_cifar10_c2_synthetic", "params=method.tau"]) == 2
    assert "params: 'method.tau' has no search range" in capsys.readouterr().err


def test_a_dry_run_shows_what_every_run_gets_beside_its_point(tmp_path, capsys):
    """The pass-through overrides (trainer.rounds=3) were used by every run but shown nowhere."""
    path = tmp_path / "lr.yaml"
    path.write_text(yaml.safe_dump(doc(parameters={"optim.lr": {"values": [0.01, 0.1]}, "seed": {"values": [0, 1]}})))
    assert sweep_main([str(path), "--dry-run", "trainer.rounds=3", "data.num_clients=4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("each run: python -m fl.train conf=quickstart <the point's parameters> seed=<seed> "
                      "trainer.rounds=3 data.num_clients=4")
    assert [line.split()[1] for line in out[2:]] == ["optim.lr=0.01"] * 2 + ["optim.lr=0.1"] * 2
    assert not (tmp_path / "lr").exists()


SWEEP_FILES = sorted((ROOT / "sweeps").glob("*.yaml"))


def test_the_sweep_files_are_found():  # the test below is one per file: none found would pass silently
    assert len(SWEEP_FILES) >= 70


@pytest.mark.parametrize("path", SWEEP_FILES, ids=[p.stem for p in SWEEP_FILES])
def test_every_shipped_sweep_file_is_valid(path):
    """Parses as W&B's format, runs fl.train, and every point (grid: all, every arm among them; random: 5 draws) is
    a config fl.train accepts, and so is the first point with every seed: the conf exists, the method is known, each
    parameter is a valid key. (A seed is checked on one point: no check of a config reads the seed with another key.)"""
    sweep = load_sweep(path)
    assert sweep.metric, f"{path.name}: a sweep needs a metric to pick the best point"
    arms_name_conf = bool(sweep.arms) and all(any(w.startswith("conf=") for w in ws) for ws in sweep.arms.values())
    assert any(a.startswith("conf=") for a in sweep.fixed_args) or "conf" in sweep.params or arms_name_conf, (
        f"{path.name}: neither the command nor the parameters (nor every arm) name a conf")
    seeds = grid_values("seed", sweep.params["seed"]) if "seed" in sweep.params else [None]
    points = expand(sweep, count=5)
    assert points
    for i, point in enumerate(points):
        for seed in seeds if i == 0 else seeds[:1]:
            argv = sweep.point_argv(point) + ([f"seed={seed}"] if seed is not None else [])
            cfg = load_config(argv)
            check_metric(sweep.metric, sweep.goal, cfg, "")  # a metric the runs log, the goal its declared direction
            for key, value in point.items():  # the value arrives typed, as the file meant it
                if key in ("conf", "arm"):  # the config file itself, an arm's name: not keys of the config
                    continue
                got = cfg
                for part in key.split("."):
                    got = got[part]
                if isinstance(value, dict):  # a group's values (trainer: {rounds: 75, local_epochs: 2}) set those keys
                    got = {k: got[k] for k in value}
                assert got == value or (isinstance(value, float) and math.isclose(got, value)), (key, got, value)
    if sweep.method == "grid":
        assert len({json.dumps(p, sort_keys=True) for p in points}) == len(points)
    else:  # a random draw may miss an arm: each arm on the first point
        for arm in sweep.arms:
            load_config(sweep.point_argv({**points[0], "arm": arm}))


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_a_reaped_run_carries_its_exit_code_and_the_cpu_time_it_used(code, tmp_path):
    """The runner reaps each run with wait4: the exit code as Popen's, and the CPU time its process used (the
    projection basis of fl.reproduce --dry-run), which a run that burns 0.3 s of CPU cannot report as less."""
    import subprocess
    import sys
    import time

    from fl.sweep.runner import _reaped
    burn = f"import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nsys.exit({code})"
    proc = subprocess.Popen([sys.executable, "-c", burn])
    job = Job("p000", {}, 0, tmp_path / "run")
    deadline = time.time() + 60
    while not _reaped(job, proc):
        assert time.time() < deadline
        time.sleep(0.05)
    assert proc.returncode == code and proc.poll() == code
    assert 0.3 <= job.cpu_seconds < 30
