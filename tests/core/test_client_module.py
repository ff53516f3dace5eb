"""One ClientModule driven by hand, without a run: receive -> training_step / fit_local -> upload, as the round
loop does for one client (fl/core/loop.py, Orchestrator.train_client), checked against hand computations."""
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.core import ClientModule, Server, batch_indices, make_client_module
from fl.core.registry import METHODS
from fl.core.seeding import generator
from fl.data import build_data
from fl.run.train import make_fabric
from tests.helpers import initial_model, tiny


@dataclass
class Client:
    module: ClientModule
    optimizer: torch.optim.Optimizer
    server: Server
    fabric: object  # the module holds only a weak reference to its Fabric: keep it alive here


def client(out: Path, *extra: str, cid: int = 0) -> Client:
    """Client `cid` at round 0 of a tiny run, on its first visit: the module with the server's broadcast and
    its initial state loaded, an optimizer set up by Fabric, and the server."""
    cfg = load_config(tiny(out, *extra))
    fabric = make_fabric(cfg, [], [])
    module, data = make_client_module(cfg, fabric, build_data(cfg))
    server = METHODS[cfg.method.name].server_cls(cfg)
    server.setup(module, data)
    module.cid, module.round = cid, 0
    module.receive(server.broadcast(cid))
    module.load_client_state(None)
    optimizer = fabric.setup_optimizers(module.configure_optimizers())
    return Client(module, optimizer, server, fabric)


def first_batch(module, cid: int, purpose: str = "train"):
    """The indices of the first batch fit_local draws for `cid` in round 0, and that batch on the device."""
    cfg, train = module.cfg, module.data.clients[cid].train
    (_, idx), = [b for b in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 0, cid, purpose),
                                          steps=1, drop_last=cfg.trainer.drop_last) if b[1] is not None]
    return idx, module.make_batch(train, idx)


def params(module) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in module.named_parameters()}


def test_fedavg_upload_after_one_step_is_a_hand_computed_sgd_step(out):
    """Loss: cross-entropy of the received model on fit_local's first batch; upload: w - lr (grad + wd w),
    every shared tensor, on a copy of the model built and trained outside the framework."""
    c = client(out, "method.name=fedavg", "optim.lr=0.1", "optim.momentum=0.9", "optim.weight_decay=0.01", cid=2)
    module, optimizer, server = c.module, c.optimizer, c.server
    train = module.data.clients[2].train
    idx, (x, y) = first_batch(module, 2)
    assert 0 < len(idx) < len(train)  # a strict subset: the batch order matters
    ref = initial_model(module.cfg, module.data)
    assert all(torch.equal(v, server.global_params[f"model.{k}"]) for k, v in ref.state_dict().items())
    loss = F.cross_entropy(ref(module.data.prepare(train.x[idx])), train.y[idx])
    assert torch.equal(module.training_step((x, y), 0), loss)

    logs = module.fit_local(optimizer, steps=1)
    up = module.upload()
    assert logs["loss"] == pytest.approx(float(loss.detach()))
    grads = dict(zip([k for k, _ in ref.named_parameters()], torch.autograd.grad(loss, list(ref.parameters()))))
    assert up.params.keys() == {f"model.{k}" for k in ref.state_dict()}
    for k, w in ref.named_parameters():
        expected = w.detach() - 0.1 * (grads[k] + 0.01 * w.detach())  # momentum has no history yet
        assert not torch.equal(expected, w.detach())
        torch.testing.assert_close(up.params[f"model.{k}"], expected, rtol=0, atol=1e-7)


def test_fedprox_with_mu_zero_uploads_fedavgs_parameters_and_mu_changes_them(out):
    uploads = {}
    for name, extra in (("fedavg", ()), ("prox0", ("method.mu=0",)), ("prox1", ("method.mu=1.0",))):
        method = "fedavg" if name == "fedavg" else "fedprox"
        c = client(out, f"method.name={method}", *extra, "optim.momentum=0.9", cid=1)
        c.module.fit_local(c.optimizer, steps=3)
        uploads[name] = c.module.upload()
    a, b, c = (uploads[n].params for n in ("fedavg", "prox0", "prox1"))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise
    assert any(not torch.equal(a[k], c[k]) for k in a)  # the proximal term acts from the second step on
    assert uploads["fedavg"].weight == uploads["prox0"].weight == uploads["prox1"].weight


