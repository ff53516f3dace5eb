"""CReFF (fl/methods/creff.py), a FedACD baseline: the server step by hand on fabricated messages (the closed-form
classifier gradient against autograd, the aggregation of the real gradients, the matching loss and one feature step,
the re-training against hand-written SGD, and how server_step composes them); the clients' training is FedAvg's
bitwise and their message is the received model's per-class gradient; evaluation scores the re-trained classifier;
resume equals an uninterrupted run, federated features included (its configs: tests/config/test_baseline_configs.py)."""
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.core import batch_indices, generator
from fl.data import build_data
from fl.methods.creff import (
    BIAS,
    WEIGHT,
    CReFFClient,
    CReFFServer,
    aggregate_gradients,
    ce_head_gradients,
    linear_init,
    match_distance,
    retrain_classifier,
    update_features,
)
from fl.methods.fedavg import FedAvgClient
from tests.helpers import (
    global_params,
    initial_model,
    interrupted_and_resumed,
    load_ckpt,
    read_metrics,
    record_uploads,
    run_tiny,
    tiny,
)

# the server optimisation made cheap for the tiny runs (10 classes, 16-d features)
CHEAP = ("method.name=creff", "method.num_of_feature=4", "method.match_epoch=3", "method.crt_epoch=2")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def server_state(run_dir: Path) -> dict:
    return load_ckpt(run_dir)["server"]


# ---- the server step by hand ---------------------------------------------------------------------------------------
def test_closed_form_head_gradient_is_autograd_of_the_cross_entropy():
    """Per class and batched over classes: d CE / d(W, b) of a linear classifier on features of one class."""
    gen = torch.Generator().manual_seed(3)
    W = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    b = torch.randn(5, generator=gen, dtype=torch.float64)
    z = torch.randn(5, 4, 3, generator=gen, dtype=torch.float64)  # 4 features of each of the 5 classes
    gw, gb = ce_head_gradients(W, b, z, torch.arange(5))
    for c in range(5):
        Wl, bl = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
        loss = F.cross_entropy(F.linear(z[c], Wl, bl), torch.full((4,), c))
        ew, eb = torch.autograd.grad(loss, [Wl, bl])
        one_w, one_b = ce_head_gradients(W, b, z[c], torch.tensor(c))
        for got in ((gw[c], gb[c]), (one_w, one_b)):
            torch.testing.assert_close(got[0], ew, rtol=0, atol=1e-12)
            torch.testing.assert_close(got[1], eb, rtol=0, atol=1e-12)


def test_aggregated_real_gradients_by_hand():
    """Class 0: both clients (uniform: the plain mean; samples: counts 3 and 1); class 2: client b only; class 1: no
    client, so it is left out."""
    C, d = 3, 2
    a = {"classes": torch.tensor([0]), "grad_weight": torch.full((1, C, d), 1.0), "grad_bias": torch.full((1, C), 2.0),
         "counts": torch.tensor([3.0])}
    b = {"classes": torch.tensor([0, 2]),
         "grad_weight": torch.stack([torch.full((C, d), 5.0), torch.full((C, d), 7.0)]),
         "grad_bias": torch.stack([torch.full((C,), 6.0), torch.full((C,), 8.0)]), "counts": torch.tensor([1.0, 4.0])}
    classes, gw, gb = aggregate_gradients([a, b], C, d, "clients")
    assert classes.tolist() == [0, 2]
    torch.testing.assert_close(gw, torch.stack([torch.full((C, d), 3.0), torch.full((C, d), 7.0)]).double())
    torch.testing.assert_close(gb, torch.stack([torch.full((C,), 4.0), torch.full((C,), 8.0)]).double())
    classes, gw, gb = aggregate_gradients([a, b], C, d, "samples")
    torch.testing.assert_close(gw[0], torch.full((C, d), (3 * 1.0 + 5.0) / 4).double())
    torch.testing.assert_close(gb[0], torch.full((C,), (3 * 2.0 + 6.0) / 4).double())
    torch.testing.assert_close(gw[1], torch.full((C, d), 7.0).double())


