"""fabric.deterministic and the per-class sums that replaced atomic scatter sums (fl/core/label_sums.py).

On CUDA, `index_add_` of float rows with repeated indices adds with atomics in an order that changes from run to
run; `class_sums` is a one-hot matmul in float64 (fixed order), equal to index_add_ within float64 rounding, bitwise
where every partial sum is exact. The GPU side (same run twice, 1 vs 2 GPUs, bitwise) is bench/gpu_smoke.py's."""
import os
import re
from pathlib import Path

import pytest
import torch

from fl.core.label_sums import class_sums, label_counts
from fl.methods.fedacd.losses import accumulate
from fl.methods.fedas import class_prototypes
from fl.methods.pfedfda.stats import estimate
from fl.run.determinism import CUBLAS_WORKSPACE
from tests.helpers import global_params, read_metrics, run_tiny

FL = Path(__file__).resolve().parents[2] / "fl"


def index_add(values, labels, num_classes):
    """The form class_sums replaced."""
    out = torch.zeros(num_classes, *values.shape[1:], dtype=torch.float64)
    return out.index_add_(0, labels, values.to(torch.float64))


@pytest.fixture
def labelled():
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 6, (300,), generator=gen)
    labels[labels == 4] = 5  # class 4 absent
    return torch.randn(300, 7, generator=gen, dtype=torch.float64), labels


def test_class_sums_equal_index_add_within_float64_rounding(labelled):
    values, labels = labelled
    sums = class_sums(values, labels, 6)
    assert sums.dtype == torch.float64 and sums.shape == (6, 7) and not sums[4].any()
    torch.testing.assert_close(sums, index_add(values, labels, 6), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(class_sums(values[:, 0], labels, 6), index_add(values[:, 0], labels, 6),
                               rtol=1e-13, atol=1e-13)  # one value per sample


def test_class_sums_are_bitwise_index_add_where_every_partial_sum_is_exact(labelled):
    values, labels = labelled
    dyadic = torch.round(values * 64) / 64  # multiples of 1/64 far below 2^53: every order of summation is exact
    assert torch.equal(class_sums(dyadic, labels, 6), index_add(dyadic, labels, 6))
    assert torch.equal(class_sums(dyadic.float(), labels, 6), index_add(dyadic, labels, 6))


def test_class_sums_hold_float64_under_autocast(labelled):
    values, labels = labelled
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sums = class_sums(values.float(), labels, 6)
    torch.testing.assert_close(sums, index_add(values.float(), labels, 6), rtol=1e-13, atol=1e-13)


def test_label_counts_are_bincount(labelled):
    _, labels = labelled
    assert torch.equal(label_counts(labels, 6), torch.bincount(labels, minlength=6))


def test_the_methods_statistics_equal_their_index_add_forms(labelled):
    values, labels = labelled
    # FedACD's P: weighted probability sums and weights per class, accumulated over batches (Eq. 9)
    probs = torch.softmax(values[:, :6], 1)
    sums, weights = torch.zeros(6, 6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    accumulate(sums, weights, probs[:100], labels[:100], 1.0)
    accumulate(sums, weights, probs[100:], labels[100:], 0.3)
    w = torch.cat([torch.ones(100, dtype=torch.float64), torch.full((200,), 0.3, dtype=torch.float64)])
    torch.testing.assert_close(sums, index_add(probs * w[:, None], labels, 6), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(weights, index_add(w, labels, 6), rtol=1e-13, atol=1e-13)
    # FedAS' prototypes (float32 features): the sums in float64 now, then in the features' dtype
    feats = values.float()
    expected = index_add(feats, labels, 6).float() / torch.bincount(labels, minlength=6).clamp_min(1)[:, None]
    torch.testing.assert_close(class_prototypes(feats, labels, 6), expected, rtol=0, atol=1e-6)
    # pFedFDA's class means (Eq. 6), absent classes from the global mean
    glob = torch.full((6, 7), 9.0, dtype=torch.float64)
    mu, _ = estimate(values, labels, glob, "paper")
    counts = torch.bincount(labels, minlength=6).clamp_min(1)[:, None]
    local = index_add(values, labels, 6) / counts
    torch.testing.assert_close(mu, torch.where(torch.arange(6)[:, None] == 4, glob, local), rtol=1e-13, atol=1e-13)


def test_no_float_scatter_sum_with_repeated_indices_is_left_in_fl():
    # no index repeats there, so no order to vary: CReFF's index_add_ indexes the classes of one message (each once),
    # FedMosaic's vote puts one value in each row (and on the CPU)
    allowed = {"methods/creff.py", "methods/fedmosaic/vote.py"}
    found = {str(p.relative_to(FL)) for p in FL.rglob("*.py")
             if re.search(r"\.(index_add_?|scatter_add_?)\(|index_put_?\(.*accumulate=True", p.read_text())}
    assert found - allowed == set(), "atomic on CUDA: use fl.core.label_sums.class_sums"


def test_fabric_deterministic_is_on_during_the_run_and_undone_after(out, monkeypatch):
    from fl.core.loop import Orchestrator

    seen, original = [], Orchestrator.run_round

    def run_round(self, rnd):
        seen.append((torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.deterministic,
                     torch.backends.cudnn.benchmark, os.environ.get(CUBLAS_WORKSPACE)))
        return original(self, rnd)

    monkeypatch.setattr(Orchestrator, "run_round", run_round)
    monkeypatch.delenv(CUBLAS_WORKSPACE, raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    plain = run_tiny(out, name="plain")
    assert set(seen) == {(False, False, False, False, None)}
    seen.clear()
    deterministic = run_tiny(out, "fabric.deterministic=true", name="deterministic")
    assert set(seen) == {(True, True, True, False, ":4096:8")}
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic) == before
    assert CUBLAS_WORKSPACE not in os.environ
    # the CPU's kernels are deterministic already: the flag changes no number
    assert read_metrics(plain) == read_metrics(deterministic)
    ga, gb = global_params(plain), global_params(deterministic)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


def test_a_cublas_workspace_the_user_set_is_kept(out, monkeypatch):
    from fl.core.loop import Orchestrator

    seen, original = [], Orchestrator.run_round
    monkeypatch.setattr(Orchestrator, "run_round",
                        lambda self, rnd: seen.append(os.environ.get(CUBLAS_WORKSPACE)) or original(self, rnd))
    monkeypatch.setenv(CUBLAS_WORKSPACE, ":16:8")
    run_tiny(out, "fabric.deterministic=true", "trainer.rounds=1", name="kept")
    assert seen == [":16:8"] and os.environ[CUBLAS_WORKSPACE] == ":16:8"
