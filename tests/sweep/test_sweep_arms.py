"""Sweep arms: a method with its own overrides, crossed with the shared grid and seeds. W&B's agent passes
`arm=NAME` and every `arms.<name>` constant to fl.train; the offline runner passes the arm's overrides. Both must give
the same run, and the comparison sweeps converted to arms must resolve to the runs they resolved to before."""
import copy
import json

import pytest
import yaml
from omegaconf import OmegaConf

from fl.config import ConfigError, expand_arms, load_config
from fl.run.train import main as train_main
from fl.sweep.runner import plan_points, point_id
from fl.sweep.spec import expand, load_sweep, parse_sweep
from tests.helpers import ROOT

BASE = {
    "program": "fl.train",
    "command": ["${env}", "python", "-m", "fl.train", "conf=quickstart", "trainer.rounds=4", "trainer.last_k=1",
                "${args_no_hyphens}"],
    "method": "grid",
    "metric": {"name": "test/acc_mean_clients", "goal": "maximize"},
    "parameters": {"arm": {"values": ["fedavg_ft", "prox"]},
                   "arms.fedavg_ft": {"value": "method.name=fedavg finetune.after_round=3"},
                   "arms.prox": {"value": "method.name=fedprox method.mu=0.5"},
                   "optim.lr": {"values": [0.01, 0.1]}, "seed": {"values": [0, 1]}},
}


def doc(**params):
    d = copy.deepcopy(BASE)
    d["parameters"].update(params)
    return d


def test_arms_are_crossed_with_the_grid_and_each_run_gets_its_arms_overrides():
    sweep = parse_sweep(BASE)
    points = expand(sweep)
    assert {(p["arm"], p["optim.lr"]) for p in points} == {(a, lr) for a in ("fedavg_ft", "prox") for lr in (0.01, 0.1)}
    assert "arms.prox" not in sweep.params  # a definition, not a parameter the runs vary
    ft = next(p for p in points if p["arm"] == "fedavg_ft")
    assert sweep.point_argv(ft) == ["conf=quickstart", "trainer.rounds=4", "trainer.last_k=1", "method.name=fedavg",
                                    "finetune.after_round=3", f"optim.lr={ft['optim.lr']}"]
    cfg = load_config(sweep.point_argv(next(p for p in points if p["arm"] == "prox")))
    assert cfg.method.name == "fedprox" and cfg.method.mu == 0.5 and cfg.finetune.after_round is None
    assert point_id(0, ft).startswith("p000-armfedavg_ft")


def test_what_wandbs_agent_passes_resolves_to_the_runners_run():
    """${args_no_hyphens}: every parameter as key=value (the arms' constants included), after the command's own."""
    sweep = parse_sweep(BASE)
    for point in expand(sweep):
        wandb = sweep.wandb_args(point)
        assert any(a.startswith("arms.prox=method.name=fedprox") for a in wandb)
        offline = load_config(sweep.point_argv(point))
        assert OmegaConf.to_container(load_config(wandb)) == OmegaConf.to_container(offline)


def test_fl_train_takes_the_arm_parameter(capsys):
    argv = ["conf=quickstart", "arm=prox", "arms.prox=method.name=fedprox method.mu=0.5",
            "arms.ft=method.name=fedavg finetune.after_round=3", "--print-config"]
    assert train_main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["method"]["name"] == "fedprox" and printed["method"]["mu"] == 0.5
    assert "arm" not in printed and "arms" not in printed
    assert train_main(["conf=quickstart", "arm=nope", "arms.prox=method.name=fedprox", "--print-config"]) == 2
    assert "arm='nope' has no definition arms.nope=" in capsys.readouterr().err


def test_an_arm_goes_where_arm_stood_so_a_later_argument_still_wins():
    assert expand_arms(["conf=a", "arm=x", "optim.lr=0.1", "arms.x=conf=b optim.lr=0.5", "arms.y=conf=c"]) == [
        "conf=a", "conf=b", "optim.lr=0.5", "optim.lr=0.1"]
    assert expand_arms(["conf=a", "optim.lr=0.1"]) == ["conf=a", "optim.lr=0.1"]


