"""Methods that keep part of one model private: FedBN (BatchNorm), FedBABU (head), LG-FedAvg (body), FedRoD
(personal head), FedPAC (combined heads) and FedRep (head) (fl/methods/): each method's defining property,
FedPAC's QP (simplex, closed form, optimality) and statistics against a reference, resume and 1-vs-2
processes (FedPAC)."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl.config import ConfigError, load_config
from fl.core.loop import sample_clients
from fl.data import build_data
from fl.methods.fedbabu import FedBABUClient
from fl.methods.fedbn import FedBNClient, batchnorm_prefixes
from fl.methods.fedpac import FedPACServer
from fl.methods.fedpac.qp import combination_weights
from fl.methods.fedrep import FedRepClient
from fl.methods.fedrod import FedRoDClient, balanced_softmax_loss
from fl.methods.lg_fedavg import LGFedAvgClient
from fl.run.train import main
from tests.helpers import assert_same_rows, initial_model, read_metrics, record_uploads, tiny
from tests.helpers import load_ckpt as ckpt
from tests.helpers import run_tiny as run
from tests.process_pairs import on_one_and_two_processes


# ---- FedBN ----------------------------------------------------------------------------------------
def test_fedbn_keeps_every_batchnorm_tensor_local(out, monkeypatch):
    extra = ("method.name=fedbn", "model.norm=batch", "trainer.rounds=3")
    uploads = record_uploads(monkeypatch, FedBNClient)
    state = ckpt(run(out, *extra, name="bn"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    bn = tuple(f"model.{p}" for p in batchnorm_prefixes(initial_model(cfg, data)))
    assert len(bn) == 2
    bn_keys = {f"{p}{s}" for p in bn for s in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert uploads and all(not k.startswith(bn) for _, _, params, _ in uploads for k in params)
    assert not any(k.startswith(bn) for k in state["server"]["global_params"])
    clients = state["clients"]
    for cid, s in clients.items():
        assert set(s["private"]) == bn_keys
        # never averaged nor maxed: the batch counter is exactly this client's own training steps
        steps = sum(math.ceil(len(data.clients[cid].train) / cfg.trainer.batch_size)
                    for rnd in range(cfg.trainer.rounds)
                    if cid in sample_clients(cfg.seed, rnd, data.num_clients, cfg.trainer.participation))
        assert int(s["private"][f"{bn[0]}num_batches_tracked"]) == steps
    a, b = list(clients)[:2]
    for suffix in ("weight", "running_mean", "running_var"):
        assert not torch.equal(clients[a]["private"][bn[0] + suffix], clients[b]["private"][bn[0] + suffix])


def test_fedbn_without_batchnorm_is_a_config_error(out, capsys):
    assert main(tiny(out, "method.name=fedbn", "model.norm=none")) == 2
    assert "model.norm=batch" in capsys.readouterr().err


# ---- FedBABU --------------------------------------------------------------------------------------
def test_fedbabu_head_stays_at_init_during_training_and_is_finetuned_at_evaluation(out, monkeypatch):
    extra = ("method.name=fedbabu", "method.finetune_epochs=1", "method.finetune_part=head", "trainer.rounds=3",
             "trainer.evaluators=[]")  # only the per-client evaluation personalizes
    uploads = record_uploads(monkeypatch, FedBABUClient)
    tuned = []
    original = FedBABUClient.personalize

    def personalize(self):
        original(self)
        tuned.append({k: v.detach().cpu().clone() for k, v in self.state_dict().items()})

    monkeypatch.setattr(FedBABUClient, "personalize", personalize)
    state = ckpt(run(out, *extra, name="babu"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    init = {f"model.{k}": v for k, v in initial_model(cfg, data).state_dict().items()}
    g = state["server"]["global_params"]
    head = [k for k in init if k.startswith("model.head.")]
    assert head and all(torch.equal(g[k], init[k]) for k in head)  # bitwise the random initialisation
    assert all(not torch.equal(g[k], init[k]) for k in init if k not in head)  # the body trained
    assert uploads and all(not k.startswith("model.head.") for _, _, params, _ in uploads for k in params)
    # evaluation: every client fine-tunes the head (finetune_part=head keeps the global body)
    assert len(tuned) == cfg.trainer.rounds * data.num_clients
    last = tuned[-data.num_clients:]
    for s in last:
        assert all(not torch.equal(s[k], init[k]) for k in head)
        assert all(torch.equal(s[k], g[k]) for k in g if k not in head)
    assert not torch.equal(last[0]["model.head.weight"], last[1]["model.head.weight"])


def test_fedbabu_without_finetuning_scores_the_global_model_on_each_client(out):
    rows = read_metrics(run(out, "method.name=fedbabu", "method.finetune_epochs=0", "trainer.participation=1.0",
                            "trainer.rounds=2", name="babu0"))
    tuned = read_metrics(run(out, "method.name=fedbabu", "method.finetune_epochs=1", "trainer.participation=1.0",
                             "trainer.rounds=2", name="babu1"))
    # no fine-tuning: every client is scored with the same (global) model, so the pooled accuracy is the micro mean
    assert rows[-1]["test/acc_micro"] == pytest.approx(rows[-1]["test/acc_global_micro"], abs=1e-6)
    assert rows[-1]["train/loss"] == tuned[-1]["train/loss"]  # fine-tuning never feeds back into training
    assert rows[-1]["test/acc_mean_clients"] != tuned[-1]["test/acc_mean_clients"]


# ---- LG-FedAvg ------------------------------------------------------------------------------------
def test_lg_fedavg_averages_only_the_head(out, monkeypatch):
    extra = ("method.name=lg_fedavg", "trainer.rounds=3")
    uploads = record_uploads(monkeypatch, LGFedAvgClient)
    state = ckpt(run(out, *extra, name="lg"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    keys = {f"model.{k}" for k in initial_model(cfg, data).state_dict()}
    head = {k for k in keys if k.startswith("model.head.")}
    g = state["server"]["global_params"]
    assert set(g) == head and all(set(p) == head for _, _, p, _ in uploads)
    for s in state["clients"].values():
        assert set(s["private"]) == keys - head
    # the global head is the n_i-weighted mean of the last round's heads
    last = [(p, w) for rnd, _, p, w in uploads if rnd == cfg.trainer.rounds - 1]
    for k in head:
        mean = sum(p[k].double() * w for p, w in last) / sum(w for _, w in last)
        torch.testing.assert_close(g[k], mean.float(), rtol=1e-6, atol=1e-7)
    a, b = list(state["clients"])[:2]
    w = "model.backbone.0.weight"
    assert not torch.equal(state["clients"][a]["private"][w], state["clients"][b]["private"][w])


# ---- FedRoD ---------------------------------------------------------------------------------------
def test_balanced_softmax_loss_in_closed_form():
    logits = torch.tensor([[1.0, -0.5, 2.0, 0.3], [0.2, 0.1, -1.0, 1.5]], dtype=torch.float64)
    y = torch.tensor([0, 3])
    counts = torch.tensor([5.0, 0.0, 2.0, 1.0], dtype=torch.float64)  # class 1 absent from the client
    expected = 0.0
    for row, label in zip(logits.tolist(), y.tolist()):
        num = counts[label] * math.exp(row[label])
        den = sum(c * math.exp(v) for c, v in zip(counts.tolist(), row))
        expected += -math.log(num / den) / len(y)
    got = balanced_softmax_loss(logits, y, counts)
    assert float(got) == pytest.approx(expected, rel=1e-12)
    # uniform counts: plain cross-entropy
    assert float(balanced_softmax_loss(logits, y, torch.full((4,), 7.0))) == pytest.approx(
        float(F.cross_entropy(logits, y)), rel=1e-12)


def test_fedrod_extractor_learns_from_the_generic_loss_only_and_predicts_with_both_heads(out):
    cfg = load_config(tiny(out, "method.name=fedrod"))
    data = build_data(cfg)
    torch.manual_seed(0)
    m = FedRoDClient(cfg, data)
    x = torch.randn(8, *data.input_shape)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 2])
    m.counts = torch.tensor([3.0, 1.0, 4.0, 2.0] + [0.0] * (data.num_classes - 4))
    m.training_step((x, y), 0)["loss"].backward()
    total = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    z = m.model.backbone(x)
    balanced_softmax_loss(m.model.head(z), y, m.counts).backward()
    for k, p in m.named_parameters():
        if k.startswith("model."):  # extractor and G-head: the balanced softmax loss alone
            torch.testing.assert_close(total[k], p.grad, rtol=1e-6, atol=1e-7)
    m.zero_grad()
    with torch.no_grad():
        g, z = m.model.head(m.model.backbone(x)), m.model.backbone(x)
    F.cross_entropy(g + m.phead(z), y).backward()
    for k, p in m.named_parameters():
        if k.startswith("phead."):  # P-head: CE of the personal logits on detached features and G-logits
            torch.testing.assert_close(total[k], p.grad, rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        m.cid = 2
        torch.testing.assert_close(m.predict(x), g + m.phead(z))
        m.cid = -1
        torch.testing.assert_close(m.predict(x), g)


def test_fedrod_shares_the_generic_model_and_keeps_the_personal_head(out):
    state = ckpt(run(out, "method.name=fedrod", "trainer.rounds=2", name="rod"))
    assert all(k.startswith("model.") for k in state["server"]["global_params"])
    assert "model.head.weight" in state["server"]["global_params"]
    for s in state["clients"].values():
        assert set(s["private"]) == {"phead.weight", "phead.bias"}
    rows = read_metrics(Path(out / "outputs" / "rod"))
    assert "test/acc_global_micro" in rows[-1]  # the generic model is a global model


# ---- FedPAC ---------------------------------------------------------------------------------------
def qp_objective(h, v, i, a):
    return float(np.sum((a @ (h[i][None, :] - h)) ** 2) + np.sum(v * a ** 2))


def test_fedpac_qp_weights_on_the_simplex_optimal_and_in_closed_form():
    rng = np.random.default_rng(0)
    for trial in range(5):
        m = 2 + trial
        h, v = rng.normal(size=(m, 12)), rng.uniform(0.0, 2.0, size=m)
        for i in range(m):
            a = combination_weights(h, v, i)
            assert a.shape == (m,) and (a >= 0).all() and a.sum() == pytest.approx(1.0, abs=1e-9)
            best = qp_objective(h, v, i, a)
            for b in rng.dirichlet(np.ones(m), size=200):  # no point of the simplex does better
                assert best <= qp_objective(h, v, i, b) + 1e-6
    # two clients: client 1 gives client 2 the weight V_1 / (V_1 + V_2 + ||h_1 - h_2||^2)
    h = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 2.0]])  # ||h_1 - h_2||^2 = 6
    v = np.array([3.0, 1.0])
    np.testing.assert_allclose(combination_weights(h, v, 0), [7 / 10, 3 / 10], atol=1e-6)
    np.testing.assert_allclose(combination_weights(h, v, 1), [1 / 10, 9 / 10], atol=1e-6)
    # no variance: every client keeps its own head; identical clients: equal variance-weighted sharing
    np.testing.assert_allclose(combination_weights(h, np.zeros(2), 0), [1.0, 0.0], atol=1e-5)
    np.testing.assert_allclose(combination_weights(np.ones((3, 4)), np.array([1.0, 1.0, 2.0]), 0),
                               [0.4, 0.4, 0.2], atol=1e-6)


def test_fedpac_statistics_centroids_and_combined_heads(out, monkeypatch):
    extra = ("method.name=fedpac", "trainer.rounds=2")
    captured = []
    original = FedPACServer.server_step

    def server_step(self, ctx, mean, messages):
        before = {"mean": self.centroid_mean.clone(), "has": self.centroid_has.clone()}
        original(self, ctx, mean, messages)
        captured.append((ctx.round, messages, before, {c: dict(h) for c, h in self.heads.items()}))

    monkeypatch.setattr(FedPACServer, "server_step", server_step)
    run_dir = run(out, *extra, name="pac")
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    rnd0, messages, _, heads = captured[0]
    assert rnd0 == 0 and list(messages) == sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    for cid, msg in messages.items():  # (h, V) with the received (initial) extractor, reference formula in numpy
        train = data.clients[cid].train
        with torch.no_grad():
            z = model.backbone(data.prepare(train.x)).double().numpy()
        y = train.y.numpy()
        n, ref_h, ref_v = len(y), np.zeros((data.num_classes, z.shape[1])), 0.0
        for k in range(data.num_classes):
            zk = z[y == k]
            if len(zk):
                pi, mu = len(zk) / n, zk.mean(0)
                ref_h[k] = pi * mu
                ref_v += pi * (zk ** 2).sum(1).mean() - pi ** 2 * mu @ mu
        np.testing.assert_allclose(msg["h"].numpy(), ref_h, rtol=1e-5, atol=1e-7)
        assert msg["v"] == pytest.approx(ref_v / n, rel=1e-5)
        assert torch.equal(msg["counts"], torch.bincount(train.y, minlength=data.num_classes).double())
    # each client's next head is its QP combination of the round's heads
    cids = sorted(messages)
    h = np.stack([messages[c]["h"].double().flatten().numpy() for c in cids])
    v = np.array([messages[c]["v"] for c in cids])
    for row, cid in enumerate(cids):
        alpha = combination_weights(h, v, row)
        for k, val in heads[cid].items():
            expected = sum(a * messages[c]["head"][k].double() for a, c in zip(alpha, cids))
            torch.testing.assert_close(val.double(), expected, rtol=1e-5, atol=1e-6)
    # round 1 aligns to the count-weighted means of round 0's local centroids
    _, _, before, _ = captured[1]
    counts = sum(messages[c]["counts"] for c in cids)
    sums = sum(messages[c]["sums"] for c in cids)
    assert torch.equal(before["has"], (counts > 0).float())
    seen = counts > 0
    torch.testing.assert_close(before["mean"][seen].double(), sums[seen] / counts[seen, None], rtol=1e-5, atol=1e-6)
    rows = read_metrics(run_dir)
    assert f"client/{sorted(captured[1][1])[0]}/align" in rows[1] and 0 < rows[1]["server/alpha_self_mean"] <= 1


def test_fedpac_resume_is_exact(out):
    # evaluators that run only at a run's last round would add metrics to the cut run's round 1
    full = run(out, "method.name=fedpac", "trainer.rounds=4", "trainer.evaluators=[]", name="full")
    cut = run(out, "method.name=fedpac", "trainer.rounds=2", "trainer.evaluators=[]", name="cut")
    assert main([f"resume={cut}", "trainer.rounds=4"]) == 0
    assert read_metrics(cut) == read_metrics(full)
    a, b = ckpt(full), ckpt(cut)
    for part in ("global_params",):
        assert all(torch.equal(a["server"][part][k], b["server"][part][k]) for k in a["server"][part])
    assert torch.equal(a["server"]["centroid_mean"], b["server"]["centroid_mean"])
    assert a["server"]["heads"].keys() == b["server"]["heads"].keys() and a["server"]["alphas"] == b["server"]["alphas"]
    for cid, hd in a["server"]["heads"].items():
        assert all(torch.equal(v, b["server"]["heads"][cid][k]) for k, v in hd.items())
    assert a["clients"].keys() == b["clients"].keys()
    for cid in a["clients"]:
        pa, pb = a["clients"][cid]["private"], b["clients"][cid]["private"]
        assert all(torch.equal(pa[k], pb[k]) for k in pa)


@on_one_and_two_processes("fedpac", "method.name=fedpac", "trainer.rounds=3", "data.num_clients=7",
                          "trainer.participation=0.6")
def fedpac_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    a, b = read_metrics(one), read_metrics(two)
    assert len(a) == 3
    assert_same_rows(a, b, abs=1e-5)
    ca, cb = ckpt(one)["server"], ckpt(two)["server"]
    assert ca["heads"].keys() == cb["heads"].keys()
    for cid, hd in ca["heads"].items():
        for k, v in hd.items():
            torch.testing.assert_close(cb["heads"][cid][k], v, rtol=0, atol=1e-5)
    torch.testing.assert_close(cb["centroid_mean"], ca["centroid_mean"], rtol=0, atol=1e-5)


# ---- FedRep ---------------------------------------------------------------------------------------
def test_fedrep_trains_the_head_then_the_body(out):
    cfg = load_config(tiny(out, "method.name=fedrep", "method.head_steps=2", "trainer.local_steps=4"))
    data = build_data(cfg)
    module = FedRepClient(cfg, data)
    x, y = data.prepare(data.clients[0].train.x[:8]), data.clients[0].train.y[:8]
    for step, trained in ((0, "head"), (1, "head"), (2, "body"), (3, "body")):
        module.zero_grad(set_to_none=True)
        module.training_step((x, y), step).backward()
        head = [p.grad for p in module.model.head.parameters()]
        body = [p.grad for p in module.model.backbone.parameters()]
        assert all(gr is not None for gr in (head if trained == "head" else body)), step
        assert all(gr is None for gr in (body if trained == "head" else head)), step
    assert set(module.private_state()) == {"model.head.weight", "model.head.bias"}
    with pytest.raises(ConfigError, match="method.head_steps=10 must be < trainer.local_steps=10"):
        load_config(["method.name=fedrep", "method.head_steps=10", "trainer.local_steps=10"])


# ---- configs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("conf", ["fedbn_domainnet_hybrid30", "fedbabu_cifar10s_dir05", "lg_fedavg_cifar10s_dir05",
                                  "fedrod_cifar10s_dir05", "fedpac_cifar10s_dir05"])
def test_paper_config_fails_cleanly_without_data_and_its_twin_runs(out, conf, capsys):
    common = ["logger.wandb.mode=disabled", "logger.progress=false", f"logger.output_dir={out / 'outputs'}",
              "fabric.cpu_threads=1"]
    assert main([f"conf={conf}", f"data.root={out / 'missing'}", *common]) == 2
    assert f"conf={conf}_synthetic" in capsys.readouterr().err
    cfg = load_config([f"conf={conf}_synthetic"])
    assert cfg.method.name == load_config([f"conf={conf}"]).method.name
    assert main([f"conf={conf}_synthetic", f"data.root={out / 'data'}", "trainer.rounds=1", "trainer.local_steps=2",
                 "data.embedded.samples_per_class=20", "data.partition.min_client_size=5", "trainer.evaluators=[]",
                 "logger.run_name=twin", *common]) == 0
