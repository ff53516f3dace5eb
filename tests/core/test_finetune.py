"""Local fine-tuning rounds after round R (`finetune.*`: FedDRM's FedAvg-FT / FedProx-FT protocol, 700 FL rounds
then 100 local-only rounds) and the projection FedDRM's baselines share (`model.proj_dim`)."""
import math

import pytest
import torch
import torch.nn.functional as F

from fl.config import ConfigError, load_config
from fl.core import batch_indices, finetune_lr, make_client_module
from fl.core.seeding import generator
from fl.data import build_data
from fl.run.train import make_fabric
from tests.helpers import global_params, initial_model, load_ckpt, read_metrics, run_tiny, tiny

FT = ["trainer.participation=1.0", "trainer.local_steps=2", "trainer.checkpoint_every=0"]
# FedAvg for 2 rounds, then 1 fine-tuning round, summarised by that round alone
FT_ROUNDS = ["trainer.rounds=3", "finetune.after_round=2", "trainer.last_k=1", "finetune.lr=0.2"]


def test_finetune_lr_closed_forms():
    cfg = load_config(["optim.lr=0.01", "optim.round_schedule=cosine", "trainer.rounds=800",
                       "finetune.after_round=700"])
    assert finetune_lr(cfg, 750) == pytest.approx(0.005 * (1 + math.cos(math.pi * 750 / 800)))  # schedule goes on
    cfg.finetune.lr = 0.02
    assert finetune_lr(cfg, 750) == 0.02
    cfg.finetune.schedule = "cosine"
    assert finetune_lr(cfg, 700) == pytest.approx(0.02)
    assert finetune_lr(cfg, 750) == pytest.approx(0.01)  # half-way through the 100 fine-tuning rounds


def test_bad_finetune_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="finetune.after_round=5 leaves no fine-tuning round"):
        load_config(["trainer.rounds=5", "finetune.after_round=5"])
    with pytest.raises(ConfigError, match="fedavg_ft fine-tunes before each evaluation"):
        load_config(["method.name=fedavg_ft", "finetune.after_round=1", "trainer.rounds=3"])


@pytest.mark.parametrize("rounds, every, last_k, after, ok", [
    (30, 5, 3, 26, False),   # evaluations after rounds 20, 25, 30: two before the fine-tuning (FedDRM's old twin)
    (30, 5, 1, 26, True),    # the final evaluation only
    (30, 5, 2, 24, True),    # after rounds 25 and 30, the 25th the first to fine-tune (after_round counts 0-based)
    (30, 5, 2, 25, False),   # ... the 25th one round before the fine-tuning
    (800, 1, 50, 700, True),  # the paper's protocol: the last 50 of the 100 fine-tuning rounds
    (800, 1, 101, 700, False),
    (7, 3, 2, 3, True),      # evaluations after rounds 6 and 7 (the last always evaluates), both fine-tuned
    (7, 3, 3, 3, False),     # ... and after round 3, before it
])
def test_the_summarys_last_k_window_lies_inside_the_fine_tuning(rounds, every, last_k, after, ok):
    """The mean over the last K evaluations averages fine-tuned models only: the evaluation after round r (1-based)
    has fine-tuned iff r > finetune.after_round."""
    argv = [f"trainer.rounds={rounds}", f"trainer.eval_every={every}", f"trainer.last_k={last_k}",
            f"finetune.after_round={after}"]
    if ok:
        load_config(argv)
    else:
        with pytest.raises(ConfigError, match=r"trainer.last_k=\d+ averages the evaluations after rounds .* the "
                                              r"summary would mix models from before it; set trainer.last_k<="):
            load_config(argv)


