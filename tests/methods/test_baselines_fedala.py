"""FedALA (fl/methods/fedala.py): with the ALA weights fixed at 1 (eta = 0) it is FedAvg bitwise; the ALA
initialisation (Eq. 4), the weights' gradient (Eq. 6) and their clipped step (Eq. 5) by hand on fabricated tensors;
in a run, each round starts from ALA of the client's old local model and the global model (skipped in the first
round, to convergence on a client's first ALA, one pass afterwards, on an s% sample), clients are scored with their
local models; resume equals uninterrupted (its configs: tests/config/test_baseline_configs.py)."""
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

import fl.methods.fedala as fedala
from fl.config import load_config
from fl.data import build_data
from fl.methods.fedala import FedALAClient, ala_init, converged, mixed_keys, weight_gradients, weight_step
from fl.methods.fedavg import FedAvgClient
from fl.run.train import main
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

# scores of the clients' own models: FedAvg scores the global model there, FedALA each local model
CLIENT_SCORES = ("test/acc_mean_clients", "test/acc_weighted", "test/acc_weighted_train", "test/acc_micro",
                 "test/acc_std_clients", "test/acc_worst10", "test/system_acc", "test/system_acc_oracle")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def local_model(state: dict) -> dict:
    """A checkpointed client's local model Theta_i, under the model's own keys."""
    return {k.removeprefix("local."): v for k, v in state["private"].items()}


# ---- ALA on tensors, by hand ---------------------------------------------------------------------------------------
def test_ala_init_by_hand():
    """Lower layers take the global values bit for bit; the top layers local + (global - local) * W, exactly the
    global value where W = 1 and the local one where W = 0."""
    glob = {"body.weight": torch.tensor([[1.0, -2.0], [0.5, 3.0]]), "body.bias": torch.tensor([0.1, -0.3]),
            "head.weight": torch.tensor([[0.3, -1.7, 2.9]]), "head.bias": torch.tensor([0.7])}
    local = {"body.weight": torch.tensor([[9.0, 9.0], [9.0, 9.0]]), "body.bias": torch.tensor([9.0, 9.0]),
             "head.weight": torch.tensor([[0.1, 1.3, -0.4]]), "head.bias": torch.tensor([-0.2])}
    W = {"head.weight": torch.tensor([[1.0, 0.25, 0.0]]), "head.bias": torch.tensor([0.5])}
    got = ala_init(local, glob, W)
    assert got.keys() == glob.keys()
    assert torch.equal(got["body.weight"], glob["body.weight"]) and torch.equal(got["body.bias"], glob["body.bias"])
    expected = torch.tensor([[0.3, 1.3 + (-1.7 - 1.3) * 0.25, -0.4]])  # global, 1.3 - 0.75 = 0.55, local
    torch.testing.assert_close(got["head.weight"], expected, rtol=0, atol=1e-7)
    assert got["head.weight"][0, 0] == glob["head.weight"][0, 0]  # W = 1: bit for bit
    assert got["head.weight"][0, 2] == local["head.weight"][0, 2]  # W = 0: bit for bit
    torch.testing.assert_close(got["head.bias"], torch.tensor([0.25]), rtol=0, atol=1e-7)  # -0.2 + 0.9 * 0.5
    ones = {k: torch.ones_like(v) for k, v in W.items()}
    assert all(torch.equal(v, glob[k]) for k, v in ala_init(local, glob, ones).items())  # W = 1: the global model


def two_layer_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(body=nn.Linear(4, 3), act=nn.ReLU(), head=nn.Linear(3, 2)))


def test_mixed_keys_are_the_top_p_layers():
    model = two_layer_model()
    assert mixed_keys(model, 1) == ["head.weight", "head.bias"]
    assert mixed_keys(model, 2) == ["body.weight", "body.bias", "head.weight", "head.bias"]
    assert mixed_keys(model, 5) == mixed_keys(model, 2)  # p beyond the model's layers: the entire model


