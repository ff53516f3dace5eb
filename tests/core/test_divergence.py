"""Finite divergence (fl/core/divergence.py): the rule in closed form, trainer.on_divergence=stop (exit 1, the last
checkpoint kept, summary.json marked) and warn (the run goes on, marked), pFedFDA's paper regularisation on a few
shifted samples per client, and healthy runs left unmarked."""
from __future__ import annotations

import json
import math

import pytest
import torch

import tests.diverge_at_round  # noqa: F401  (registers method test_loss_grows_at_round_2)
from fl.core.divergence import GROWTH, find_divergence, parameter_norm, reference_loss, squared_norms
from fl.run.train import main
from tests.helpers import load_ckpt, read_metrics, run_tiny, tiny

GROWING = ["method.name=test_loss_grows_at_round_2", "trainer.rounds=4", "trainer.checkpoint_every=1",
           "fabric.cpu_threads=1"]


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# ---- the rule ----------------------------------------------------------------------------------------------------
def test_the_loss_rule_compares_with_the_first_trained_rounds_mean_floored_at_one():
    history = [{"round": 0, "train/clients": 0.0}, {"round": 1, "train/loss": 2.5}, {"round": 2, "train/loss": 9.0}]
    assert reference_loss(history) == 2.5  # round 0 trained no client
    assert reference_loss([]) is None
    at_limit = [(4, {"loss": GROWTH * 2.5}, None)]
    assert find_divergence(3, "m", at_limit, 2.5) is None
    above = find_divergence(3, "m", [(1, {"loss": 1.0}, None), (4, {"loss": GROWTH * 2.5 + 1}, None)], 2.5)
    assert (above.round, above.client, above.method) == (3, 4, "m") and "training loss" in above.reason
    # a loss that starts near 0 may grow to the floor's GROWTH x 1 without counting
    assert find_divergence(3, "m", [(0, {"loss": 0.9 * GROWTH}, None)], 0.001) is None
    assert find_divergence(3, "m", [(0, {"loss": 1.1 * GROWTH}, None)], 0.001) is not None
    # no reference yet (the first trained round): only the parameter rule applies
    assert find_divergence(0, "m", [(0, {"loss": 1e30}, None)], None) is None


def test_the_norm_rule_compares_with_the_initial_models_norm_of_the_same_tensors():
    assert find_divergence(0, "m", [(2, {}, (GROWTH * 3.0, 3.0))], None) is None
    found = find_divergence(0, "m", [(2, {}, (GROWTH * 3.0 + 1, 3.0))], None)
    assert found.client == 2 and "parameter norm" in found.reason
    assert find_divergence(0, "m", [(2, {}, (5.0, 0.0))], None) is None  # zero-initialised tensors: no reference


def test_parameter_norm_is_float64_without_overflow_and_non_finite_only_with_a_non_finite_entry():
    params = {"w": torch.full((4,), 1e30), "b": torch.tensor([3.0, 4.0]), "count": torch.tensor(7)}
    assert parameter_norm(params) == pytest.approx(math.sqrt(4 * 1e60 + 25), rel=1e-6)  # float32 squares overflow
    assert math.isinf(parameter_norm({"w": torch.tensor([1.0, float("inf")])}))
    assert math.isnan(parameter_norm({"w": torch.tensor([1.0, float("nan")])}))
    assert squared_norms(params) == pytest.approx({"w": 4e60, "b": 25.0})


# ---- stop and warn -----------------------------------------------------------------------------------------------
def test_a_diverging_run_stops_naming_method_client_round_keeps_its_checkpoint_and_is_marked(out, capsys):
    assert main(tiny(out, *GROWING, "logger.run_name=d")) == 1
    printed = capsys.readouterr()
    err = printed.err.strip().splitlines()
    assert printed.out.strip().splitlines()[-1].startswith("DIVERGED at client ")  # the summary of rounds 0-1
    assert len(err) == 1 and err[0].startswith("error: method 'test_loss_grows_at_round_2' diverged at client ")
    assert ", round 2: training loss" in err[0] and "last good checkpoint" in err[0]
    run_dir = out / "outputs" / "d"
    assert load_ckpt(run_dir)["round"] == 1  # round 2 was never committed
    marked = summary(run_dir)["diverged"]
    assert set(marked) == {"round", "client", "method", "reason"}
    assert marked["round"] == 2 and marked["method"] == "test_loss_grows_at_round_2"
    assert f"client {marked['client']}," in err[0] and marked["reason"] in err[0]
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1]
    # resumed with warn, it trains through: the same mark, every round
    assert main([f"resume={run_dir}", "trainer.on_divergence=warn"]) == 0
    assert summary(run_dir)["diverged"] == marked
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]
    assert "DIVERGED at client" in capsys.readouterr().out


