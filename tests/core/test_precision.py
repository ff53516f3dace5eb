"""Mixed precision on the CPU, as CUDA runs it: `fabric.precision=16-mixed` is float16 autocast with a real GradScaler
(Fabric's own plugin), bf16-mixed is bfloat16 autocast. The float32 islands (fl/core/precision.py) give the same
numbers under autocast as without it; each client keeps its own loss scale (1 process == 2, resumed ==
uninterrupted); initial models are drawn on the CPU whatever the device; every method trains under both."""
import contextlib
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.core import float32_island, loss_scaler, make_client_module
from fl.core.loop import LOSS_SCALE
from fl.data import build_data
from fl.methods.fedala import weight_gradients
from fl.methods.feddecorr import decorr_loss
from fl.methods.fednh import init_prototypes
from fl.methods.fedrod import balanced_softmax_loss
from fl.methods.perfedavg import hessian_vector_fd, loss_and_grad
from fl.methods.pfedfda import lda_logits
from fl.methods.pfedfda.stats import lda_head
from fl.methods.pfedme import solve_inner
from fl.run.train import main, make_fabric
from tests import conformance
from tests.helpers import (
    interrupted_and_resumed,
    load_ckpt,
    orchestrator,
    read_metrics,
    run_tiny,
    same_private_states,
    tiny,
)
from tests.jumpy_loss_scale import jumpy
from tests.process_pairs import on_one_and_two_processes

AUTOCASTS = [torch.bfloat16, torch.float16]


def autocast(dtype):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


# ---- the island ------------------------------------------------------------------------------------------------------
@float32_island
def _probe(a, b, *, c=None):
    return a @ b, a.dtype, None if c is None else c.dtype


@pytest.mark.parametrize("dtype", AUTOCASTS)
def test_an_island_computes_in_float32_under_autocast(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    with autocast(dtype):
        assert (a @ b).dtype == dtype  # autocast outside the island
        out, a_dtype, c_dtype = _probe(a.to(dtype), b, c=a.double())
        assert torch.is_autocast_enabled("cpu")  # restored on the way out
    assert a_dtype == torch.float32 and c_dtype == torch.float64  # half widened; float64 kept (64-true)
    assert torch.equal(out, a.to(dtype).float() @ b)
    # without autocast (16-true, bf16-true: half parameters) the island changes nothing
    assert _probe(a.bfloat16(), b.bfloat16())[1] == torch.bfloat16


def _same(x, y) -> bool:
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (tuple, list)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return torch.equal(x, y) if torch.is_tensor(x) else x == y


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _lda_case():
    """An LDA head whose bias cancels most of z W^T (b = -1/2 mu W + log pi) and whose W exceeds float16's range."""
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(5, 16, generator=g, dtype=torch.float64) * 3
    cov = torch.eye(16, dtype=torch.float64) * 1e-4
    W, b = lda_head(mu, cov, torch.full((5,), -math.log(5), dtype=torch.float64))
    z = (mu[torch.arange(64) % 5] + torch.randn(64, 16, generator=g, dtype=torch.float64) * 0.05).float()
    assert float(W.abs().max()) > 65504  # inf in float16
    return z, W.float(), b.float()


def _hvp_case():
    model, g = _mlp(), torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)
    w = {k: p.detach() for k, p in model.named_parameters()}
    v = {k: torch.randn(p.shape, generator=g) for k, p in w.items()}
    return model, w, v, x, y


def _pfedme_inner():
    model, g = _mlp(), torch.Generator().manual_seed(2)
    x, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
    w = [p.detach().clone() + 0.3 for p in model.parameters()]
    theta = list(model.parameters())
    loss, norm = solve_inner(theta, w, lambda: F.cross_entropy(model(x), y), lam=5.0, lr=0.1, steps=5)
    return loss, norm, [t.detach().clone() for t in theta]