def test_weight_gradient_and_clipped_step_by_hand():
    """Eq. 6 on a two-layer net whose head is mixed: dL/dW = (G^T h) (.) (global - local) for the head's weight and
    G summed over the batch (.) (global - local) for its bias, G = (softmax - onehot) / B; the lower layer is a
    constant of the pass. Eq. 5 with a large eta: some weights clip at 0, some at 1, the rest move by -eta grad."""
    model = two_layer_model()
    g = torch.Generator().manual_seed(1)
    glob = {"head.weight": torch.randn(2, 3, generator=g), "head.bias": torch.randn(2, generator=g)}
    local = {k: torch.randn(v.shape, generator=g) for k, v in glob.items()}
    W = {k: torch.rand(v.shape, generator=g) for k, v in glob.items()}
    x, y = torch.randn(5, 4, generator=g), torch.tensor([0, 1, 1, 0, 1])
    loss, grads = weight_gradients(model, local, glob, W, x, y)
    assert model.body.weight.grad is None and model.head.weight.grad is None  # only W is differentiated

    with torch.no_grad():
        h = torch.relu(x @ model.body.weight.T + model.body.bias)
        Hw = local["head.weight"] + (glob["head.weight"] - local["head.weight"]) * W["head.weight"]
        hb = local["head.bias"] + (glob["head.bias"] - local["head.bias"]) * W["head.bias"]
        z = h @ Hw.T + hb
        logp = z - torch.log(torch.exp(z).sum(1, keepdim=True))
        onehot = torch.eye(2)[y]
        G = (torch.exp(logp) - onehot) / 5
        hand = {"head.weight": (G.T @ h) * (glob["head.weight"] - local["head.weight"]),
                "head.bias": G.sum(0) * (glob["head.bias"] - local["head.bias"])}
    torch.testing.assert_close(loss, -(logp * onehot).sum() / 5, rtol=0, atol=1e-6)
    for k in W:
        torch.testing.assert_close(grads[k], hand[k], rtol=1e-5, atol=1e-7)

    eta = 20.0
    new = weight_step(W, grads, eta)
    flat_w, flat_g, flat_new = (torch.cat([d[k].flatten() for k in W]) for d in (W, grads, new))
    for w, gr, n in zip(flat_w.tolist(), flat_g.tolist(), flat_new.tolist()):
        assert n == pytest.approx(min(1.0, max(0.0, w - eta * gr)), abs=1e-6)
    assert (flat_new == 0).any() and (flat_new == 1).any() and ((flat_new > 0) & (flat_new < 1)).any()
    assert all(torch.equal(W[k], v) for k, v in weight_step(W, grads, 0.0).items())  # eta = 0: W stays


def test_convergence_rule():
    """The authors' test: more than `window` losses recorded and the population std of the last `window` below the
    threshold."""
    assert not converged([1.0, 1.0], window=3, threshold=0.1)  # too few passes yet
    assert not converged([1.0, 1.05, 0.95], window=3, threshold=0.1)  # std 0.041, but only `window` passes
    assert converged([5.0, 1.0, 1.05, 0.95], window=3, threshold=0.1)  # std of the last 3 is 0.041
    assert not converged([5.0, 1.0, 1.2, 1.0], window=3, threshold=0.05)  # std 0.094


# ---- runs ----------------------------------------------------------------------------------------------------------
def test_fedala_with_weights_fixed_at_one_is_fedavg(out, monkeypatch):
    """eta = 0 keeps W = 1: every round starts from the global model (BatchNorm statistics included), so the global
    model, the training logs and every score of the global model are FedAvg's bit for bit, and each client's local
    model is the model it uploaded in its last round."""
    extra = ("trainer.rounds=3", "optim.momentum=0.9", "model.norm=batch", "trainer.local_steps=3")
    seen = record_uploads(monkeypatch, FedAvgClient)
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    ala = run_tiny(out, "method.name=fedala", "method.eta=0", "method.p=2", *extra, name="ala")
    ga, gb = global_params(avg), global_params(ala)
    assert any("running_mean" in k for k in ga)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
    ra, rb = read_metrics(avg), read_metrics(ala)
    assert len(ra) == len(rb) == 3
    for a, b in zip(ra, rb):
        same = {k: v for k, v in a.items() if k not in CLIENT_SCORES and not k.endswith("/acc")}
        assert "train/loss" in same and "test/acc_global_micro" in same and "test/adaptability" in same
        assert {k: b[k] for k in same} == same
    last = {cid: params for _, cid, params, _ in seen}  # each client's last FedAvg upload
    clients = load_ckpt(ala)["clients"]
    assert clients.keys() == last.keys()
    for cid, state in clients.items():
        mine = local_model(state)
        assert mine.keys() == {k.removeprefix("model.") for k in last[cid]}
        assert all(torch.equal(mine[k.removeprefix("model.")], v) for k, v in last[cid].items())
        assert all(torch.equal(w, torch.ones_like(w)) for w in state["W"].values())