def test_warn_goes_on_with_one_warning_and_marks_the_summary_across_a_resume(out, capsys):
    run_dir = run_tiny(out, *GROWING, "trainer.on_divergence=warn", "trainer.rounds=3", name="w")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "diverged" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: method 'test_loss_grows_at_round_2' diverged")
    marked = summary(run_dir)["diverged"]
    assert marked["round"] == 2 and len(read_metrics(run_dir)) == 3
    assert main([f"resume={run_dir}", "trainer.rounds=4"]) == 0  # the checkpoint carries the mark
    assert summary(run_dir)["diverged"] == marked and "diverged" not in capsys.readouterr().err


@pytest.mark.parametrize("conf", ["quickstart", "pfedfda_cifar10_dir01_synthetic"])
def test_healthy_runs_stay_two_orders_of_magnitude_below_the_rule_and_are_not_marked(out, capsys, monkeypatch, conf):
    """pFedFDA's Dir(0.1) twin had the largest loss ratio of the twins at this size (3.3)."""
    import fl.core.loop as loop

    ratios = {"loss": 0.0, "norm": 0.0}
    original = loop.find_divergence

    def recording(rnd, method, clients, first_loss):
        for _, logs, norms in clients:
            if first_loss is not None and "loss" in logs:
                ratios["loss"] = max(ratios["loss"], logs["loss"] / max(1.0, first_loss))
            if norms is not None and norms[1] > 0:
                ratios["norm"] = max(ratios["norm"], norms[0] / norms[1])
        return original(rnd, method, clients, first_loss)

    monkeypatch.setattr(loop, "find_divergence", recording)
    run_dir = run_tiny(out, f"conf={conf}", "data.num_clients=6", "data.embedded.samples_per_class=40",
                       "trainer.rounds=10", "trainer.eval_every=10", "trainer.evaluators=[]", name="ok")
    assert 0 < ratios["loss"] < GROWTH / 100 and 0 < ratios["norm"] < GROWTH / 100, ratios
    assert "diverged" not in summary(run_dir) and "diverged" not in capsys.readouterr().err


def test_pfedfda_with_the_papers_regularisation_on_few_shifted_samples_stops_instead_of_exiting_0(out, capsys):
    """The issue's case on the embedded data: CIFAR-S corruptions on every client, 48 training samples each, one
    local epoch: the training loss goes 1.97, 561, 1e6 while every number stays finite (and non-finite at round 4)."""
    args = ["conf=pfedfda_cifar10s_synthetic", "method.cov_reg=paper", "data.num_clients=10",
            "data.embedded.samples_per_class=60", "data.embedded.noise=0.6",  # the data the case was on
            "data.partition.min_client_size=20", "trainer.local_epochs=1",
            "trainer.rounds=3", "trainer.eval_every=3", "trainer.evaluators=[]", "logger.wandb.mode=disabled",
            "logger.progress=false", f"logger.output_dir={out / 'outputs'}", f"data.root={out / 'data'}",
            "logger.run_name=fda", "fabric.cpu_threads=1"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: method 'pfedfda' diverged at client ") and ", round 2: training loss" in err
    assert summary(out / "outputs" / "fda")["diverged"]["round"] == 2
    assert main([*args[:-2], "logger.run_name=fda_code", "fabric.cpu_threads=1", "method.cov_reg=code"]) == 0


@pytest.mark.slow
def test_a_divergence_under_two_processes_stops_both_is_reported_once_and_marked_once(out):
    from tests.helpers import ROOT, run_cli

    args = [*tiny(out, *GROWING, "logger.run_name=two"), "fabric.strategy=ddp", "fabric.devices=2"]
    res = run_cli(args, cwd=out, script=(str(ROOT / "tests" / "diverge_at_round.py"),))
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.count("diverged at client") == 1, res.stderr[-2000:]
    marked = summary(out / "outputs" / "two")["diverged"]
    assert marked["round"] == 2 and f"client {marked['client']}, round 2" in res.stderr
    assert load_ckpt(out / "outputs" / "two")["round"] == 1
