"""FedAS (fl/methods/fedas.py), a FedDRM baseline: the alignment loss and class prototypes by hand on fabricated
tensors; the alignment steps by hand from the broadcast body and the client's previous local body (and 0 steps leave
the received body as it came); tr(F_i) by hand for both estimators (full batches only, as the authors' loader); the
Fisher-weighted server step by hand on fabricated uploads (equal traces give the plain mean); align_steps = 0 with n_i
weights is FedPer exactly; resume equals the uninterrupted run (its configs: tests/config/test_baseline_configs.py)."""
import copy
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fl.config import ConfigError, load_config
from fl.core import TrainingFault, Upload, batch_indices, generator
from fl.core.exchange import WeightedSum, exchange
from fl.core.optim import round_lr
from fl.methods.fedas import FedASClient, alignment_loss, class_prototypes
from tests.helpers import (
    assert_same_rows,
    client_states,
    global_params,
    initial_model,
    interrupted_and_resumed,
    orchestrator,
    read_metrics,
    run_tiny,
    tiny,
)
from tests.process_pairs import on_one_and_two_processes

BODY = "model.backbone."


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def build(out, *extra):
    cfg = load_config(tiny(out, "method.name=fedas", "fabric.cpu_threads=1", *extra))
    torch.set_num_threads(1)
    orch = orchestrator(cfg, out / "run")
    return cfg, orch


def body_of(state: dict) -> dict:
    return {k[len(BODY):]: v for k, v in state.items() if k.startswith(BODY)}


# ---- the alignment loss ------------------------------------------------------------------------------------------
def test_alignment_loss_and_prototypes_by_hand():
    f = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, -1.0], [2.0, 2.0]])
    y = torch.tensor([0, 2, 0, 2])
    prev = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 2.0], [0.0, 0.0]])
    # the previous model's class means: class 0 from rows 0 and 2, class 2 from rows 1 and 3, class 1 absent (zeros)
    z = class_prototypes(prev, y, 3)
    assert torch.equal(z, torch.tensor([[1.5, 1.0], [0.0, 0.0], [0.5, 0.5]]))
    # sample target: mean over the 4 x 2 entries of (f - prev)^2 = (0 + 4 + 4 + 1 + 4 + 9 + 4 + 4) / 8
    assert alignment_loss(f, y, previous=prev).item() == pytest.approx(30 / 8)
    # prototype target: (f - z_y)^2 = (0.25 + 1) + (6.25 + 0.25) + (2.25 + 4) + (2.25 + 2.25), over 8
    assert alignment_loss(f, y, prototypes=z).item() == pytest.approx(18.5 / 8)
    assert alignment_loss(prev, y, previous=prev).item() == 0.0


@pytest.mark.parametrize("target, steps", [("sample", 2), ("prototype", 2), ("sample", 0)])
def test_alignment_steps_by_hand(out, monkeypatch, target, steps):
    """Round 1 of client 1, whose previous local body is its round-0 model while the broadcast is the mean of two
    clients: the body at the start of the first cross-entropy step is `steps` plain SGD steps on L_align from the
    broadcast body (0 steps: the received body itself)."""
    cfg, orch = build(out, f"method.target={target}", f"method.align_steps={steps}", "trainer.local_steps=4",
                      "optim.momentum=0", "optim.weight_decay=0", "optim.lr=0.5", "method.weighting=samples")
    data, c = orch.data, 1
    states, uploads = {}, {}
    for cid in (0, c):
        upload, result = orch.train_client(0, cid)
        uploads[cid] = Upload(params={k: v.clone() for k, v in upload.params.items()}, weight=upload.weight)
        states[cid] = result.state
    orch.store.update(states, 0)
    acc = WeightedSum()
    for up in uploads.values():
        acc.add(up.params, float(up.weight))
    mean, _ = exchange(orch.fabric, acc, [])
    orch.server.server_step(None, mean, {})
    broadcast, previous = body_of(orch.server.global_params), body_of(uploads[c].params)
    assert any(not torch.equal(broadcast[k], previous[k]) for k in broadcast)
    assert all(torch.equal(states[c]["previous"][k], previous[k]) for k in previous)  # the stored reference

    seen = {}
    original = FedASClient.training_step

    def spy(self, batch, batch_idx):
        if batch_idx == self.hp.align_steps:
            seen["body"] = {k: v.detach().clone() for k, v in self.model.backbone.state_dict().items()}
        return original(self, batch, batch_idx)

    monkeypatch.setattr(FedASClient, "training_step", spy)
    orch.train_client(1, c)

    hand, ref = initial_model(cfg, data), initial_model(cfg, data)
    hand.backbone.load_state_dict(broadcast)
    ref.backbone.load_state_dict(previous)
    ref.eval()
    train = data.clients[c].train
    if target == "prototype":
        with torch.no_grad():
            z = class_prototypes(ref.backbone(data.prepare(train.x)), train.y, data.num_classes)
    lr = round_lr(cfg, 1)
    params = list(hand.backbone.parameters())
    batches = [idx for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 1, c, "train"),
                                               steps=4) if idx is not None]
    for idx in batches[:steps]:
        x, y = data.prepare(train.x[idx]), train.y[idx]
        with torch.no_grad():
            t = z[y] if target == "prototype" else ref.backbone(x)
        g = torch.autograd.grad(((hand.backbone(x) - t) ** 2).mean(), params)
        with torch.no_grad():
            for p, gi in zip(params, g):
                p -= lr * gi
    expected = hand.backbone.state_dict()
    for k, v in seen["body"].items():
        if steps == 0:
            assert torch.equal(v, broadcast[k]), k
        else:
            torch.testing.assert_close(v, expected[k], rtol=1e-5, atol=1e-6, msg=k)
    if steps:
        assert any(not torch.allclose(seen["body"][k], broadcast[k]) for k in broadcast)  # alignment moved it