def test_each_round_starts_from_ala_of_the_old_local_and_the_global_model(out, monkeypatch):
    """Full participation, p = 2 (the head and the last hidden layer), s = 50. Round 0 skips ALA (local = global =
    Theta^0). Round 1 is every client's start phase (a huge threshold: num_pre_loss + 1 = 4 passes), round 2 one
    pass; each pass takes int(n s / 100) samples. The model training starts from is ala_init(the local model the
    client uploaded in the previous round, the global model, the new W), and the scores are the local models'."""
    extra = ("method.name=fedala", "method.eta=0.5", "method.p=2", "method.s=50", "method.threshold=1e9",
             "method.num_pre_loss=3", "trainer.participation=1.0", "trainer.rounds=3", "trainer.local_steps=2")
    uploads = record_uploads(monkeypatch, FedALAClient)
    starts = []
    original = FedALAClient.on_local_train_start

    def on_local_train_start(self):
        before = {"global": {"model." + k: v.detach().clone() for k, v in self.model.state_dict().items()},
                  "start_phase": self.start_phase}
        original(self)
        start = {"model." + k: v.detach().clone() for k, v in self.model.state_dict().items()}
        starts.append((self.round, self.cid, before, start, {k: v.clone() for k, v in self.W.items()},
                       dict(self._logs), self.start_phase))

    monkeypatch.setattr(FedALAClient, "on_local_train_start", on_local_train_start)
    batches = []
    real_gradients = fedala.weight_gradients

    def counting(model, local, glob, W, x, y):
        batches.append(len(y))
        return real_gradients(model, local, glob, W, x, y)

    monkeypatch.setattr(fedala, "weight_gradients", counting)
    run = run_tiny(out, *extra, name="ala")

    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    sizes = [len(c.train) for c in data.clients]
    assert sum(batches) == sum(int(n * 50 / 100) * (4 + 1) for n in sizes)  # 4 start passes, then one pass
    top = {"model." + k for k in mixed_keys(initial_model(cfg, data), 2)}
    assert top == {"model.head.weight", "model.head.bias", "model.backbone.7.weight", "model.backbone.7.bias"}
    uploaded = {(r, cid): params for r, cid, params, _ in uploads}
    for rnd, cid, before, start, W, logs, start_phase in starts:
        if rnd == 0:  # local = global = Theta^0: no ALA, W stays ones
            assert logs["ala_passes"] == 0 and before["start_phase"] and start_phase
            assert all(torch.equal(start[k], before["global"][k]) for k in start)
            assert all(torch.equal(w, torch.ones_like(w)) for w in W.values())
            continue
        assert logs["ala_passes"] == (4 if rnd == 1 else 1) and before["start_phase"] == (rnd == 1)
        assert not start_phase
        flat = torch.cat([w.flatten() for w in W.values()])
        assert ((flat >= 0) & (flat <= 1)).all() and (flat < 1).any()
        assert logs["w_mean"] == pytest.approx(float(flat.double().mean()))
        old_local = uploaded[(rnd - 1, cid)]
        expected = ala_init(old_local, before["global"], {"model." + k: w for k, w in W.items()})
        assert start.keys() == expected.keys()
        for k in start:
            if k in top:
                torch.testing.assert_close(start[k], expected[k], rtol=0, atol=1e-7)
            else:  # the lower layers: the global model's values
                assert torch.equal(start[k], before["global"][k]), k
        assert any(not torch.equal(start[k], before["global"][k]) for k in top)

    # the scores of the last round are the clients' local models (their last uploads), each on its own test split
    row = read_metrics(run)[-1]
    model = initial_model(cfg, data).eval()
    for cid, client in enumerate(data.clients):
        model.load_state_dict({k.removeprefix("model."): v for k, v in uploaded[(2, cid)].items()})
        with torch.no_grad():
            pred = model(data.prepare(client.test.x)).argmax(1)
        assert row[f"client/{cid}/acc"] == pytest.approx(float((pred == client.test.y).double().mean()), abs=1e-12)
    assert "test/system_acc" in row and "test/acc_global_micro" in row