@pytest.mark.parametrize("argv, message", [
    (["arms.x=method.name=fedavg"], "given without arm=NAME"),
    (["arm=x", "arm=y", "arms.x=method.name=fedavg", "arms.y=method.name=fedavg"], "arm= given 2 times"),
    (["arm=x", "arms.x="], "needs at least one key=value"),
    (["arm=x", "arms.x=method.name"], "'method.name' is not key=value"),
    (["arm=x", "arms.x=seed=3"], "may not set seed"),
])
def test_bad_arm_arguments_are_one_line_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        expand_arms(argv)


@pytest.mark.parametrize("params, message", [
    ({"arm": {"values": ["fedavg_ft", "prox", "gone"]}}, r"parameters\.arm: 'gone' has no definition"),
    ({"arms.extra": {"value": "method.name=fedavg"}}, r"parameters\.arms\.extra: defined but not among"),
    ({"arms.prox": {"value": "method.name=fedprox optim.lr=0.3"}}, r"sets optim\.lr, which the sweep also varies"),
    ({"arms.prox": {"values": ["method.name=fedprox"]}}, r"expected \{value: 'key=value \.\.\.'\}"),
    ({"arms.prox": {"value": "method.name=fedprox seed=4"}}, "may not set seed"),
])
def test_malformed_arms_name_the_bad_field(params, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep(doc(**params))
    alone = copy.deepcopy(BASE)
    del alone["parameters"]["arm"]
    with pytest.raises(ConfigError, match="no parameter 'arm'"):
        parse_sweep(alone)


BEFORE = ROOT / "tests" / "data" / "sweeps_before_arms"  # the comparison sweeps as they were before arms
# what a converted file runs beyond its old version: FedBN, which needs model.norm=batch, is an arm of its own now;
# FedAvgFT of Table 4 fine-tunes 5 epochs as the paper does, where the file without arms could only run the default 1
ADDED = {"compare_hybrid_synthetic": ["method.name=fedbn", "model.norm=batch"],
         **{f"pfedfda_new_clients_{s}": ["method.name=fedavg_ft", "method.finetune_epochs=5"]
            for s in ("real", "synthetic")}}
DROPPED = {f"pfedfda_new_clients_{s}": ["method.name=fedavg_ft"] for s in ("real", "synthetic")}


def resolved_runs(path, tmp_path) -> dict[str, list[str]]:
    """Every (point, seed) run of a sweep file as its resolved config (what decides its numbers) -> the arguments
    that made it."""
    sweep = load_sweep(path)
    seeds = [int(s) for s in sweep.params["seed"]["values"]] if "seed" in sweep.params else [None]
    jobs = plan_points(sweep, expand(sweep), tmp_path, seeds, [])
    return {json.dumps(j.config, sort_keys=True, default=str): sweep.point_argv(j.point) for j in jobs}


@pytest.mark.parametrize("name", sorted(p.stem for p in BEFORE.glob("*.yaml")))
def test_converted_sweeps_resolve_to_the_runs_they_resolved_to_before(name, tmp_path):
    before = resolved_runs(BEFORE / f"{name}.yaml", tmp_path)
    after = resolved_runs(ROOT / "sweeps" / f"{name}.yaml", tmp_path)
    assert load_sweep(ROOT / "sweeps" / f"{name}.yaml").arms, f"{name} is not converted to arms"
    dropped = [argv for key, argv in before.items() if key not in after]
    if name in DROPPED:
        assert dropped and all(all(a in argv for a in DROPPED[name]) for argv in dropped)
    else:
        assert not dropped
    added = [argv for key, argv in after.items() if key not in before]
    if name in ADDED:
        assert added and all(all(a in argv for a in ADDED[name]) for argv in added)
    else:
        assert not added
