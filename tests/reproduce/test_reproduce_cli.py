"""`python -m fl.reproduce`: bad input is one line and exit 2; --dry-run lists every paper's runs; the side-by-side
table and the claims' verdicts of a tiny sweep whose runs are on disk; and (slow) one tiny reproduction end to end,
run, then reused."""
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest
import yaml
from omegaconf import OmegaConf

from fl.config import load_config
from fl.reproduce.cli import main
from fl.reproduce.spec import available_papers, load_paper
from tests.helpers import ROOT, TINY, run_cli

SWEEP = {"name": "tiny_compare", "program": "fl.train", "method": "grid",
         "command": ["${env}", "python", "-m", "fl.train", "conf=quickstart", "${args_no_hyphens}"],
         "metric": {"name": "test/acc_mean_clients", "goal": "maximize"},
         "parameters": {"arm": {"values": ["fedavg", "fedprox"]}, "arms.fedavg": {"value": "method.name=fedavg"},
                        "arms.fedprox": {"value": "method.name=fedprox method.mu=0.1"}}}


def tiny_paper(tmp_path) -> str:
    """A paper file with one table over a tiny two-arm sweep on the quickstart data, and three claims."""
    sweep = tmp_path / "tiny_compare.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP))
    ref = [{"sweep": str(sweep)}]
    doc = {"paper": "tiny", "title": "A tiny paper", "source": "tests",
           "tables": [{"id": "t1", "caption": "accuracy", "source": "Table 1", "metric": "test/acc_mean_clients",
                       "unit": "percent", "baselines": ["FedAvg"],
                       "columns": [{"id": "quick", "label": "Quickstart", "real": ref, "twin": ref}],
                       "rows": [{"method": "FedAvg", "arm": "fedavg", "paper": {"quick": [60.0, 1.0]}},
                                {"method": "FedProx", "arm": "fedprox", "paper": {"quick": [70.0, 2.0]}}]}],
           "claims": [{"id": "prox_above", "text": "FedProx beats FedAvg", "source": "Table 1", "rule": "better",
                       "table": "t1", "column": "quick", "a": "FedProx", "b": "FedAvg"},
                      {"id": "prox_first", "text": "FedProx is first", "source": "Table 1", "rule": "rank",
                       "table": "t1", "column": "quick", "row": "FedProx", "rank": 1},
                      {"id": "near", "text": "FedProx near the paper", "source": "Table 1", "rule": "within",
                       "table": "t1", "column": "quick", "row": "FedProx", "tolerance": 1.0, "scales": ["paper"]}]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["nopaper"], "paper 'nopaper' is not known; choices: fedacd, feddrm"),
    (["fedpals", "--table", "table9"], "--table 'table9' is not a table of fedpals; choices: table1, table2, table3"),
    (["fedpals", "--scale", "big"], "--scale 'big' is not valid; choices: twin, paper"),
    (["fedpals", "--seeds", "0"], "--seeds and --parallel must be >= 1"),
    (["fedpals", "--all"], "give a paper"),
    (["--all", "--table", "table1"], "--table names a table of one paper"),
    (["fedpals", "--sedes", "3"], "unrecognized arguments: --sedes"),
    (["fedpals", "trainer.roundz=3", "--dry-run"], "unknown key 'trainer.roundz'"),
    ([], "give a paper"),
    (["fedpals", "--seeds", "1000000000", "--dry-run"], "--seeds 1000000000 is more than 100"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_an_out_that_is_a_file_is_one_line_and_exit_2(dry_run, capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "below"):
        assert main(["fedmosaic", "--table", "table4", "--seeds", "1", "--out", str(out), *dry_run]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{tmp_path / 'f'} is a file, not a folder" in err, err
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("name", available_papers())
def test_dry_run_lists_every_papers_runs_with_their_projected_time(name, capsys, tmp_path):
    assert main([name, "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{name} at --scale twin:" in out and "runs to go:" in out
    assert "not run:" in out  # the cells left to --scale paper are named, with why
    assert not any(tmp_path.iterdir())


def test_twin_dry_run_projects_measured_cpu_times_and_counts_unmeasured_runs_apart(monkeypatch, capsys, tmp_path):
    """A run whose point has a measured time is projected from it; one without is named "not measured" and never
    taken as 0 s in the total."""
    import fl.reproduce.timing as timing
    from fl.reproduce.cli import make_plan, parse_args
    argv = ["fedmosaic", "--table", "table4", "--seeds", "3", "--parallel", "2", "--out", str(tmp_path / "o")]
    plan = make_plan(load_paper("fedmosaic"), parse_args(argv))
    group = next(iter(plan.groups.values()))
    measured = next(iter(group.jobs.values())).point_id
    (tmp_path / "t.json").write_text(json.dumps({"measured": "by hand", "seconds": {f"{group.key}/{measured}": 80}}))
    monkeypatch.setattr(timing, "TWIN_SECONDS", tmp_path / "t.json")
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    runs = len(plan.jobs)
    assert f"{measured}-s{{0,1,2}}: 3 to run; 80 s each (measured CPU time)" in out
    # its seed 0 at twice the rounds (the budget check): twice its measured time
    assert f"{measured}-s{{0}}: 1 to run; 3 min each (projected: 2x its measured run at the twin's budget)" in out
    assert (f"{runs} runs to go: 4 with a figure, 7 min of run time, about 3 min at --parallel 2; {runs - 4} more "
            "without one (not counted); per-run times by hand") in out
    monkeypatch.setattr(timing, "TWIN_SECONDS", tmp_path / "none.json")
    assert main([*argv, "--dry-run"]) == 0
    assert f"{runs} runs to go: no projection, none of them has a measured figure" in capsys.readouterr().out


def test_dry_run_at_paper_scale_projects_from_the_paper_scale_rehearsal(capsys, tmp_path):
    assert main(["fedpals", "--table", "table1", "--scale", "paper", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "projected 23 min (150 rounds) on the 2-core CPU each" in out  # fedpals_cifar10_c2's row in bench/README.md


def fake_finished_runs(tmp_path, paper_file: str, values: dict[str, list[float]], out: str = "o",
                       doubled: dict[str, float] | None = None) -> None:
    """Each run of the plan as a finished run directory (config.yaml as fl.train writes it, summary.json), with
    test/acc_mean_clients = values[arm][seed]; the runs at twice the rounds (seed 0), doubled[arm] (default: as at
    the twin's budget)."""
    from fl.reproduce.cli import make_plan, parse_args
    plan = make_plan(load_paper(paper_file), parse_args([paper_file, "--seeds", "3", "--out", str(tmp_path / out)]))
    longer = {id(j) for jobs in plan.doubled.values() for j in jobs}
    for job in plan.jobs:
        job.run_dir.mkdir(parents=True)
        OmegaConf.save(load_config(job.sweep.point_argv(job.point) + [f"seed={job.seed}", *job.extra]),
                       job.run_dir / "config.yaml")
        value = values[job.point["arm"]][job.seed]
        if id(job) in longer and doubled is not None:
            value = doubled[job.point["arm"]]
        (job.run_dir / "summary.json").write_text(json.dumps({
            "final": {"test/acc_mean_clients": value}, "best": {}, "last_k": 1,
            "mean_last_1": {"test/acc_mean_clients": value}, "method": job.point["arm"],
            "finished_at": datetime.now(timezone.utc).isoformat()}))


def test_side_by_side_table_and_verdicts_from_a_tiny_sweeps_runs(tmp_path, capsys):
    paper = tiny_paper(tmp_path)
    fake_finished_runs(tmp_path, paper, {"fedavg": [0.50, 0.52, 0.54], "fedprox": [0.60, 0.61, 0.62]})
    assert main([paper, "--seeds", "3", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "reusing 8 of 8 runs" in out  # 2 arms x 3 seeds, and each arm's seed 0 at twice the rounds
    assert "| FedAvg | 60.0 ± 1.0 | 2 | 52.0 ± 2.0 (n=3) | 2 |" in out
    assert "| FedProx | 70.0 ± 2.0 | 1 | 61.0 ± 1.0 (n=3) | 1 |" in out
    assert "**HOLDS** `prox_above`" in out and "**HOLDS** `prox_first`" in out
    assert "`near`: FedProx near the paper (checked at --scale paper only)" in out
    summary = ("tiny at --scale twin: 2 claims hold, 0 hold in part (HOLDS in k of n), 0 fail (cause: method), 0 "
               "unresolved (cause: overlap), 0 not judged (cause: regime), 0 not judged (cause: budget), 1 not checked "
               "at this scale")
    assert out.count(summary) == 2  # first in the output, last in what the command prints
    written = tmp_path / "o" / "tiny" / "twin"
    cells = json.loads((written / "reproduce.json").read_text())["cells"]
    assert {(c["row"], round(c["mean"], 6), c["n"]) for c in cells} == {("FedAvg", 52.0, 3), ("FedProx", 61.0, 3)}
    assert "<table>" in (written / "reproduce.html").read_text()


def test_the_output_starts_with_the_twin_beside_the_papers_setting_and_the_baselines_calibration(tmp_path, capsys):
    """Read from the resolved configs (here the twin and the paper's setting are the same quickstart sweep)."""
    paper = tiny_paper(tmp_path)
    fake_finished_runs(tmp_path, paper, {"fedavg": [0.50, 0.52, 0.54], "fedprox": [0.60, 0.61, 0.62]})
    assert main([paper, "--seeds", "3", "--out", str(tmp_path / "o")]) == 0
    written = (tmp_path / "o" / "tiny" / "twin" / "reproduce.md").read_text().splitlines()
    assert written[0].startswith("# A tiny paper") and written[2].startswith("Twin: each column's twin beside")
    cfg = load_config(["conf=quickstart", "method.name=fedavg"])
    setting = (f"{cfg.data.num_clients} clients (Dir({cfg.data.partition.alpha})), {cfg.model.name} width "
               f"{cfg.model.width}, {cfg.trainer.rounds} rounds x ")
    line = written[3]
    assert line.startswith("- Quickstart: twin: ") and line.count(setting) == 2, line  # the twin's, the paper's
    assert line.endswith("Calibration: t1 FedAvg: paper 60.0, twin 52.0 ± 2.0 (-8.0).")
    doc = json.loads((tmp_path / "o" / "tiny" / "twin" / "reproduce.json").read_text())
    assert doc["twin"][1] == line
    # a baseline more than 10 points from the paper's is named out of regime, with the gap
    fake_finished_runs(tmp_path, paper, {"fedavg": [0.40, 0.42, 0.44], "fedprox": [0.60, 0.61, 0.62]}, out="o2")
    assert main([paper, "--seeds", "3", "--out", str(tmp_path / "o2")]) == 0
    line = (tmp_path / "o2" / "tiny" / "twin" / "reproduce.md").read_text().splitlines()[3]
    assert line.endswith("t1 FedAvg: paper 60.0, twin 42.0 ± 2.0 (-18.0, outside the paper's regime: 18.0 points "
                         "from it).")


def test_reproduce_json_records_every_run_with_its_overrides_metrics_commit_and_versions(tmp_path, capsys):
    paper = tiny_paper(tmp_path)
    fake_finished_runs(tmp_path, paper, {"fedavg": [0.50, 0.52, 0.54], "fedprox": [0.60, 0.61, 0.62]})
    assert main([paper, "--seeds", "3", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "tiny" / "twin" / "reproduce.json").read_text())
    assert doc["command"] == {"table": None, "seeds": [0, 1, 2], "overrides": [], "every_cell": False,
                              "baselines": False}
    prov = doc["provenance"]
    assert prov["commit"] is None or len(prov["commit"]) == 40
    assert isinstance(prov["dirty"], (bool, type(None))) and prov["versions"]["torch"] and prov["versions"]["numpy"]
    runs = {r["run"]: r for r in doc["runs"]}
    assert len(runs) == 8 and all(r["run"].startswith("tiny_compare") for r in runs.values())
    rounds = load_config(["conf=quickstart"]).trainer.rounds
    longer = [r for r in runs.values() if f"trainer.rounds={2 * rounds}" in r["overrides"]]  # the budget check
    assert {(r["point"]["arm"], r["seed"]) for r in longer} == {("fedavg", 0), ("fedprox", 0)}
    assert next(r for r in longer if r["point"] == {"arm": "fedprox"})["selected"] == {"t1/quick/FedProx@x2": 60.0}
    fedprox_s1 = next(r for r in runs.values() if r["point"] == {"arm": "fedprox"} and r["seed"] == 1)
    assert fedprox_s1["overrides"] == ["conf=quickstart", "method.name=fedprox", "method.mu=0.1", "seed=1",
                                       "fabric.cpu_threads=1", "logger.partition_plots=false"]
    assert fedprox_s1["status"] == "finished" and fedprox_s1["final"] == {"test/acc_mean_clients": 0.61}
    assert fedprox_s1["selected"] == {"t1/quick/FedProx": 0.61 * 100}
    assert len(fedprox_s1["config_sha1"]) == 40


@pytest.mark.parametrize("record, message", [
    (None, "no record"),
    ("{not json", "cannot read the record"),
    (json.dumps({"paper": "tiny", "scale": "twin", "cells": []}), "not a reproduction's record"),
    (json.dumps({"paper": "other", "scale": "twin", "command": {}, "runs": []}), "records paper 'other'"),
    (json.dumps({"paper": "tiny", "scale": "twin", "command": {}, "runs": []}), "records no finished run"),
])
def test_check_without_a_usable_record_is_one_line_and_exit_2(record, message, tmp_path, capsys):
    paper = tiny_paper(tmp_path)
    path = tmp_path / "record.json"
    if record is not None:
        path.write_text(record)
    assert main([paper, "--check", "--record", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["--check", "--all"], "--check re-runs a record's runs"),
    (["tiny", "--check", "--table", "t1"], "--check re-runs a record's runs"),
    (["tiny", "--runs", "2"], "--runs and --record go with --check"),
    (["tiny", "--check", "--runs", "0"], "--runs must be >= 1"),
])
def test_check_options_are_checked(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("stage, message", [("make_plan", "interrupted\n"),
                                            ("reproduce", "interrupted; run the same command again to continue")])
def test_ctrl_c_while_planning_or_running_ends_with_130_in_one_line(tmp_path, capsys, monkeypatch, stage, message):
    def stop(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"fl.reproduce.cli.{stage}", stop)
    assert main([tiny_paper(tmp_path), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and err.lstrip("\n").startswith(message.strip()), err
    assert not list(tmp_path.joinpath("o").rglob("reproduce.md"))


def test_a_finished_run_with_a_damaged_config_is_named_in_one_line_and_nothing_is_written(tmp_path, capsys):
    paper = tiny_paper(tmp_path)
    fake_finished_runs(tmp_path, paper, {"fedavg": [0.50, 0.52, 0.54], "fedprox": [0.60, 0.61, 0.62]})
    damaged = next((tmp_path / "o").rglob("config.yaml"))
    damaged.write_text("# partition fingerprint: x\nseed: [\n")
    assert main([paper, "--seeds", "3", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{damaged} cannot be read" in err and f"delete {damaged.parent}" in err, err
    assert not list((tmp_path / "o").rglob("reproduce.md"))


def test_overlapping_seeds_are_unresolved_and_a_failing_claim_is_printed(tmp_path, capsys):
    paper = tiny_paper(tmp_path)
    fake_finished_runs(tmp_path, paper, {"fedavg": [0.50, 0.56, 0.62], "fedprox": [0.55, 0.57, 0.59]})
    assert main([paper, "--seeds", "3", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "**UNRESOLVED** `prox_above`" in out and "intervals overlap" in out


@pytest.mark.slow
def test_a_tiny_reproduction_end_to_end_runs_reuses_its_runs_and_checks_its_record(tmp_path, capsys):
    """The command runs the runs and prints the table and claims; again, it reuses them and prints the same claims.
    Its record comes from real runs: --check re-runs one from an empty scratch folder and finds every value equal;
    a value changed in the record is named (exit 1). (The later invocations run in this process.)"""
    paper = tiny_paper(tmp_path)
    args = [paper, "--table", "t1", "--seeds", "1", "--parallel", "2", "--out", str(tmp_path / "o"), *TINY,
            f"data.root={tmp_path / 'data'}"]
    res = run_cli(args, cwd=tmp_path, script=("-m", "fl.reproduce"))
    assert res.returncode == 0, res.stderr[-2000:] + res.stdout[-2000:]
    assert "| FedAvg | 60.0 ± 1.0 | 2 |" in res.stdout
    # the tiny twin's FedAvg is far from the paper's 60: outside its regime, the claims are read, not judged
    assert "**NOT JUDGED (regime)** `prox_above`" in res.stdout and "1 seed: no spread to compare" in res.stdout
    runs = sorted((tmp_path / "o" / "tiny" / "twin" / "runs" / "tiny_compare").glob("*/summary.json"))
    assert len(runs) == 2
    assert main(args) == 0
    again = capsys.readouterr().out
    assert "reusing 4 of 4 runs" in again  # 2 arms, and each at twice the rounds
    assert res.stdout.split("## Claims")[1] == again.split("## Claims")[1]

    record = tmp_path / "o" / "tiny" / "twin" / "reproduce.json"
    check = [paper, "--check", "--record", str(record), "--runs", "1", "--parallel", "1"]
    assert main(check) == 0
    out = capsys.readouterr().out
    assert "every recorded value of the 1 runs is equal, bit for bit" in out
    doc = json.loads(record.read_text())
    checked = out.split("the cheapest first: ")[1].split(")")[0]
    entry = next(r for r in doc["runs"] if r["run"] == checked)
    recorded = entry["final"]["test/acc_mean_clients"]
    entry["final"]["test/acc_mean_clients"] += 2 ** -40  # one bit of difference is a difference
    record.write_text(json.dumps(doc))
    assert main(check) == 1
    out = capsys.readouterr().out
    assert "DIFFERS: 1 of the " in out and f"  {checked}: final test/acc_mean_clients: recorded" in out
    assert "(|difference| 9.09e-13)" in out
    # a config that resolves differently (here: a setting added since the record, at a default that changes nothing)
    # is said; the values decide
    entry["final"]["test/acc_mean_clients"] = recorded
    entry["config_sha1"] = "0" * 40
    record.write_text(json.dumps(doc))
    assert main(check) == 0
    out = capsys.readouterr().out
    assert f"note: {checked}: the same overrides resolve to another config now" in out
    assert "every recorded value of the 1 runs is equal, bit for bit" in out
    # a logger.* override (where files go, what is drawn: the twins' logger.partition_plots=false) decides no number:
    # a record without it is checked; another deciding override stops the check before any run
    assert "logger.partition_plots=false" in entry["overrides"]
    entry["overrides"] = [a for a in entry["overrides"] if a != "logger.partition_plots=false"]
    record.write_text(json.dumps(doc))
    assert main(check) == 0
    entry["overrides"] = [*entry["overrides"], "trainer.rounds=3"]
    record.write_text(json.dumps(doc))
    assert main(check) == 1
    assert f"{checked}: its overrides changed" in capsys.readouterr().out


@pytest.mark.slow
def test_two_invocations_into_one_out_run_every_run_once(tmp_path):
    """Each takes a run's lock before training it (fl/sweep/run_lock.py): the second waits for a run the first
    trains and reuses it, rather than training a copy (<run>-1) beside it."""
    paper = tiny_paper(tmp_path)
    args = [sys.executable, "-m", "fl.reproduce", paper, "--table", "t1", "--seeds", "2", "--parallel", "1",
            "--out", str(tmp_path / "o"), *TINY, f"data.root={tmp_path / 'data'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("FL_RUN_DIR", "WANDB_SERVICE")}  # as run_cli does
    env["PYTHONPATH"] = str(ROOT)
    procs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    runs = tmp_path / "o" / "tiny" / "twin" / "runs" / "tiny_compare"
    assert sorted(d.name.rsplit("-", 1)[1] for d in runs.iterdir() if d.name != "logs") == ["s0", "s0", "s1", "s1"]
    trained = [line for out, _ in outs for line in out.splitlines() if line.startswith("[") and " done " in line]
    assert len(trained) == 6, outs  # 2 arms x 2 seeds and each arm's seed 0 at twice the rounds, each trained once
    claims = [out.split("## Claims")[1].split("wrote ")[0] for out, _ in outs]
    assert claims[0] == claims[1]


def test_provenance_is_dirty_for_a_changed_input_not_for_published_outputs(tmp_path, monkeypatch):
    """bench/reproduce_budget.py publishes each paper as it ends: the next paper's record must not call its tree changed
    for that, and must for any change a run could read."""
    from fl.reproduce import record

    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "fl" / "reproduce").mkdir(parents=True)
    (tmp_path / "bench" / "reproduce").mkdir(parents=True)
    for path in ("fl/method.py", "fl/reproduce/twin_seconds.json", "bench/reproduce/paper.md"):
        (tmp_path / path).write_text("0\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    monkeypatch.setattr(record, "ROOT", tmp_path)
    assert record.provenance()["dirty"] is False
    for path in ("fl/reproduce/twin_seconds.json", "bench/reproduce/paper.md", "bench/reproduce/other.json"):
        (tmp_path / path).write_text("1\n")
    assert record.provenance()["dirty"] is False
    (tmp_path / "fl" / "method.py").write_text("1\n")
    assert record.provenance()["dirty"] is True
    subprocess.run([*git, "checkout", "-q", "fl/method.py"], check=True)
    (tmp_path / "conf.yaml").write_text("new\n")  # an untracked input counts too
    assert record.provenance()["dirty"] is True