def test_start_phase_stops_where_the_authors_loop_stops(out, monkeypatch):
    """Round 1 is every client's start phase, with the defaults (threshold 0.1, num_pre_loss 10). The authors' loop
    (TsingZ0/FedALA utils/ALA.py), written out on the W-step losses the run computed: after each pass over the
    s% sample it records the pass's last mini-batch loss, and stops once more than 10 are recorded and the population
    std of the last 10 is below the threshold. Each client's pass count is that loop's; the mean-per-pass rule with
    10 passes enough stops elsewhere for some client."""
    extra = ("method.name=fedala", "trainer.participation=1.0", "trainer.rounds=2", "trainer.local_steps=2")
    steps, passes = [], {}
    real_gradients = fedala.weight_gradients

    def recording(model, local, glob, W, x, y):
        loss, grads = real_gradients(model, local, glob, W, x, y)
        steps.append(float(loss))
        return loss, grads

    original = FedALAClient.learn_weights

    def learn_weights(self, local, glob):
        steps.clear()
        start = self.start_phase
        count = original(self, local, glob)
        if start:
            passes[self.cid] = (count, list(steps))
        return count

    monkeypatch.setattr(fedala, "weight_gradients", recording)
    monkeypatch.setattr(FedALAClient, "learn_weights", learn_weights)
    run_tiny(out, *extra, name="ala")
    cfg = load_config(tiny(out, *extra))
    sizes = [len(c.train) for c in build_data(cfg).clients]
    assert sorted(passes) == list(range(len(sizes)))
    differs = False
    for cid, (count, losses) in passes.items():
        per_pass = math.ceil(int(sizes[cid] * 80 / 100) / cfg.trainer.batch_size)
        assert len(losses) == count * per_pass
        last_of_pass = [losses[(i + 1) * per_pass - 1] for i in range(count)]
        mean_of_pass = [sum(losses[i * per_pass:(i + 1) * per_pass]) / per_pass for i in range(count)]
        authors, recorded = None, []
        for i, value in enumerate(last_of_pass):
            recorded.append(value)
            if len(recorded) > 10 and float(np.std(recorded[-10:])) < 0.1:
                authors = i + 1
                break
        assert count == authors, cid
        mean_rule = next((i for i in range(10, count + 1) if float(np.std(mean_of_pass[i - 10:i])) < 0.1), None)
        differs |= mean_rule != count
    assert differs


def test_start_phase_stops_at_max_start_passes(out):
    run = run_tiny(out, "method.name=fedala", "method.threshold=1e-30", "method.max_start_passes=4",
                   "trainer.participation=1.0", "trainer.rounds=3", "trainer.local_steps=1", name="cap")
    passes = [r["train/ala_passes"] for r in read_metrics(run)]
    assert passes == [0.0, 4.0, 1.0]


def test_resume_equals_uninterrupted(out, monkeypatch):
    """Interrupted (Ctrl-C) in round 2 of 4, then resumed: the same metrics, global model, local models, W and
    start-phase flags."""
    extra = ("method.name=fedala", "method.eta=0.5", "method.num_pre_loss=2", "trainer.rounds=4",
             "trainer.checkpoint_every=10", "trainer.local_steps=2")
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra)
    assert read_metrics(cut) == read_metrics(full)
    a, b = load_ckpt(full), load_ckpt(cut)
    ga, gb = a["server"]["global_params"], b["server"]["global_params"]
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
    assert a["clients"].keys() == b["clients"].keys()
    for cid, sa in a["clients"].items():
        sb = b["clients"][cid]
        assert sa["start_phase"] == sb["start_phase"]
        assert all(torch.equal(sa["W"][k], sb["W"][k]) for k in sa["W"])
        assert all(torch.equal(sa["private"][k], sb["private"][k]) for k in sa["private"])
    assert any(not s["start_phase"] for s in a["clients"].values())
    assert any((w < 1).any() for s in a["clients"].values() for w in s["W"].values())


def test_config_errors(out, capsys):
    assert main(tiny(out, "method.name=fedala", "finetune.after_round=1")) == 2
    assert "finetune.after_round" in capsys.readouterr().err


def test_config_holds_the_papers_values():
    m = load_config(["conf=fedala_cifar10_dir03"]).method
    assert (m.eta, m.s, m.p, m.threshold, m.num_pre_loss, m.max_start_passes) == (1.0, 80.0, 1, 0.1, 10, 100)
    assert math.isclose(load_config(["conf=fedala_cifar10_dir03_synthetic"]).method.s, 80.0)
