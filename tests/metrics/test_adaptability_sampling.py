"""The adaptability diagnostic's cheaper estimates (fl/metrics/adaptability.py, issue 45 item 1): each local model
scored on a stratified shard of the pooled test set (evaluators.adaptability.test_shards), P measured on at most
train_per_class images a class. Shards partition the set in proportion; averaged over the shards, a model's risk is
its whole-set risk; the logged standard error is the spread of the estimate over random shardings; with nothing
subsampled the numbers are the whole-set ones, bit for bit."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fl.metrics.adaptability import adaptability_risk, per_class_sample, sharded_risk_se, stratified_shards
from tests.helpers import assert_same_rows, read_metrics, run_tiny
from tests.process_pairs import on_one_and_two_processes

SHARDED = ("evaluators.adaptability.every=1", "evaluators.adaptability.test_shards=3",
           "evaluators.adaptability.train_per_class=4")


def per_class_errors(wrong: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, C: int) -> tuple[torch.Tensor, ...]:
    """(errors, wrong counts, totals) per class over `rows`."""
    total = torch.bincount(y[rows], minlength=C).double()
    miss = torch.bincount(y[rows], weights=wrong[rows].double(), minlength=C)
    return miss / total.clamp_min(1), miss, total


def test_shards_partition_the_rows_and_hold_every_class_in_proportion():
    y = torch.arange(7).repeat_interleave(torch.tensor([9, 10, 11, 3, 30, 4, 12]))
    shard = stratified_shards(y, 3, torch.Generator().manual_seed(0))
    assert shard.shape == y.shape and set(shard.tolist()) == {0, 1, 2}  # every row in exactly one shard
    for c in range(7):
        sizes = torch.bincount(shard[y == c], minlength=3)
        assert int(sizes.max() - sizes.min()) <= 1 and int(sizes.sum()) == int((y == c).sum())
    assert torch.equal(shard, stratified_shards(y, 3, torch.Generator().manual_seed(0)))  # drawn from its seed
    assert not torch.equal(shard, stratified_shards(y, 3, torch.Generator().manual_seed(1)))


def test_averaged_over_the_shards_a_models_risk_is_its_whole_set_risk():
    """With every class's count a multiple of k, each shard holds 1/k of each class: the per-class errors average to
    the whole set's, and the risk (linear in them) too; the estimate is unbiased."""
    C, k = 5, 4
    y = torch.arange(C).repeat_interleave(torch.tensor([8, 12, 4, 16, 20]))
    wrong = torch.rand(len(y), generator=torch.Generator().manual_seed(3)) < 0.4
    pi = torch.tensor([0.1, 0.3, 0.2, 0.15, 0.25], dtype=torch.float64)
    tested = torch.ones(C, dtype=torch.bool)
    whole = adaptability_risk(per_class_errors(wrong, y, torch.arange(len(y)), C)[0][None], pi, tested)
    shard = stratified_shards(y, k, torch.Generator().manual_seed(0))
    risks = [adaptability_risk(per_class_errors(wrong, y, torch.nonzero(shard == s).flatten(), C)[0][None], pi,
                               tested) for s in range(k)]
    assert float(torch.stack(risks).mean()) == pytest.approx(float(whole), abs=1e-12)


def test_the_standard_error_is_the_spread_over_random_shardings():
    """Two models on shards 0 and 1 of k = 4 (distinct shards: independent draws, their variances add): the SE the
    evaluator logs from one sharding matches the standard deviation of the mean risk over 4000 shardings within
    their sampling error."""
    C, k = 4, 4
    y = torch.arange(C).repeat_interleave(torch.tensor([40, 60, 80, 100]))
    gen = torch.Generator().manual_seed(7)
    wrong = torch.stack([torch.rand(len(y), generator=gen) < p for p in (0.3, 0.6)])  # two local models
    pi = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    pooled = torch.bincount(y, minlength=C).double()
    means, ses = [], []
    for draw in range(4000):
        shard = stratified_shards(y, k, torch.Generator().manual_seed(draw))
        counts = [per_class_errors(wrong[m], y, torch.nonzero(shard == m).flatten(), C) for m in range(2)]
        errors = torch.stack([e for e, _, _ in counts])
        means.append(float(adaptability_risk(errors, pi, torch.ones(C, dtype=torch.bool)).mean()))
        if draw < 200:
            correct = torch.stack([t - miss for _, miss, t in counts])
            total = torch.stack([t for _, _, t in counts])
            ses.append(float(sharded_risk_se(correct, total, pooled, pi, torch.tensor([0, 1]))))
    spread = torch.tensor(means, dtype=torch.float64).std()
    # the SE of a sample std over 4000 draws is ~1.1% of it; the logged SE is itself an estimate from one sharding
    assert sum(ses) / len(ses) == pytest.approx(float(spread), rel=0.08)