@pytest.mark.slow
def test_fine_tuning_rounds_leave_the_global_model_and_train_each_client_from_it(tmp_path):
    """FedAvg for 2 rounds then 1 fine-tuning round: the global model is the 2-round run's; each client's model is
    that global model after SGD (a fresh momentum buffer) on its own batches at finetune.lr, computed here by hand."""
    fl_only = run_tiny(tmp_path, *FT, "trainer.rounds=2", name="fl_only")
    ft = run_tiny(tmp_path, *FT, *FT_ROUNDS, name="ft")
    g = global_params(fl_only)
    assert all(torch.equal(g[k], v) for k, v in global_params(ft).items())
    last = read_metrics(ft)[-1]
    assert last["comm/bytes_up"] == 0.0
    assert last["test/acc_global_micro"] == read_metrics(fl_only)[-1]["test/acc_global_micro"]

    cfg = load_config(tiny(tmp_path, *FT, *FT_ROUNDS))
    data = build_data(cfg)
    stored = load_ckpt(ft)["clients"]
    for cid in range(data.num_clients):
        model = initial_model(cfg, data)
        model.load_state_dict({k.removeprefix("model."): v for k, v in g.items()})
        train, velocity, mu = data.clients[cid].train, {}, cfg.optim.momentum
        for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 2, cid, "finetune"),
                                    steps=2):
            if idx is None:
                continue
            model.zero_grad()
            F.cross_entropy(model(data.prepare(train.x[idx])), train.y[idx]).backward()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    velocity[name] = mu * velocity[name] + p.grad if name in velocity else p.grad.clone()
                    p -= 0.2 * velocity[name]
        mine = stored[cid]["private"]
        for k, v in model.state_dict().items():
            assert torch.allclose(mine["model." + k], v, atol=1e-6), (cid, k)


@pytest.mark.slow
def test_fedavg_ft_learns_at_finetune_lr_not_at_the_cosine_schedules_last_rate(tmp_path):
    """Under a cosine schedule the last rounds' rate is ~0, so fine-tuning at it changes nothing; finetune.lr is
    the fine-tuning's own rate."""
    base = ["method.name=fedavg_ft", "optim.round_schedule=cosine", "optim.lr=0.05", "trainer.rounds=40",
            "trainer.eval_every=40", "trainer.local_steps=1", "trainer.checkpoint_every=0"]
    at_schedule = read_metrics(run_tiny(tmp_path, *base, name="sched"))[-1]
    own = read_metrics(run_tiny(tmp_path, *base, "finetune.lr=0.05", name="own"))[-1]
    assert abs(at_schedule["test/acc_mean_clients"] - at_schedule["test/acc_global_micro"]) < 0.01
    assert own["test/acc_global_micro"] == at_schedule["test/acc_global_micro"]  # the same FedAvg run underneath
    assert own["test/acc_mean_clients"] != at_schedule["test/acc_mean_clients"]


def module_for(tmp_path, *extra):
    cfg = load_config(tiny(tmp_path, *extra))
    fabric = make_fabric(cfg, [], [])
    module, _ = make_client_module(cfg, fabric, build_data(cfg))
    return module, fabric


def test_model_proj_dim_puts_a_shared_layernorm_projection_before_the_head(tmp_path):
    fedrep, _f1 = module_for(tmp_path, "method.name=fedrep", "model.proj_dim=8")
    shared = fedrep.shared_state()
    assert shared["model.backbone.proj.0.weight"].shape == (8, 16) and "model.backbone.proj.1.weight" in shared
    assert fedrep.model.head.in_features == 8 and set(fedrep.private_state()) == {"model.head.weight",
                                                                                    "model.head.bias"}
    x = torch.randn(3, *fedrep.data.input_shape)
    backbone = fedrep.model.backbone
    linear, norm = backbone.proj[0], backbone.proj[1]
    by_hand = F.relu(F.layer_norm(linear(backbone.body(x)), (8,), norm.weight, norm.bias))
    assert torch.allclose(backbone(x), by_hand)
    assert torch.count_nonzero(fedrep.model.head.bias) == 0  # FedDRM's official init: zero bias


def test_feddrm_builds_its_two_projections_of_model_proj_dim_on_the_raw_backbone(tmp_path):
    feddrm, _f = module_for(tmp_path, "method.name=feddrm", "model.proj_dim=8")
    net = feddrm.model
    assert net.target_proj[0].in_features == net.client_proj[0].in_features == 16  # the CNN's 4 * width features
    assert net.target_proj[0].out_features == net.client_proj[0].out_features == 8
    assert not any("body" in k for k in net.state_dict())  # no projection left inside the backbone
    with pytest.raises(ConfigError, match="method.proj_dim moved to model.proj_dim"):
        load_config(["method.name=feddrm", "method.proj_dim=8"])
