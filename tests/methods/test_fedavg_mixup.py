"""FedAvg with input mixup (fl/methods/fedavg_mixup.py, FedACD's Table 5 baseline) and the mixup it shares with FedACD
(fl/methods/mixup.py): the draws are seeded per client and round, the loss is the two labels' cross-entropy weighed by
the drawn mu, and with every mu = 1 the method is FedAvg, bit for bit."""
import torch
import torch.nn.functional as F

import fl.methods.fedavg_mixup as fedavg_mixup
from fl.config import load_config
from fl.core.registry import METHODS
from fl.data import build_data
from fl.methods.mixup import InputMixup
from tests.helpers import global_params, read_metrics, run_tiny, tiny


def test_the_draws_are_seeded_per_client_and_round_and_mix_a_batch_with_its_permutation():
    x, y = torch.arange(24.0).reshape(8, 3), torch.arange(8)
    a, b = InputMixup(1.0, 0, 2, 5, "p"), InputMixup(1.0, 0, 2, 5, "p")
    (xa, ya, mu), (xb, yb, mu_b) = a(x, y), b(x, y)
    assert mu == mu_b and torch.equal(xa, xb) and torch.equal(ya, yb)  # the same client and round: the same draws
    assert 0.0 < mu < 1.0 and sorted(ya.tolist()) == list(range(8))
    assert torch.equal(xa, mu * x + (1.0 - mu) * x[ya])  # the partners are the permuted rows (y[i] = i here)
    assert InputMixup(1.0, 0, 2, 6, "p")(x, y)[2] != mu  # another client draws its own


def test_the_loss_weighs_the_two_labels_cross_entropy_by_mu(out):
    cfg = load_config(tiny(out, "method.name=fedavg_mixup"))
    module = METHODS["fedavg_mixup"].client_cls(cfg, build_data(cfg))
    module.cid, module.round = 1, 0
    module.on_local_train_start()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 5])
    loss = module.training_step((x, y), 0)
    draws = InputMixup(cfg.method.alpha, cfg.seed, 0, 1, "fedavg_mixup")
    mixed, partners, mu = draws(x, y)
    logits = module(mixed).float()
    assert torch.allclose(loss, mu * F.cross_entropy(logits, y) + (1.0 - mu) * F.cross_entropy(logits, partners))


def test_with_every_mu_one_it_is_fedavg_bit_for_bit(out, monkeypatch):
    monkeypatch.setattr(fedavg_mixup.InputMixup, "__call__", lambda self, x, y: (x, y, 1.0))
    avg = run_tiny(out, "trainer.rounds=2", name="fedavg")
    mix = run_tiny(out, "trainer.rounds=2", "method.name=fedavg_mixup", name="mixup")
    assert read_metrics(avg) == read_metrics(mix)
    a, b = global_params(avg), global_params(mix)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
