"""FedSAM (fl/methods/fedsam.py): with rho = 0 it is FedAvg exactly and its step matches SAM written by hand;
FedSAM-FT is FedSAM plus the fine-tuning protocol; its configs stay equal to FedDRM's outside the method block."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from omegaconf import OmegaConf

from fl.config import load_config
from fl.core import batch_indices, generator, sample_clients
from fl.data import build_data
from tests.helpers import (
    global_params,
    initial_model,
    load_ckpt,
    read_metrics,
    run_tiny,
    tiny,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall times."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run_dir)]


# ---- FedSAM --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [["model.norm=batch"], ["model.name=fedct_cnn", "trainer.drop_last=true"]],
                         ids=["cnn_batchnorm", "bn_and_dropout"])
def test_fedsam_with_rho_0_is_fedavg_exactly(out, model):
    """eps = 0: the second pass sees the same weights, batch, dropout draws and BatchNorm statistics, so every step,
    the global model (running statistics and num_batches_tracked included) and every FedAvg metric are FedAvg's."""
    extra = ("trainer.rounds=2", "optim.momentum=0.9", "trainer.local_steps=3", *model)
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    sam = run_tiny(out, "method.name=fedsam", "method.rho=0", *extra, name="sam")
    ga, gs = global_params(avg), global_params(sam)
    assert ga.keys() == gs.keys() and all(torch.equal(ga[k], gs[k]) for k in ga)
    assert any("running_mean" in k for k in ga) and any("num_batches_tracked" in k for k in ga)
    ra, rs = rows(avg), rows(sam)
    assert len(ra) == 2 and [{k: r[k] for k in a} for a, r in zip(ra, rs)] == ra
    assert all(r["train/sam_loss"] == r["train/loss"] for r in rs)  # no perturbation: the same loss twice


def test_fedsam_steps_match_sam_by_hand(out):
    """One client (participation 0.1 of 6), 3 local steps of plain SGD: g = grad L_B(w), eps = rho g / ||g|| over all
    parameters, w <- w - lr grad L_B(w + eps); the global model is that client's model."""
    extra = ("method.name=fedsam", "method.rho=0.5", "trainer.rounds=1", "trainer.participation=0.1",
             "trainer.local_steps=3", "optim.momentum=0", "optim.lr=0.1")
    got = global_params(run_tiny(out, *extra, name="sam"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    (cid,) = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    train = data.clients[cid].train
    params = list(model.parameters())
    for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 0, cid, "train"), steps=3):
        if idx is None:
            continue
        x, y = data.prepare(train.x[idx]), train.y[idx]
        g = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        norm = math.sqrt(sum(float((gi ** 2).sum()) for gi in g))
        w = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, gi in zip(params, g):
                p += 0.5 * gi / norm
        g_sam = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for p, wi, gi in zip(params, w, g_sam):
                p.copy_(wi - 0.1 * gi)
    plain = initial_model(cfg, data).state_dict()
    moved = 0.0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got["model." + k], v, rtol=1e-5, atol=1e-6)
        moved = max(moved, float((v - plain[k]).abs().max()))
    assert moved > 1e-3


def test_fedsam_ft_is_fedsam_then_the_fine_tuning_rounds(out):
    """finetune.after_round=1: round 0 is FedSAM, round 1 fine-tunes each client locally with plain cross-entropy
    (no sam_loss logged, nothing uploaded) and leaves the global model at FedSAM's."""
    common = ("method.name=fedsam", "trainer.participation=1.0", "trainer.local_steps=2", "trainer.checkpoint_every=0")
    sam = run_tiny(out, *common, "trainer.rounds=1", name="sam")
    ft = run_tiny(out, *common, "trainer.rounds=2", "finetune.after_round=1", name="ft")
    g, gft = global_params(sam), global_params(ft)
    assert all(torch.equal(g[k], gft[k]) for k in g)
    first, last = rows(ft)
    assert "train/sam_loss" in first and "train/sam_loss" not in last and last["comm/bytes_up"] == 0.0
    clients = load_ckpt(ft)["clients"]
    assert len(clients) == 6
    assert all(not torch.equal(s["private"][k], g[k]) for s in clients.values() for k in ["model.head.weight"])


@pytest.mark.parametrize("sweep", ["feddrm_ft_baselines_synthetic", "feddrm_ft_baselines_real"])
def test_feddrm_ft_sweeps_run_fedsam_ft_with_its_default_rho(sweep):
    spec = yaml.safe_load((ROOT / "sweeps" / f"{sweep}.yaml").read_text())
    assert "fedsam" in spec["parameters"]["method.name"]["values"]
    fixed = [a for a in spec["command"] if "=" in str(a)]
    cfg = load_config([*fixed, "method.name=fedsam"])
    assert cfg.method.rho == 0.05 and cfg.finetune.after_round is not None
    assert cfg.finetune.after_round < cfg.trainer.rounds


# ---- configs -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mine, theirs", [
    ("fedsam_cifar10_dir03", "feddrm_cifar10_dir03"),
    ("fedsam_cifar10_dir03_synthetic", "feddrm_cifar10_dir03_synthetic"),
])
def test_baseline_configs_repeat_their_papers_protocol_outside_the_method_block(mine, theirs):
    a, b = (OmegaConf.to_container(load_config([f"conf={n}"]), resolve=True) for n in (mine, theirs))
    assert a.pop("method")["name"] in ("fedsam", "fednh")
    b.pop("method")
    assert a == b


def test_baseline_configs_hold_the_chosen_values():
    sam = load_config(["conf=fedsam_cifar10_dir03"])
    assert sam.method.rho == 0.05 and sam.model.proj_dim == 256
