"""Per-client validation splits (`data.val_fraction`): drawn from each client's training data, seeded; val/*
metrics from the same evaluation code as test/*; model selection on them in fl.sweep and fl.report."""
import json

import numpy as np
import pytest
import torch

from fl.config import load_config
from fl.data import build_data
from fl.report.summary import summarize_history
from fl.sweep.runner import Job, results
from fl.sweep.spec import parse_sweep
from tests.helpers import orchestrator, tiny


def positions(data, kind):
    """Each client's index list of the given split kind, from the partition record (train, test[, val])."""
    per_client = len(data.partition) // data.num_clients
    return [data.partition[per_client * c + {"train": 0, "test": 1, "val": 2}[kind]].numpy()
            for c in range(data.num_clients)]


def test_validation_is_held_out_of_each_clients_training_data_and_seeded(tmp_path):
    plain = build_data(load_config(tiny(tmp_path)))
    data = build_data(load_config(tiny(tmp_path, "data.val_fraction=0.25")))
    again = build_data(load_config(tiny(tmp_path, "data.val_fraction=0.25")))
    assert data.fingerprint() == again.fingerprint() != plain.fingerprint()
    assert not plain.has_validation and data.has_validation
    for before, train, val, test, test0 in zip(positions(plain, "train"), positions(data, "train"),
                                               positions(data, "val"), positions(data, "test"),
                                               positions(plain, "test")):
        assert np.array_equal(np.sort(np.concatenate([train, val])), before)  # carved out of the training data
        assert len(val) == max(1, round(0.25 * len(before)))
        assert np.array_equal(test, test0)  # the test sets do not move
    assert all(len(c.val) == len(v) for c, v in zip(data.clients, positions(data, "val")))


def test_validation_metrics_are_the_test_metrics_computed_on_the_validation_splits(tmp_path):
    """With every client's validation split set to its test split, val/X equals test/X for every metric, the
    system accuracy and client/<i>/val_acc included: the two evaluations are one code path."""
    torch.set_num_threads(1)
    cfg = load_config(tiny(tmp_path, "data.val_fraction=0.2", "method.name=fedper", "trainer.participation=1.0"))
    orch = orchestrator(cfg, tmp_path / "run")
    for c in orch.data.clients:
        c.val = c.test
    orch.train_client(0, 0)
    metrics = orch.evaluate(orch.context(0))
    vals = {k[len("val/"):]: v for k, v in metrics.items() if k.startswith("val/")}
    assert {"acc_mean_clients", "acc_weighted", "system_acc"} <= vals.keys()
    for key, value in vals.items():
        assert value == pytest.approx(metrics["test/" + key], abs=1e-12), key
    for cid in range(orch.data.num_clients):
        assert metrics[f"client/{cid}/val_acc"] == metrics[f"client/{cid}/acc"]


def test_summary_records_the_test_metrics_at_each_validation_metrics_best_round():
    history = [{"round": 0, "val/acc_mean_clients": 0.5, "test/acc_mean_clients": 0.4},
               {"round": 1, "val/acc_mean_clients": 0.7, "test/acc_mean_clients": 0.6},
               {"round": 2, "val/acc_mean_clients": 0.6, "test/acc_mean_clients": 0.8}]
    at = summarize_history(history, 2)["at_best"]["val/acc_mean_clients"]
    assert at == {"round": 1, "test/acc_mean_clients": 0.6}


def test_sweep_results_show_the_test_metric_of_the_point_the_validation_metric_picks(tmp_path):
    command = ["python", "-m", "fl.train", "conf=quickstart", "${args_no_hyphens}"]
    sweep = parse_sweep({"program": "fl.train", "command": command, "method": "grid",
                         "metric": {"name": "val/acc_mean_clients", "goal": "maximize"},
                         "parameters": {"optim.lr": {"values": [0.1, 0.2]}}})
    jobs = []
    for i, (val, test) in enumerate([(0.6, 0.55), (0.7, 0.5)]):
        run_dir = tmp_path / f"p{i}-s0"
        run_dir.mkdir()
        final = {"val/acc_mean_clients": val, "test/acc_mean_clients": test}
        (run_dir / "summary.json").write_text(json.dumps({"final": final}))
        (run_dir / "config.yaml").write_text("seed: 0\n")  # a run writes it when it starts
        jobs.append(Job(f"p{i}", {"optim.lr": 0.1 * (i + 1)}, 0, run_dir))
    table = results(sweep, jobs)
    assert [(e["mean"], e["test_mean"]) for e in table] == [(0.6, 0.55), (0.7, 0.5)]
