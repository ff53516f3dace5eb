"""Evaluation scores each distinct test image once per distinct model (fl/core/evaluation.py,
fl/core/global_predictions.py): with data.test_split=official a FedAvg run takes every client's accuracy from the
global model's predictions on the official test set, and every metric of the run is bitwise what the per-client
passes it replaces give (`shares_global_passes` patched to False: the path personalized models take); a method
whose clients evaluate models of their own keeps its own passes."""
from __future__ import annotations

from pathlib import Path

import torch

from fl.config import load_config
from fl.core import ClientModule, evaluation
from fl.data import build_data
from tests.helpers import read_metrics, run_tiny, tiny
from tests.process_pairs import on_one_and_two_processes

OFFICIAL = ("data.test_split=official", "trainer.rounds=3")  # TINY evaluates every round: 3 evaluations of 6 clients


def record_passes(monkeypatch) -> list[tuple[int, str]]:
    """(the loaded client, what was scored) for every evaluation pass: 'pooled' (the pooled test set), 'client' (a
    client's own test split) or 'other' (training data, ...)."""
    passes = []
    original = ClientModule.eval_pass

    def eval_pass(self, split, *args, **kwargs):
        kind = ("pooled" if split is self.data.pooled_test() else
                "client" if any(split is c.test for c in self.data.clients) else "other")
        passes.append((self.cid, kind))
        return original(self, split, *args, **kwargs)

    monkeypatch.setattr(ClientModule, "eval_pass", eval_pass)
    return passes


def shared_and_per_client(out, monkeypatch, *extra: str) -> tuple[list[dict], list[dict], list, list]:
    """The same tiny run as the loop evaluates it and with every client's own pass; (metrics, metrics, passes,
    passes)."""
    passes = record_passes(monkeypatch)
    shared = run_tiny(out, *extra, name="shared")
    shared_passes, passes[:] = list(passes), []
    monkeypatch.setattr(evaluation, "shares_global_passes", lambda ctx: False)
    reference = run_tiny(out, *extra, name="per_client")
    return read_metrics(shared), read_metrics(reference), shared_passes, list(passes)


def test_fedavg_scores_the_official_test_set_once_per_evaluation_and_gives_the_per_client_numbers(out, monkeypatch):
    shared, reference, shared_passes, reference_passes = shared_and_per_client(out, monkeypatch, *OFFICIAL)
    assert shared == reference  # every metric of every round, bit for bit
    assert {"test/acc_mean_clients", "test/acc_global_micro", "test/acc_global_balanced", "client/0/acc"} <= set(
        shared[-1])
    # the global model scores the official test set once per evaluation (the pooled accuracy and the global-model
    # evaluator share it); the clients' test sets are scored only by the per-client path
    assert shared_passes.count((-1, "pooled")) == reference_passes.count((-1, "pooled")) == 3
    assert [kind for _, kind in shared_passes].count("client") == 0
    assert [kind for _, kind in reference_passes].count("client") == 3 * 6


def test_clients_that_evaluate_models_of_their_own_keep_their_passes(out, monkeypatch):
    # FedAvg-FT fine-tunes each client's copy before its evaluation: no client's model is the global one
    shared, reference, shared_passes, _ = shared_and_per_client(out, monkeypatch, *OFFICIAL, "method.name=fedavg_ft")
    assert shared == reference
    assert [kind for _, kind in shared_passes].count("client") == 3 * 6


def test_official_client_test_sets_are_rows_of_the_global_test_set_unless_their_images_change(out):
    data = build_data(load_config(tiny(out, "data.test_split=official")))
    for cid, c in enumerate(data.clients):
        rows = data.pooled_test_rows(cid)
        assert torch.equal(data.pooled_test().x[rows], c.test.x) and torch.equal(data.pooled_test().y[rows], c.test.y)
    moved = data.to("cpu", torch.float64)
    assert all(torch.equal(a.test_rows, b.test_rows) for a, b in zip(data.clients, moved.clients))
    shifted = build_data(load_config(tiny(out, "data.test_split=official", "data.client_transform.name=feddrm_color")))
    assert all(shifted.pooled_test_rows(cid) is None for cid in range(shifted.num_clients))


def test_without_a_global_test_set_the_pooled_test_set_is_the_clients_splits_in_order(out):
    data = build_data(load_config(tiny(out, "data.val_fraction=0.25"))).validation_view()
    assert data.global_test is None
    for cid, c in enumerate(data.clients):
        rows = data.pooled_test_rows(cid)
        assert torch.equal(data.pooled_test().x[rows], c.test.x) and torch.equal(data.pooled_test().y[rows], c.test.y)


@on_one_and_two_processes("shared_evaluation", *OFFICIAL)
def shared_evaluation_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    """With the test above (1 process: the shared passes give the per-client numbers), 2 processes do too."""
    assert read_metrics(one) == read_metrics(two)