def _fedala_case():
    model, g = _mlp(), torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
    glob = {k: p.detach() for k, p in model.named_parameters()}
    local = {k: p + 0.5 * torch.randn(p.shape, generator=g) for k, p in glob.items()}
    W = {k: torch.rand(glob[k].shape, generator=g) for k in ("2.weight", "2.bias")}
    return weight_gradients(model, local, glob, W, x, y)


ISLANDS = {  # each float32 island of a method, as a function of the dtype autocast gives activations (None: no
    # autocast): the same value under autocast as without
    "pfedfda_lda_head": lambda half: lda_logits(*_lda_case()),
    "feddecorr_paper": lambda half: decorr_loss(torch.randn(64, 32, generator=torch.Generator().manual_seed(4)) * 30),
    "feddecorr_official": lambda half: decorr_loss(
        torch.randn(64, 32, generator=torch.Generator().manual_seed(4)) * 30, "official"),
    "fedrod_balanced_softmax": lambda half: balanced_softmax_loss(  # logits as the head gives them (half, in autocast)
        torch.randn(16, 4, generator=torch.Generator().manual_seed(5)).bfloat16().to(half or torch.float32),
        torch.arange(16) % 4, torch.tensor([70000, 300, 1, 257])),
    "perfedavg_grad": lambda half: loss_and_grad(*_hvp_case()[:2], *_hvp_case()[3:]),
    "perfedavg_hessian_free": lambda half: hessian_vector_fd(*_hvp_case(), delta=1e-3),
    "pfedme_inner_problem": lambda half: _pfedme_inner(),
    "fedala_weight_gradients": lambda half: _fedala_case(),
}


@pytest.mark.parametrize("dtype", AUTOCASTS)
@pytest.mark.parametrize("island", sorted(ISLANDS))
def test_each_island_gives_the_float32_value_under_autocast(island, dtype):
    reference = ISLANDS[island](None)
    with autocast(dtype):
        got = ISLANDS[island](dtype)
    assert _same(got, reference), island


def test_the_hessian_free_step_is_accurate_under_bf16_autocast():
    """Per-FedAvg HF: the finite difference of two autocast gradients was 58% off in bf16; the island matches the
    exact Hessian-vector product as float32 does."""
    model, w, v, x, y = _hvp_case()
    from torch.func import functional_call
    _, exact = torch.autograd.functional.hvp(
        lambda *ps: F.cross_entropy(functional_call(model, dict(zip(w, ps)), (x,)), y), tuple(w.values()),
        tuple(v.values()))
    with autocast(torch.bfloat16):
        approx = hessian_vector_fd(model, w, v, x, y, delta=1e-2)
    err = torch.cat([(approx[k] - e).flatten() for k, e in zip(w, exact)]).norm()
    assert float(err / torch.cat([e.flatten() for e in exact]).norm()) < 1e-2


# ---- Fabric's 16-mixed on the CPU ------------------------------------------------------------------------------------
def test_16_mixed_on_the_cpu_is_float16_autocast_with_a_grad_scaler(out):
    """Lightning turns 16-mixed into bf16-mixed on the CPU; the run gets what it asked for."""
    fabric = make_fabric(load_config(tiny(out, "fabric.precision=16-mixed")), [], [])
    with fabric.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    assert loss_scaler(fabric) is not None
    assert loss_scaler(make_fabric(load_config(tiny(out, "fabric.precision=bf16-mixed")), [], [])) is None


# ---- initial models: drawn on the CPU --------------------------------------------------------------------------------
# every method the package registers, with what its runs need (tests/conformance.py): a new one is tested too
ALL_METHODS = conformance.METHODS
# APFL's adaptive alpha refuses 16-mixed (its gradient would carry the loss scale)
UNDER_AUTOCAST = {"apfl": ("method.adaptive=false",)}


def method_args(method: str) -> tuple[str, ...]:
    return (*conformance.method_args(method), *UNDER_AUTOCAST.get(method, ()))


def test_every_method_is_covered():
    assert set(UNDER_AUTOCAST) <= set(ALL_METHODS) and len(ALL_METHODS) > 30