def test_matching_loss_and_one_feature_step_by_hand():
    """Two classes in 2-d, one federated feature each, a zero classifier (softmax 1/2 whatever the feature): class 0's
    feature f0 = (1, 0) has gradient rows (-f0/2, f0/2) and bias (-1/2, 1/2); against real rows (-1, -1), (0, 2) and
    bias (-1, 1) the distance is (1 - 1/sqrt 2) + 1 + 0. Class 1's f1 = (0, 1): rows (f1/2, -f1/2), bias (1/2, -1/2);
    against (0, 3), (1, 0), (1, -1): 0 + 1 + 0. With d cos(s f, r)/df = s (r/(|f||r|) - <f, r> f/(|f|^3 |r|)), one SGD
    step of size 0.1 moves f0 by 0.1 (0, 1 + 1/sqrt 2) and f1 by -0.1 (1, 0)."""
    W, b = torch.zeros(2, 2), torch.zeros(2)
    features = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    gw_real = torch.tensor([[[-1.0, -1.0], [0.0, 2.0]], [[0.0, 3.0], [1.0, 0.0]]])
    gb_real = torch.tensor([[-1.0, 1.0], [1.0, -1.0]])
    gw, gb = ce_head_gradients(W, b, features, torch.arange(2))
    distance = match_distance(gw, gb, gw_real, gb_real)
    torch.testing.assert_close(distance, torch.tensor([2 - 1 / math.sqrt(2), 1.0]), rtol=0, atol=1e-5)
    new, losses = update_features(features, W, b, torch.arange(2), gw_real, gb_real, steps=1, lr=0.1)
    assert losses == [pytest.approx(3 - 1 / math.sqrt(2), abs=1e-5)]
    expected = torch.tensor([[[1.0, 0.1 * (1 + 1 / math.sqrt(2))]], [[-0.1, 1.0]]])
    torch.testing.assert_close(new, expected, rtol=0, atol=1e-5)
    # a class without an aggregated gradient keeps its features
    new, _ = update_features(features, W, b, torch.tensor([1]), gw_real[1:], gb_real[1:], steps=1, lr=0.1)
    assert torch.equal(new[0], features[0]) and torch.allclose(new[1], expected[1], atol=1e-5)


def test_classifier_retraining_is_plain_sgd_on_the_federated_features():
    """2 classes x 2 features in 2-d, batches of 3 (so 3 + 1 per epoch), 2 epochs, lr 0.5: SGD written out with the
    cross-entropy gradient (P - Y)^T X / B, in the batch order of the seeded generator."""
    features = torch.tensor([[[1.0, 0.5], [0.2, -1.0]], [[-0.3, 0.8], [-1.0, -0.4]]], dtype=torch.float64)
    init = {"weight": torch.tensor([[0.1, -0.2], [0.3, 0.05]], dtype=torch.float64),
            "bias": torch.tensor([0.0, 0.1], dtype=torch.float64)}
    got, last = retrain_classifier(features, init, epochs=2, lr=0.5, batch_size=3,
                                   gen=generator(0, 4, -1, "creff/crt"))
    X, y = features.reshape(4, 2), torch.tensor([0, 0, 1, 1])
    W, b = init["weight"].clone(), init["bias"].clone()
    losses = []
    for _, idx in batch_indices(4, 3, generator(0, 4, -1, "creff/crt"), epochs=2):
        if idx is None:
            continue
        x, Y = X[idx], F.one_hot(y[idx], 2).double()
        P = torch.softmax(x @ W.T + b, dim=1)
        losses.append(float(-(Y * P.log()).sum(1).mean()))
        W, b = W - 0.5 * (P - Y).T @ x / len(idx), b - 0.5 * (P - Y).mean(0)
    torch.testing.assert_close(got["weight"], W, rtol=0, atol=1e-12)
    torch.testing.assert_close(got["bias"], b, rtol=0, atol=1e-12)
    assert len(losses) == 4 and last == pytest.approx(sum(losses[2:]) / 2, abs=1e-12)
    assert not torch.allclose(W, init["weight"])


