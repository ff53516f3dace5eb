"""What start-up says about the clients (fl/run/preflight.py): those that take no local step, named with their count,
and under trainer.drop_last those smaller than a batch; a client without data logs no loss and does not pull
train/loss toward 0."""
from __future__ import annotations

import pytest

from fl.config import load_config
from fl.data import build_data
from fl.run.preflight import client_notes
from fl.run.train import main
from tests.helpers import read_metrics, tiny

# the tiny federation's clients hold 50-88 samples: test_fraction=0.993 leaves those of at most 71 without training data
MOSTLY_TEST = "data.test_fraction=0.993"


def clients_of(args):
    cfg = load_config(args)
    return cfg, build_data(cfg)


def test_clients_without_training_data_are_named_and_do_not_pull_the_training_loss_to_0(out, capsys):
    args = tiny(out, MOSTLY_TEST, "fabric.cpu_threads=1", "logger.run_name=r")
    _, data = clients_of(args)
    empty = [cid for cid, c in enumerate(data.clients) if len(c.train) == 0]
    assert 0 < len(empty) < data.num_clients
    assert main(args) == 0
    named = [line for line in capsys.readouterr().err.splitlines() if "no local step" in line]
    assert named == [f"warning: {len(empty)} of {data.num_clients} training clients take no local step, as they hold "
                     f"no training data: clients {', '.join(map(str, empty))}"]
    for row in read_metrics(out / "outputs" / "r"):
        assert not any(f"client/{cid}/loss" in row for cid in empty)
        trained = [row[f"client/{cid}/loss"] for cid in range(data.num_clients) if f"client/{cid}/loss" in row]
        if trained:
            assert row["train/loss"] == pytest.approx(sum(trained) / len(trained))
        else:
            assert "train/loss" not in row


def test_drop_last_names_the_clients_smaller_than_a_batch_which_train_on_one_batch_of_all_their_samples(out):
    cfg, data = clients_of(tiny(out, "trainer.drop_last=true", "trainer.batch_size=50"))
    short = [cid for cid, c in enumerate(data.clients) if len(c.train) < 50]
    assert 0 < len(short) < data.num_clients
    notes = client_notes(cfg, data)
    assert len(notes) == 1 and notes[0].startswith(
        f"notice: {len(short)} of {data.num_clients} training clients hold fewer than trainer.batch_size=50 training "
        f"samples (clients {', '.join(map(str, short))}): with trainer.drop_last=true")
    cfg.trainer.drop_last = False
    assert client_notes(cfg, data) == []  # without drop_last a short last batch is the rule, not news


def test_a_method_that_trains_on_pooled_data_is_not_judged_by_the_clients_sizes(out):
    cfg, data = clients_of(tiny(out, MOSTLY_TEST))
    assert client_notes(cfg, data)  # FedAvg: the empty clients are named
    cfg, data = clients_of(tiny(out, MOSTLY_TEST, "method.name=centralized"))
    assert client_notes(cfg, data) == []