@pytest.mark.parametrize("method", ALL_METHODS)
def test_the_initial_model_is_drawn_on_the_cpu_under_any_device_context(out, method):
    """On a GPU, Fabric's init_module puts torch.device(cuda) around the build: the CUDA generator would draw other
    weights than the CPU's, and a draw with a CPU generator fails (FedNH's prototypes). Simulated with the meta
    device: the module built under it equals the one built on the CPU."""
    cfg = load_config(tiny(out, *method_args(method)))
    data = build_data(cfg)
    fabric = make_fabric(cfg, [], [])
    plain, _ = make_client_module(cfg, fabric, data)
    real = fabric.init_module

    @contextlib.contextmanager
    def on_another_device(*args, **kwargs):
        with real(*args, **kwargs), torch.device("meta"):
            yield

    fabric.init_module = on_another_device
    moved, _ = make_client_module(cfg, fabric, data)
    a, b = plain.state_dict(), moved.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fednh_prototypes_are_drawn_where_the_generator_lives():
    draw = lambda: init_prototypes(10, 8, torch.Generator().manual_seed(0))  # noqa: E731
    with torch.device("meta"):
        got = draw()
    assert got.device.type == "cpu" and torch.equal(got, draw())


# ---- the loss scale of 16-mixed: one per client ----------------------------------------------------------------------
JUMPY = ("fabric.precision=16-mixed", "fabric.cpu_threads=1")


def test_a_clients_loss_scale_depends_on_its_own_history_only(out, monkeypatch):
    """Client b after client a trains as client b alone: the scaler does not carry a's scale over."""
    monkeypatch.setattr("lightning.fabric.plugins.precision.MixedPrecision", jumpy)
    cfg = load_config(tiny(out, *JUMPY))

    def train(cids):
        orch = orchestrator(cfg, out / "run")
        results = [orch.train_client(0, cid) for cid in cids]
        upload, result = results[-1]
        return {k: v.clone() for k, v in upload.params.items()}, result.state[LOSS_SCALE]

    (after, scale_after), (alone, scale_alone) = train([0, 3]), train([3])
    assert scale_after == scale_alone and scale_alone["scale"] != 2.0 ** 20  # the scale moved, the same way
    assert all(torch.equal(after[k], alone[k]) for k in alone)


def test_resumed_equals_uninterrupted_under_16_mixed(out, monkeypatch):
    monkeypatch.setattr("lightning.fabric.plugins.precision.MixedPrecision", jumpy)
    full, cut = interrupted_and_resumed(out, monkeypatch, *JUMPY, "trainer.rounds=4", at_round=2)
    assert read_metrics(full) == read_metrics(cut)
    a, b = load_ckpt(full), load_ckpt(cut)
    assert all(torch.equal(v, b["server"]["global_params"][k]) for k, v in a["server"]["global_params"].items())
    assert {c: s[LOSS_SCALE] for c, s in a["clients"].items()} == {c: s[LOSS_SCALE] for c, s in b["clients"].items()}


@on_one_and_two_processes("16_mixed_jumpy_scale", *JUMPY, "trainer.rounds=3", "trainer.participation=1.0")
def same_under_16_mixed_on_one_and_two_processes(one: Path, two: Path) -> None:
    """The jumpy scaler's steps (tests/every_method.py gives it to 16-mixed runs) skip the same way on either side."""
    assert read_metrics(one) == read_metrics(two)
    clients = load_ckpt(one)["clients"]
    assert same_private_states(clients, load_ckpt(two)["clients"])
    assert all(s[LOSS_SCALE]["growth_interval"] == 1 for s in clients.values())  # the jumpy scaler ran


def test_scaffold_reads_the_loss_scale_without_a_host_sync(out, monkeypatch):
    """GradScaler.get_scale() is a device-to-host copy: SCAFFOLD adds none to what the loop's per-client state
    bookkeeping does (FedAvg's count)."""
    calls = []
    original = torch.amp.GradScaler.get_scale
    monkeypatch.setattr(torch.amp.GradScaler, "get_scale", lambda self: calls.append(1) or original(self))
    counts = {}
    for method in ("fedavg", "scaffold"):
        calls.clear()
        run_tiny(out, f"method.name={method}", "fabric.precision=16-mixed", "trainer.rounds=1", name=method)
        counts[method] = len(calls)
    assert counts["scaffold"] == counts["fedavg"]