@pytest.mark.parametrize("crt_init", ["random", "aggregated"])
def test_server_step_is_fedavg_then_matching_then_retraining(crt_init):
    """server_step(mean, messages): the global model is the mean; the features take match_epoch steps at the
    classifier the clients used (phi^t); the new phi is re-trained on them from a seeded fresh classifier or from the
    round's FedAvg head. The broadcast to a client is the FedAvg model and phi, the global model carries phi."""
    cfg = load_config(["method.name=creff", "method.num_of_feature=3", "method.match_epoch=4", "method.crt_epoch=2",
                       "method.lr_feature=0.5", "method.crt_batch_size=2", f"method.crt_init={crt_init}", "seed=5"])
    server = CReFFServer(cfg)
    gen = torch.Generator().manual_seed(0)
    C, d = 4, 3
    phi = {"weight": torch.randn(C, d, generator=gen), "bias": torch.randn(C, generator=gen)}
    feats = torch.randn(C, 3, d, generator=gen)
    server.global_params = {WEIGHT: torch.zeros(C, d), BIAS: torch.zeros(C), "model.backbone.0.weight": torch.zeros(2)}
    server.features, server.crt_head = feats.clone(), {k: v.clone() for k, v in phi.items()}
    mean = {WEIGHT: torch.randn(C, d, generator=gen), BIAS: torch.randn(C, generator=gen),
            "model.backbone.0.weight": torch.ones(2)}
    msg = {"classes": torch.tensor([1, 3]), "grad_weight": torch.randn(2, C, d, generator=gen),
           "grad_bias": torch.randn(2, C, generator=gen)}
    server.server_step(SimpleNamespace(round=7), mean, {2: msg})
    assert server.global_params is mean
    expected_feats, losses = update_features(feats, phi["weight"], phi["bias"], torch.tensor([1, 3]),
                                             msg["grad_weight"], msg["grad_bias"], 4, 0.5)
    assert torch.equal(server.features, expected_feats) and not torch.equal(expected_feats, feats)
    assert torch.equal(server.features[0], feats[0]) and torch.equal(server.features[2], feats[2])
    init = (linear_init(C, d, generator(5, 7, -1, "creff/crt_init")) if crt_init == "random"
            else {"weight": mean[WEIGHT], "bias": mean[BIAS]})
    expected, crt_loss = retrain_classifier(expected_feats, init, 2, cfg.method.lr_net, 2,
                                            generator(5, 7, -1, "creff/crt"))
    assert all(torch.equal(server.crt_head[k], expected[k]) for k in expected)
    metrics = {}
    server.on_round_end(None, metrics)
    assert metrics == {"server/matched_classes": 2.0, "server/crt_loss": crt_loss,
                       "server/match_loss_first": losses[0], "server/match_loss_last": losses[-1]}
    to_client, to_eval = server.broadcast(0), server.broadcast(-1)
    assert to_client["params"] is mean and to_client["crt_head"] is server.crt_head
    assert torch.equal(to_eval["params"][WEIGHT], expected["weight"]) and torch.equal(to_eval["params"][BIAS],
                                                                                      expected["bias"])
    assert torch.equal(to_eval["params"]["model.backbone.0.weight"], mean["model.backbone.0.weight"])


# ---- end to end ------------------------------------------------------------------------------------------------------
def test_local_training_and_the_global_model_are_fedavgs_bitwise(out, monkeypatch):
    """The real gradients are taken before local training in a pass that draws nothing and leaves BatchNorm's
    statistics alone: every uploaded model and the global model equal FedAvg's bitwise (FedACD's Table 3 note)."""
    extra = ("trainer.rounds=2", "trainer.local_steps=3", "model.norm=batch", "optim.momentum=0.9")
    seen_avg = record_uploads(monkeypatch, FedAvgClient)
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    seen_creff = record_uploads(monkeypatch, CReFFClient)
    creff = run_tiny(out, *CHEAP, *extra, name="creff")
    assert len(seen_avg) == len(seen_creff) == 6
    for (ra, ca, pa, wa), (rc, cc, pc, wc) in zip(seen_avg, seen_creff):
        assert (ra, ca, wa) == (rc, cc, wc) and pa.keys() == pc.keys()
        assert all(torch.equal(pa[k], pc[k]) for k in pa)
    ga, gc = global_params(avg), global_params(creff)
    assert ga.keys() == gc.keys() and any("running_mean" in k for k in ga)
    assert all(torch.equal(ga[k], gc[k]) for k in ga)
    assert not torch.equal(server_state(creff)["crt_head"]["weight"], gc[WEIGHT])  # inference uses another head


