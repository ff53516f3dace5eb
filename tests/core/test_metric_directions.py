"""Each metric declares which way is better where it is logged (fl/core/metric_directions.py), and summaries, the
console, reports, early stopping and sweeps use it (issue 34, item 4): a user's lower-is-better metric gets best =
its minimum (the name rule gave it the maximum), a diagnostic gets no best, and the method's own metrics appear in
the console's diagnostics."""
from __future__ import annotations

import json

import pytest
import yaml

from fl.config import ConfigError, load_config
from fl.core import Server, registry
from fl.core.client import ClientModule
from fl.core.metric_directions import HIGHER, LOWER, NEITHER, declared, directions_of, lookup
from fl.core.run_metrics import diagnostics, run_directions
from fl.report.cli import write_report
from fl.report.groups import group_runs
from fl.report.runs import load_local
from fl.report.summary import summarize_history
from fl.report.tables import model_selection
from fl.sweep.runner import main as sweep_main
from fl.sweep.spec import load_sweep, make_sweep
from tests.helpers import run_tiny
from tests.report.test_report import cell, fake_run


class Base(ClientModule):
    metric_directions = {"ce": LOWER, "gap": HIGHER}


class Child(Base):
    metric_directions = {"gap": LOWER, "share": NEITHER}


def test_declarations_merge_over_the_bases_and_patterns_match_by_prefix():
    assert declared(Child) == {"loss": LOWER, "ce": LOWER, "gap": LOWER, "share": NEITHER}
    d = {"server/alpha/*": NEITHER, "server/alpha/best*": HIGHER, "test/acc": HIGHER}
    assert lookup("server/alpha/3", d) == (True, NEITHER) and lookup("server/alpha/best0", d) == (True, HIGHER)
    assert lookup("test/acc", d) == (True, HIGHER) and lookup("test/other", d) == (False, NEITHER)
    assert directions_of(["test/acc", "server/alpha/1", "x"], d) == {"test/acc": HIGHER, "server/alpha/1": NEITHER}
    bad = type("Bad", (Server,), {"metric_directions": {"server/x": "lower"}})
    with pytest.raises(ValueError, match=r"Bad.metric_directions\['server/x'\] = 'lower'; .* HIGHER \('max'\)"):
        declared(bad)


def test_every_registered_method_and_evaluator_declares_valid_directions():
    registry.load_plugins()
    for spec in registry.METHODS.values():
        assert declared(spec.client_cls)["loss"] == LOWER and isinstance(declared(spec.server_cls), dict)
    for cls in registry.EVALUATORS.values():
        assert all(k.startswith(("test/", "val/", "server/")) for k in declared(cls)), cls


def test_a_runs_metrics_are_known_from_the_config_before_it_starts():
    fedavg = run_directions(load_config([]))
    assert fedavg["test/acc_std_clients"] == LOWER and fedavg["test/acc_mean_clients"] == HIGHER
    assert fedavg["train/loss"] == LOWER and fedavg["train/clients"] is NEITHER
    assert not [k for k in fedavg if k.startswith(("val/", "server/", "test/system"))]  # no splits, one model
    assert "val/acc_global_balanced" in run_directions(load_config(["data.val_fraction=0.1"]))
    # own models from round 2
    tuned = run_directions(load_config(["trainer.rounds=4", "finetune.after_round=2", "trainer.last_k=1"]))
    assert tuned["test/system_acc"] == HIGHER and "test/routing_acc" not in tuned
    pals = run_directions(load_config(["conf=fedpals_cifar10_c2_synthetic"]))
    assert pals["val/target_acc"] == HIGHER and pals["server/alpha/*"] is NEITHER and pals["train/prox"] == LOWER
    drm = run_directions(load_config(["method.name=feddrm"]))
    assert drm["test/routing_acc"] == HIGHER and drm["server/el_marginal_gap"] == LOWER
    assert "test/acc_global_micro" not in drm  # FedDRM has no global model
    assert diagnostics(load_config(["conf=fedpals_cifar10_c2_synthetic"]))[:3] == [
        "train/ce", "train/prox", "server/ess"]


def test_a_summary_takes_each_metrics_declared_direction():
    history = [{"round": r, "test/risk": v, "server/share": 0.1 * r, "test/undeclared": v}
               for r, v in enumerate([0.9, 0.2, 0.5])]
    s = summarize_history(history, 5, {"test/risk": LOWER, "server/share": NEITHER})
    assert (s["best"], s["best_round"]) == ({"test/risk": 0.2}, {"test/risk": 1})  # the name rule said max: 0.9
    assert s["directions"] == {"test/risk": LOWER, "server/share": NEITHER}
    legacy = summarize_history(history, 5)  # a run read from W&B without recorded directions: the old rule
    assert legacy["best"]["test/risk"] == 0.9 and "directions" not in legacy