# ---- methods whose gradients are float32 islands train under 16-mixed as under 32-true -------------------------------
@pytest.mark.parametrize("method", [["method.name=pfedme"], ["method.name=perfedavg", "method.variant=hf"]])
def test_pfedme_and_perfedavg_train_under_16_mixed_exactly_as_under_32_true(out, method):
    """They crashed on their first 16-mixed step (their gradients never went through the scaler). Their gradients
    are float32 islands and the loss scale is a power of 2, so the trained models are the 32-true ones bit for bit."""
    extra = (*method, "trainer.rounds=2", "trainer.eval_every=2")
    full = load_ckpt(run_tiny(out, *extra, name="fp32"))
    half = load_ckpt(run_tiny(out, *extra, "fabric.precision=16-mixed", name="fp16"))
    a, b = full["server"]["global_params"], half["server"]["global_params"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert same_private_states(full["clients"], half["clients"])


# ---- the paper's comparisons agree with float32 on a 32-true checkpoint ----------------------------------------------
FIXED = ("data.embedded.samples_per_class=100", "model.width=8", "trainer.rounds=4", "trainer.checkpoint_every=4",
         "trainer.evaluators=[]")


def _trained(out: Path, method: str):
    """An orchestrator holding the last round of a 32-true run of `method`."""
    run_dir = run_tiny(out, f"method.name={method}", *FIXED, name=method)
    orch = orchestrator(load_config(tiny(out, f"method.name={method}", *FIXED)), out / "scoring")
    orch.restore(load_ckpt(run_dir), run_dir)
    return orch


def _inputs(orch):
    """Every client's training and test inputs, as batches of the model's input."""
    return [orch.module.make_batch(s, slice(0, len(s)))[0] for c in orch.data.clients for s in (c.train, c.test)]


def _argmax_under(fn, xs, dtype) -> torch.Tensor:
    with torch.no_grad(), autocast(dtype):
        return torch.cat([fn(x).argmax(1) for x in xs])


def test_pfedfda_predictions_agree_with_float32_under_autocast(out):
    orch = _trained(out, "pfedfda")
    xs, m = _inputs(orch), orch.module
    for cid in [-1, *range(orch.data.num_clients)]:
        orch.load_client(3, cid)
        if cid >= 0:
            m.personalize()
        m.eval()
        reference = _argmax_under(m.predict, xs, None)
        for dtype in AUTOCASTS:
            assert torch.equal(_argmax_under(m.predict, xs, dtype), reference), (cid, dtype)


def test_feddrm_routing_agrees_with_float32_under_autocast(out):
    orch = _trained(out, "feddrm")
    xs, m = _inputs(orch), orch.module
    orch.load_client(3, -1)
    m.eval()
    for fn in (m.route_scores, m.client_scores):
        reference = _argmax_under(fn, xs, None)
        for dtype in AUTOCASTS:
            assert torch.equal(_argmax_under(fn, xs, dtype), reference), dtype


# ---- every method trains a round under both mixed precisions ---------------------------------------------------------
@pytest.mark.parametrize("precision", ["16-mixed", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_trains_a_round_with_finite_losses(out, method, precision):
    extra = [*method_args(method), f"fabric.precision={precision}", "trainer.rounds=1", "data.num_clients=4",
             "data.embedded.samples_per_class=16", "trainer.participation=1.0", "fabric.cpu_threads=1"]
    assert main(tiny(out, *extra, "logger.run_name=run")) == 0  # a non-finite loss is a training fault (exit 1)
    row = read_metrics(out / "outputs" / "run")[0]
    assert math.isfinite(row["train/loss"])
    assert all(math.isfinite(v) for k, v in row.items() if k.startswith("test/"))