def test_client_message_is_the_received_models_per_class_gradient(out, monkeypatch):
    """Round 0: each client sends, for each class it holds, d CE / d phi^0 (phi^0 = the initial head) on the initial
    backbone's features of its samples of that class; bytes up = the model + the classes and their gradients."""
    sent = []
    original = CReFFClient.upload

    def upload(self):
        up = original(self)
        sent.append((self.round, self.cid, {k: v.clone() for k, v in up.message.items()}))
        return up

    monkeypatch.setattr(CReFFClient, "upload", upload)
    run = run_tiny(out, *CHEAP, "trainer.rounds=1", "trainer.local_steps=2", name="msg")
    cfg = load_config(tiny(out, *CHEAP))
    data = build_data(cfg)
    model = initial_model(cfg, data).eval()
    n_model = sum(v.numel() for v in global_params(run).values())
    bytes_up = 0
    for rnd, cid, message in sent:
        assert rnd == 0 and set(message) == {"classes", "grad_weight", "grad_bias"}
        train = data.clients[cid].train
        assert message["classes"].tolist() == sorted(train.y.unique().tolist())
        with torch.no_grad():
            z = model.backbone(data.prepare(train.x))
        for i, c in enumerate(message["classes"].tolist()):
            W = model.head.weight.detach().clone().requires_grad_(True)
            b = model.head.bias.detach().clone().requires_grad_(True)
            loss = F.cross_entropy(F.linear(z[train.y == c], W, b), train.y[train.y == c])
            ew, eb = torch.autograd.grad(loss, [W, b])
            torch.testing.assert_close(message["grad_weight"][i], ew, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(message["grad_bias"][i], eb, rtol=1e-4, atol=1e-6)
        k = len(message["classes"])
        bytes_up += 4 * n_model + 8 * k + 4 * k * (10 * 16 + 10)
    assert len(sent) == 3 and read_metrics(run)[0]["comm/bytes_up"] == bytes_up


def test_evaluation_scores_the_retrained_classifier(out):
    """test/acc_global_micro and each client's accuracy are those of the FedAvg backbone with the re-trained classifier
    (the metrics are float32 counts: 1e-7)."""
    run = run_tiny(out, *CHEAP, "trainer.rounds=1", "trainer.local_steps=3", name="eval")
    cfg = load_config(tiny(out, *CHEAP))
    data = build_data(cfg)
    model = initial_model(cfg, data).eval()
    crt = server_state(run)["crt_head"]
    model.load_state_dict({**{k.removeprefix("model."): v for k, v in global_params(run).items()},
                           "head.weight": crt["weight"], "head.bias": crt["bias"]})

    def accuracy(split) -> float:
        with torch.no_grad():
            return float((model(data.prepare(split.x)).argmax(1) == split.y).double().mean())

    row = read_metrics(run)[0]
    assert row["test/acc_global_micro"] == pytest.approx(accuracy(data.pooled_test()), abs=1e-7)
    for cid in range(data.num_clients):
        assert row[f"client/{cid}/acc"] == pytest.approx(accuracy(data.clients[cid].test), abs=1e-7)


def test_resume_equals_uninterrupted_federated_features_included(out, monkeypatch):
    """Interrupted (Ctrl-C) in round 2 of 4, then resumed: the same metrics, global model, federated features and
    re-trained classifier."""
    extra = (*CHEAP, "trainer.rounds=4", "trainer.checkpoint_every=10", "trainer.local_steps=2")
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra)
    assert read_metrics(cut) == read_metrics(full)
    a, b = server_state(full), server_state(cut)
    assert a["global_params"].keys() == b["global_params"].keys()
    assert all(torch.equal(a["global_params"][k], b["global_params"][k]) for k in a["global_params"])
    assert torch.equal(a["features"], b["features"]) and a["features"].shape == (10, 4, 16)
    assert all(torch.equal(a["crt_head"][k], b["crt_head"][k]) for k in ("weight", "bias"))
    start = torch.randn(10, 4, 16, generator=generator(0, 0, -1, "creff/features"))
    assert not torch.allclose(a["features"], start)  # the server moved them


def test_configs_hold_the_chosen_values():
    real = load_config(["conf=creff_cifar100_dir01"]).method
    assert (real.num_of_feature, real.match_epoch, real.crt_epoch, real.lr_feature, real.lr_net) == (100, 100, 300,
                                                                                                     0.1, 0.01)
    assert (real.crt_batch_size, real.crt_init, real.grad_weighting) == (None, "random", "clients")
    twin = load_config(["conf=creff_cifar100_dir01_synthetic"]).method
    assert (twin.num_of_feature, twin.match_epoch, twin.crt_epoch) == (10, 20, 300)
    assert (twin.lr_feature, twin.lr_net, twin.crt_init, twin.grad_weighting) == (0.1, 0.01, "random", "clients")