def test_the_standard_error_of_models_on_one_shard_adds_their_deviations():
    f64 = torch.float64  # as the evaluator's counts
    correct = torch.tensor([[3.0, 6.0], [5.0, 2.0]], dtype=f64)
    total = torch.tensor([[10.0, 10.0], [10.0, 10.0]], dtype=f64)
    pooled, w = torch.tensor([40.0, 40.0], dtype=f64), torch.tensor([0.5, 0.5], dtype=f64)
    e = [[(10 - c + 0.5) / 11 for c in row] for row in correct.tolist()]  # errors + 1/2 over n + 1
    sd = [math.sqrt(sum(0.25 * x * (1 - x) / 9 * 0.75 for x in row)) for row in e]
    apart = sharded_risk_se(correct, total, pooled, w, torch.tensor([0, 1]))
    together = sharded_risk_se(correct, total, pooled, w, torch.tensor([0, 0]))
    assert float(apart) == pytest.approx(math.sqrt(sd[0] ** 2 + sd[1] ** 2) / 2, rel=1e-12)
    assert float(together) == pytest.approx((sd[0] + sd[1]) / 2, rel=1e-12)


def test_a_per_class_sample_keeps_at_most_that_many_of_each_class():
    y = torch.tensor([2, 0, 2, 2, 1, 2, 0, 2])
    rows = per_class_sample(y, 2, torch.Generator().manual_seed(0))
    assert torch.equal(rows, rows.sort().values) and len(set(rows.tolist())) == len(rows)
    assert torch.bincount(y[rows], minlength=3).tolist() == [2, 1, 2]
    assert torch.equal(per_class_sample(y, 8, torch.Generator().manual_seed(0)), torch.arange(8))


def test_with_nothing_subsampled_the_numbers_are_the_whole_set_ones_bit_for_bit(out):
    """train_per_class above every class's count keeps every image: the run is the whole-set run (test_shards=1,
    train_per_class=0)."""
    common = ("evaluators.adaptability.every=1", "trainer.rounds=2", "evaluators.adaptability.test_shards=1")
    default = read_metrics(run_tiny(out, *common, name="default"))
    whole = read_metrics(run_tiny(out, *common, "evaluators.adaptability.train_per_class=100000",
                                  name="all_images"))
    assert default == whole


def test_by_default_each_client_has_a_shard_of_its_own(out):
    """test_shards=0 (the default) is k = data.num_clients, bit for bit."""
    common = ("evaluators.adaptability.every=1", "trainer.rounds=2", "data.test_split=official")
    default = read_metrics(run_tiny(out, *common, name="default"))
    per_client = read_metrics(run_tiny(out, *common, "evaluators.adaptability.test_shards=6", name="six"))
    assert all("test/adaptability_se" in r for r in default if "test/adaptability" in r)
    strip = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in default]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in per_client]


def test_sharding_changes_only_the_risk_and_logs_its_standard_error(out):
    common = ("evaluators.adaptability.every=1", "trainer.rounds=2", "data.test_split=official")
    whole = read_metrics(run_tiny(out, *common, "evaluators.adaptability.test_shards=1", name="whole"))
    sharded = read_metrics(run_tiny(out, *common, "evaluators.adaptability.test_shards=3", name="sharded"))
    for a, b in zip(whole, sharded):
        assert b.keys() - a.keys() == {"test/adaptability_se"}
        assert {k: v for k, v in b.items() if k not in ("test/adaptability", "test/adaptability_se")
                and not k.startswith("time/")} == {k: v for k, v in a.items() if k != "test/adaptability"
                                                   and not k.startswith("time/")}
        assert 0 < b["test/adaptability_se"] < 0.2
        assert abs(b["test/adaptability"] - a["test/adaptability"]) < 4 * b["test/adaptability_se"]


@on_one_and_two_processes("adaptability_sampled", *SHARDED, "trainer.rounds=2", "data.num_clients=5")
def sampled_adaptability_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    """Each process draws the same shards and samples (from the seed, not from its own clients)."""
    a = read_metrics(one)
    assert all("test/adaptability_se" in r for r in a)
    assert_same_rows(a, read_metrics(two), abs=1e-5)