# ---- client synchronization ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["batch", "sample"])
def test_fisher_trace_by_hand_and_local_evaluation(out, estimator):
    """tr(F_i) of the trained client model (body and personal head, eval mode, stored order): the authors' loop, the
    sum over the full batches of trainer.batch_size of ||grad of the batch-mean NLL||^2 (their loader has
    drop_last=True: client 2's 62 = 3 x 16 + 14 samples give 3 batches), or the mean over all samples of
    ||grad NLL||^2. Then, with a new broadcast, eval_model=local predicts with the client's own last local model."""
    cfg, orch = build(out, f"method.fisher={estimator}", "trainer.local_steps=3")
    m, data, c = orch.module, orch.data, 2
    upload, result = orch.train_client(0, c)
    model = copy.deepcopy(m.model).eval()
    params = list(model.parameters())
    train = data.clients[c].train
    total = 0.0
    bs = cfg.trainer.batch_size
    assert len(train) % bs != 0  # a last partial batch the authors' loader drops
    for begin in range(0, len(train), bs):
        x, y = data.prepare(train.x[begin:begin + bs]), train.y[begin:begin + bs]
        if estimator == "batch":
            if len(y) < bs:
                break
            g = torch.autograd.grad(-F.log_softmax(model(x), 1)[range(len(y)), y].mean(), params)
            total += sum(float((gi.double() ** 2).sum()) for gi in g)
        else:
            for j in range(len(y)):
                g = torch.autograd.grad(-F.log_softmax(model(x[j:j + 1]), 1)[0, y[j]], params)
                total += sum(float((gi.double() ** 2).sum()) for gi in g)
    expected = total if estimator == "batch" else total / len(train)
    assert result.message["fisher"] == pytest.approx(expected, rel=1e-5)
    assert orch.server.weight(c, upload) == result.message["fisher"] > 0

    orch.store.update({c: result.state}, 0)
    orch.server.global_params = {k: v + 0.1 if v.is_floating_point() else v for k, v in upload.params.items()}
    orch.load_client(1, c)
    x = data.prepare(data.clients[c].test.x[:8])
    with torch.no_grad():
        local = model(x)
        received = m.model(x)
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(m.predict(x), local, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(received, local)  # the received body is another model


def test_fisher_trace_of_a_client_without_a_full_batch_is_zero_and_a_round_of_them_stops(out):
    """n_i < batch_size: the authors' drop_last loader yields no batch, so tr(F_i) = 0 and the client's body weighs
    nothing; a round whose every trace is 0 has no Fisher weights and stops with one line naming the remedy."""
    cfg, orch = build(out, "trainer.batch_size=64", "trainer.local_steps=3")
    c = 3
    assert len(orch.data.clients[c].train) < 64
    upload, result = orch.train_client(0, c)
    assert result.message["fisher"] == 0.0 and orch.server.weight(c, upload) == 0.0
    with pytest.raises(TrainingFault, match="round 4: every client's tr\\(F_i\\) is 0.*trainer.batch_size=64"):
        orch.server.server_step(SimpleNamespace(round=4), {}, {c: result.message, 1: {"fisher": 0.0}})


def fabricated_step(out, weighting, traces):
    cfg, orch = build(out, f"method.weighting={weighting}")
    thetas = {3: torch.tensor([1.0, -2.0, 0.5]), 0: torch.tensor([4.0, 2.0, -1.0]), 5: torch.tensor([0.0, 1.0, 3.0])}
    n = {3: 10.0, 0: 30.0, 5: 20.0}
    uploads = {cid: Upload(params={"model.backbone.0.weight": thetas[cid]}, weight=n[cid],
                           message={"fisher": traces[cid]} if weighting == "fisher" else {}) for cid in thetas}
    acc = WeightedSum()
    for cid, up in uploads.items():
        acc.add(up.params, orch.server.weight(cid, up))
    mean, _ = exchange(orch.fabric, acc, [])
    orch.server.server_step(None, mean, {cid: up.message for cid, up in uploads.items()})
    return orch.server.global_params["model.backbone.0.weight"].double(), thetas, n


def test_fisher_weighted_server_step_by_hand(out):
    """theta <- sum_i alpha_i theta_i with alpha_i = tr(F_i) / sum_j tr(F_j): traces 1, 3 and 6 give weights 0.1,
    0.3 and 0.6; equal traces give the plain mean whatever n_i; weighting=samples gives n_i / sum n_j."""
    got, th, n = fabricated_step(out / "a", "fisher", {3: 1.0, 0: 3.0, 5: 6.0})
    torch.testing.assert_close(got, (0.1 * th[3] + 0.3 * th[0] + 0.6 * th[5]).double(), rtol=0, atol=1e-6)
    torch.testing.assert_close(got, torch.tensor([1.3, 1.0, 1.55], dtype=torch.float64), rtol=0, atol=1e-6)
    got, th, _ = fabricated_step(out / "b", "fisher", {3: 2.5, 0: 2.5, 5: 2.5})
    torch.testing.assert_close(got, ((th[3] + th[0] + th[5]) / 3).double(), rtol=0, atol=1e-7)
    got, th, n = fabricated_step(out / "c", "samples", {})
    torch.testing.assert_close(got, ((10 * th[3] + 30 * th[0] + 20 * th[5]) / 60).double(), rtol=0, atol=1e-7)


def test_no_alignment_and_sample_weights_is_fedper_exactly(out):
    """align_steps = 0, n_i weights, the received body scored: every step is FedPer's cross-entropy step."""
    extra = ("trainer.rounds=2", "optim.momentum=0.9", "trainer.local_steps=3")
    per = run_tiny(out, "method.name=fedper", *extra, name="per")
    fedas = run_tiny(out, "method.name=fedas", "method.align_steps=0", "method.weighting=samples",
                     "method.eval_model=received", *extra, name="as")
    gp, ga = global_params(per), global_params(fedas)
    assert gp.keys() == ga.keys() and all(torch.equal(gp[k], ga[k]) for k in gp)
    rp, ra = read_metrics(per), read_metrics(fedas)
    assert len(rp) == 2 and [{k: r[k] for k in p} for p, r in zip(rp, ra)] == rp
    assert all(r["train/ce"] == r["train/loss"] and "train/align_mse" not in r for r in ra)


def test_resume_equals_uninterrupted(out, monkeypatch):
    """Interrupted (Ctrl-C) in round 2 of 4 and resumed: the same metrics, global body and per-client state (the
    previous local body and the personal head), with the paper's choices (prototypes, Fisher weights, local model)."""
    extra = ("method.name=fedas", "trainer.rounds=4", "trainer.checkpoint_every=10", "trainer.local_steps=3",
             "method.align_steps=1")
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra)
    assert read_metrics(cut) == read_metrics(full)
    a, b = global_params(full), global_params(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = client_states(full), client_states(cut)
    assert sa.keys() == sb.keys() and sa
    for cid in sa:
        for part in ("previous", "private"):
            assert sa[cid][part].keys() == sb[cid][part].keys()
            assert all(torch.equal(sa[cid][part][k], sb[cid][part][k]) for k in sa[cid][part])
    rows = read_metrics(full)
    assert all(r["train/align_mse"] >= 0 and 0 < r["server/alpha_max"] <= 1 for r in rows)
    assert any(r["train/align_mse"] > 0 for r in rows[1:])  # a returning client's body differs from the broadcast


@on_one_and_two_processes("fedas", "method.name=fedas", "trainer.rounds=2", "data.num_clients=7",
                          "trainer.participation=0.6", "trainer.local_steps=3", "method.align_steps=1")
def fedas_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    """Each process weighs its own clients by their tr(F_i) and every process runs the same server step: the global
    body, the metrics and every client's state (previous body, personal head) match on 1 and 2 processes."""
    assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-6)
    ga, gb = global_params(one), global_params(two)
    assert ga.keys() == gb.keys()
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=0, atol=1e-6, msg=k)
    sa, sb = client_states(one), client_states(two)
    assert sa.keys() == sb.keys() and len(sa) > 3  # the clients of the two rounds
    for cid in sa:
        for part in ("previous", "private"):
            for k in sa[cid][part]:
                torch.testing.assert_close(sa[cid][part][k], sb[cid][part][k], rtol=0, atol=1e-6)


def test_config_holds_the_chosen_values():
    hp = load_config(["conf=fedas_cifar10_dir03"]).method
    assert (hp.align_steps, hp.align_lr, hp.target, hp.features, hp.weighting, hp.fisher, hp.eval_model) == (
        2, None, "sample", "backbone", "fisher", "batch", "received")


def test_alignment_must_leave_cross_entropy_steps(out):
    with pytest.raises(ConfigError, match="method.align_steps"):
        load_config(tiny(out, "method.name=fedas", "method.align_steps=3", "trainer.local_steps=3"))
    assert math.isfinite(load_config(tiny(out, "method.name=fedas", "trainer.local_steps=3")).method.align_steps)