def test_fedprox_proximal_gradient_is_mu_times_the_distance_to_the_global_model(out):
    c = client(out, "method.name=fedprox", "method.mu=0.5")
    module, server = c.module, c.server
    module.train()
    module.on_local_train_start()  # the anchor: the received global model
    _, (x, y) = first_batch(module, 0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move away from the anchor, as local steps do
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    w = params(module)
    out_step = module.training_step((x, y), 0)
    total = torch.autograd.grad(out_step["loss"], list(module.parameters()))
    ce = torch.autograd.grad(F.cross_entropy(module(x), y), list(module.parameters()))
    distance = {k: w[k] - server.global_params[k] for k in w}
    assert float(out_step["prox"]) == pytest.approx(float(sum((d ** 2).sum() for d in distance.values())), rel=1e-5)
    for k, gt, gc in zip(w, total, ce):
        torch.testing.assert_close(gt - gc, 0.5 * distance[k], rtol=1e-4, atol=1e-6)


def test_scaffold_first_visit_control_variate_is_option_ii(out):
    """c = c_i = 0 on a first visit: K plain SGD steps, then c_i+ = (x - y) / (K lr), uploaded as delta c_i."""
    c = client(out, "method.name=scaffold", "optim.lr=0.05", "optim.momentum=0", "optim.weight_decay=0", cid=3)
    module, optimizer, server = c.module, c.optimizer, c.server
    assert module.c_i == {}  # a first visit starts from __init__'s value
    x = {k: v.clone() for k, v in server.global_params.items()}
    module.fit_local(optimizer, steps=3)
    up = module.upload()
    y = up.params
    delta_c = up.message["delta_c"]
    assert delta_c.keys() == module.c_i.keys() == server.control.keys() == {k for k, _ in module.named_parameters()}
    for k in delta_c:
        expected = (x[k] - y[k]) / (3 * 0.05)
        assert expected.abs().max() > 1e-4, k
        torch.testing.assert_close(module.c_i[k], expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(delta_c[k], module.c_i[k])  # c_i was 0


def test_scaffold_local_step_follows_the_corrected_gradient(out):
    """A later visit: with the broadcast c and the stored c_i, one step is y = x - lr (g(x) + c - c_i)."""
    c = client(out, "method.name=scaffold", "optim.lr=0.05", "optim.momentum=0", "optim.weight_decay=0", cid=4)
    module, server = c.module, c.server
    gen = torch.Generator().manual_seed(1)
    server.control = {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in server.control.items()}
    c_i = {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in server.control.items()}
    module.receive(server.broadcast(4))
    module.load_client_state({"private": {}, "c_i": c_i})
    optimizer = c.fabric.setup_optimizers(module.configure_optimizers())
    _, (x_batch, y_batch) = first_batch(module, 4)
    x = params(module)
    g = dict(zip(x, torch.autograd.grad(F.cross_entropy(module(x_batch), y_batch), list(module.parameters()))))
    module.fit_local(optimizer, steps=1)
    y = module.upload().params
    for k in x:
        torch.testing.assert_close(y[k], x[k] - 0.05 * (g[k] + server.control[k] - c_i[k]), rtol=0, atol=1e-7)
        torch.testing.assert_close(module.c_i[k], c_i[k] - server.control[k] + (x[k] - y[k]) / 0.05,
                                   rtol=1e-4, atol=1e-5)


def test_persistent_attribute_and_private_model_round_trip_through_the_state_store(out):
    """APFL keeps alpha_i (persistent) and v_i (private) per client: client_state() takes CPU copies,
    load_client_state(None) (a first visit) restores the initial values whatever the module last held, and
    load_client_state(state) restores the client's own."""
    c = client(out, "method.name=apfl", "method.alpha=0.25", "method.alpha_lr=5.0", "optim.lr=0.1")
    module, optimizer = c.module, c.optimizer
    initial_local = {k: v.clone() for k, v in module.private_state().items()}
    assert initial_local and all(k.startswith("local.") for k in initial_local)
    assert float(module.alpha) == 0.25
    module.fit_local(optimizer, steps=3)
    state = module.client_state()
    trained_alpha, trained_local = float(module.alpha), {k: v.clone() for k, v in module.private_state().items()}
    assert trained_alpha != 0.25 and 0.0 <= trained_alpha <= 1.0
    assert any(not torch.equal(trained_local[k], initial_local[k]) for k in initial_local)
    assert set(state) == {"private", "alpha"} and state["private"].keys() == initial_local.keys()
    assert state["alpha"].device.type == "cpu" and float(state["alpha"]) == trained_alpha

    module.fit_local(optimizer, steps=2)  # the live module moves on; the stored state must not
    assert float(state["alpha"]) == trained_alpha
    assert all(torch.equal(state["private"][k], v) for k, v in trained_local.items())

    module.load_client_state(None)  # another client's first visit
    assert float(module.alpha) == 0.25
    assert all(torch.equal(v, initial_local[k]) for k, v in module.private_state().items())
    module.load_client_state(state)  # this client again
    assert float(module.alpha) == trained_alpha
    assert all(torch.equal(v, trained_local[k]) for k, v in module.private_state().items())
    module.alpha.add_(1.0)  # loading copies: the stored value is not the live one
    assert float(state["alpha"]) == trained_alpha


def test_upload_weight_is_the_clients_number_of_training_samples(out):
    """n_i, not the number of samples seen in the local steps, whichever client was trained before."""
    c = client(out, "method.name=fedavg")
    module, server = c.module, c.server
    sizes = [len(c.train) for c in module.data.clients]
    assert len(set(sizes)) > 1 and min(sizes) > module.cfg.trainer.batch_size
    for cid in (3, 0, 5):
        module.cid = cid
        module.receive(server.broadcast(cid))
        module.load_client_state(None)
        optimizer = c.fabric.setup_optimizers(module.configure_optimizers())
        module.fit_local(optimizer, steps=1)
        up = module.upload()
        assert up.weight == float(sizes[cid]) == server.weight(cid, up)