def test_a_users_lower_is_better_metric_and_the_methods_own_in_a_run(out, capsys):
    """FedNova's server/tau_* (diagnostics) and a callback's test/risk (lower is better): best = the minimum, early
    stopping counts down from it, the console lists both under diagnostics, and an undeclared metric gets a notice
    and no best."""
    risk = [0.9, 0.2, 0.5, 0.6]
    callbacks = ("callbacks=[{class: tests.recording_callbacks.ScriptedRisk, values: [0.9, 0.2, 0.5, 0.6]}, "
                 "{class: tests.recording_callbacks.ScriptedMetric, key: test/undeclared, values: [1, 2, 3, 4]}]")
    run = run_tiny(out, "method.name=fednova", "trainer.rounds=4", callbacks, "trainer.early_stop.metric=test/risk",
                   "trainer.early_stop.patience=2", name="risk")
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["best"]["test/risk"], summary["best_round"]["test/risk"]) == (0.2, 1)
    assert summary["stopped"]["round"] == 3 and summary["final"]["test/risk"] == risk[3]
    assert summary["directions"]["server/tau_eff"] is None and "server/tau_eff" not in summary["best"]
    assert "test/undeclared" not in summary["best"] and "test/undeclared" not in summary["directions"]
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    below = lines[lines.index("diagnostics"):]
    row = next(line.split() for line in below if line.startswith("test/risk"))
    assert row[1:4] == ["0.6000", "0.2000", "1"]
    tau = next(line.split() for line in below if line.startswith("server/tau_eff"))
    assert tau[2:4] == ["—", "—"]
    assert "notice: test/undeclared was logged without a declared direction" in captured.err


def test_reports_bold_and_select_by_the_recorded_direction(tmp_path):
    """A metric declared lower-is-better though its name has no 'loss' in it: the lowest is bold and the variant
    with the lowest validation value is selected; a diagnostic is never bold."""
    declared_directions = {"test/acc_mean_clients": HIGHER, "test/gap": LOWER, "val/gap": LOWER,
                           "test/share": NEITHER}
    for seed in (0, 1):
        for method, gap in (("fedavg", 0.4), ("fedprox", 0.1)):
            run = fake_run(tmp_path / "runs", f"{method}-s{seed}", {"name": method}, seed, [0.3, 0.5],
                           extra={"test/gap": gap, "test/share": gap})
            history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            summary = json.loads((run / "summary.json").read_text())
            summary.update(summarize_history(history, 2, declared_directions))
            (run / "summary.json").write_text(json.dumps(summary))
    runs, _ = load_local([tmp_path / "runs"])
    md = write_report(runs, tmp_path / "report", ["test/gap", "test/share"], plots=False)["markdown"].read_text()
    head = cell(md, "setting")
    gap, share = head.index("test/gap final"), head.index("test/share final")
    assert cell(md, "fedprox")[gap] == "**0.1000 ± 0.0000**" and cell(md, "fedavg")[gap] == "0.4000 ± 0.0000"
    assert "**" not in cell(md, "fedprox")[share] + cell(md, "fedavg")[share]

    for mu, seed, v in ((0.0, 0, 0.5), (1.0, 0, 0.7), (0.0, 1, 0.8), (1.0, 1, 0.6)):
        run = fake_run(tmp_path / "sel", f"prox-{mu}-s{seed}", {"name": "fedprox", "mu": mu}, seed, [0.3, 0.6],
                       extra={"val/gap": lambda i, v=v: v + 0.1 * (1 - i), "test/gap": lambda i, v=v: v / 2})
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((run / "summary.json").read_text())
        summary.update(summarize_history(history, 2, declared_directions))
        (run / "summary.json").write_text(json.dumps(summary))
    runs, _ = load_local([tmp_path / "sel"])
    (row,) = model_selection(group_runs(runs), "val/gap")
    assert row["chosen"] == ["fedprox mu=0.0", "fedprox mu=1.0"]  # each seed's lowest val/gap: 0.5, 0.6


def test_a_made_sweep_can_name_a_method_and_selects_on_a_validation_metric_in_its_direction(tmp_path, capsys):
    """`--make method.name=fedprox` was refused, and the file it wrote selected on test/acc_mean_clients."""
    doc = make_sweep("quickstart", ["method.mu"], overrides=["method.name=fedprox"])
    assert doc["command"][4:7] == ["conf=quickstart", "method.name=fedprox", "data.val_fraction=0.1"]
    assert doc["metric"] == {"name": "val/acc_mean_clients", "goal": "maximize"}
    assert make_sweep("quickstart", ["method.mu"], metric="val/acc_std_clients",
                      overrides=["method.name=fedprox"])["metric"]["goal"] == "minimize"
    with pytest.raises(ConfigError, match="metric.goal='minimize' is against val/acc_mean_clients"):
        make_sweep("quickstart", ["method.mu"], goal="minimize", overrides=["method.name=fedprox"])
    with pytest.raises(ConfigError, match="metric.name='val/nope' is not a metric these runs log"):
        make_sweep("quickstart", ["method.mu"], metric="val/nope", overrides=["method.name=fedprox"])
    out = tmp_path / "mu.yaml"
    assert sweep_main(["--make", "conf=quickstart", "method.name=fedprox", "params=method.mu", f"out={out}"]) == 0
    assert load_sweep(out).fixed_args == ["conf=quickstart", "method.name=fedprox", "data.val_fraction=0.1"]


def test_a_sweep_file_whose_goal_is_against_its_metric_stops_before_any_run(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({
        "program": "fl.train", "method": "grid", "metric": {"name": "test/acc_mean_clients", "goal": "minimize"},
        "command": ["${env}", "python", "-m", "fl.train", "conf=quickstart", "${args_no_hyphens}"],
        "parameters": {"optim.lr": {"values": [0.1]}}}))
    assert sweep_main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the sweep's metric.goal='minimize' is against test/acc_mean_clients" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_robust_aggregators_count_of_faulty_uploads_is_known_before_the_run():
    assert "server/faulty_uploads" not in run_directions(load_config([]))  # the mean stops at a faulty upload
    assert run_directions(load_config(["server.aggregator.name=median"]))["server/faulty_uploads"] == LOWER
