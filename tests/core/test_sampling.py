"""Client sampling (trainer.sampling): a stream fixed by (seed, round), the same for every method."""
import numpy as np
import pytest

from fl.config import load_config
from fl.core import sample_clients
from tests.helpers import read_metrics, run_tiny


def test_fixed_sampling_draws_round_q_m_clients_without_replacement():
    for rnd in range(20):
        s = sample_clients(3, rnd, 100, 0.3)
        assert len(s) == 30 == len(set(s)) and s == sorted(s)
    assert sample_clients(3, 0, 100, 0.001) != [] and sample_clients(3, 0, 5, 1.0) == list(range(5))


def test_bernoulli_sampling_draws_each_client_with_probability_q_and_is_seeded():
    draws = [sample_clients(3, rnd, 100, 0.3, "bernoulli") for rnd in range(400)]
    counts = np.array([len(d) for d in draws])
    assert counts.mean() == pytest.approx(30, abs=0.6)  # 400 rounds x Binomial(100, 0.3): sd of the mean 0.23
    assert counts.std() == pytest.approx(np.sqrt(100 * 0.3 * 0.7), rel=0.15) and len(set(counts)) > 5
    per_client = np.bincount(np.concatenate(draws), minlength=100) / 400
    assert abs(per_client - 0.3).max() < 0.12  # each client, independently
    assert draws[7] == sample_clients(3, 7, 100, 0.3, "bernoulli") != sample_clients(4, 7, 100, 0.3, "bernoulli")


def test_an_empty_bernoulli_round_trains_nothing_and_still_evaluates(out):
    # 6 clients at q = 0.1: rounds 0-3 of seed 0 draw none, some, ... (checked below against the stream)
    rounds = 4
    expected = [len(sample_clients(0, r, 6, 0.1, "bernoulli")) for r in range(rounds)]
    assert 0 in expected and any(expected)
    rows = read_metrics(run_tiny(out, "trainer.sampling=bernoulli", "trainer.participation=0.1",
                                 f"trainer.rounds={rounds}", name="bern"))
    assert [r["train/clients"] for r in rows] == expected
    assert all("test/acc_mean_clients" in r for r in rows)  # evaluation runs every round, empty or not


def test_pfedfdas_protocol_samples_clients_independently():
    for conf in ("pfedfda_cifar10_dir05", "pfedfda_emnist", "ditto_cifar10_dir05"):
        assert load_config([f"conf={conf}"]).trainer.sampling == "bernoulli", conf
