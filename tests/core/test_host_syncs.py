"""What would keep a GPU waiting for the host, pinned on the CPU: per batch and per step nothing is read back from
the device and no tensor is built from Python data on it (tests/helpers.py `TorchCalls` counts such calls), host
memory reaches a GPU through pinned memory, and what every evaluation round reuses is made once."""
import torch

from fl.config import load_config
from fl.core import augment, make_client_module
from fl.core.federated_data import FederatedData, Split, gather_rows, rows_to
from fl.core.seeding import generator
from fl.data import build_data
from fl.run.train import make_fabric
from tests.helpers import TorchCalls, tiny

FEDDRM = ["conf=feddrm_cifar10_dir03_synthetic", "data.embedded.samples_per_class=20", "model.width=4"]


def module_and_data(out, *extra):
    cfg = load_config(tiny(out, *extra))
    fabric = make_fabric(cfg, [], [])
    module, data = make_client_module(cfg, fabric, build_data(cfg))
    module.cid, module.round = 0, 0
    return module, data, fabric


def test_normalisation_is_built_once_per_device_and_dtype_and_equals_the_per_batch_tensors():
    data = FederatedData("d", 2, (3, 4, 4), [], mean=(0.4914, 0.4822, 0.4465), std=(0.247, 0.243, 0.261))
    x = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8)
    shape = (1, -1, 1, 1)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        before = x.to(dtype).div_(255).sub_(torch.tensor(data.mean, dtype=dtype).view(shape)).div_(
            torch.tensor(data.std, dtype=dtype).view(shape))  # what prepare() built for every batch
        with TorchCalls() as first:
            assert torch.equal(data.prepare(x, dtype), before)
        with TorchCalls() as later:
            assert torch.equal(data.prepare(x, dtype), before)
        assert first.host_reads == [("tensor", "cpu")] * 2 and later.host_reads == []


def test_a_training_batch_cropped_and_colour_shifted_per_owner_reads_nothing_from_the_device(tmp_path):
    """FedDRM's protocol (resized_crop, then each sample's owner's colour shift, then normalisation) and the other
    augmentations, as make_batch runs them, on a batch held on the `meta` device: no value of it is ever read."""
    _module, data, _fabric = module_and_data(tmp_path, *FEDDRM, "data.client_transform.after_augment=true")
    pooled = data.pooled_train()
    assert pooled.owner is not None and len(pooled.owner.unique()) == data.num_clients
    idx = torch.randperm(len(pooled), generator=torch.Generator().manual_seed(0))[:32]
    x, owner = pooled.x[idx].to("meta"), pooled.owner[idx].to("meta")

    def batch(gen):
        shifted = data.batch_transform(augment(x, ["resized_crop", "flip", "crop", "rotate"], gen), owner)
        return data.prepare(shifted)

    batch(generator(0, 0, 0, "warm"))  # the first batch builds the colour and normalisation tables
    with TorchCalls() as calls:
        out = batch(generator(0, 0, 0, "x"))
    assert out.shape == x.shape and out.dtype == torch.float32 and calls.device_reads() == []


def test_apfl_step_reads_nothing_from_the_device(tmp_path):
    """APFL logged float(alpha) at every step."""
    module, data, fabric = module_and_data(tmp_path, "method.name=apfl", "method.alpha_lr=0.5")
    module.load_client_state(None)
    module._local_optimizer = fabric.setup_optimizers(module.configure_optimizers())
    batch = module.make_batch(data.clients[0].train, torch.arange(8))
    with TorchCalls() as calls:
        out = module.training_step(batch, 0)
    assert calls.host_reads == []  # the CPU's reads too: none at all
    assert torch.is_tensor(out["alpha"]) and torch.equal(out["alpha"], module.alpha)  # logged as a tensor


def test_rows_from_host_memory_to_a_gpu_are_gathered_into_pinned_memory(monkeypatch):
    """data.on_device=false: a copy from pageable memory makes the host wait for it, one from pinned memory does not.
    No GPU here: the allocation's pinning is recorded and the copy to the device is left out."""
    pinned, empty = [], torch.empty

    def recording_empty(*args, pin_memory=False, **kwargs):
        pinned.append(pin_memory)
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self)
    x = torch.arange(24.0).view(12, 2)
    assert torch.equal(rows_to(x, torch.tensor([5, 1, 5]), torch.device("cuda")), x[[5, 1, 5]])
    assert torch.equal(rows_to(x, slice(3, 7), torch.device("cuda")), x[3:7])
    assert pinned == [True, True]
    assert torch.equal(rows_to(x, torch.tensor([2]), torch.device("cpu")), x[[2]]) and pinned == [True, True]


def test_gathered_rows_equal_indexing():
    x = torch.randint(0, 256, (10, 3, 2, 2), dtype=torch.uint8)
    for t in (x, x.transpose(2, 3), x[:, 0]):  # contiguous images, strided ones, one channel
        for idx in (torch.tensor([9, 0, 3, 3]), slice(2, 8), slice(7, 30), torch.tensor([], dtype=torch.int64),
                    torch.arange(10) % 3 == 0):
            rows = gather_rows(t, idx, pin=False)
            assert torch.equal(rows, t[idx]) and rows.data_ptr() != t.data_ptr() and rows.shape == t[idx].shape


def test_the_pooled_test_set_is_made_once_and_anew_for_a_moved_or_validation_view(tmp_path):
    _module, data, _fabric = module_and_data(tmp_path, "data.val_fraction=0.2")
    pooled = data.pooled_test()
    assert data.pooled_test() is pooled
    union = Split.cat([c.test for c in data.clients])
    assert torch.equal(pooled.x, union.x) and torch.equal(pooled.y, union.y)
    moved = data.to("cpu", torch.float64)
    assert moved.pooled_test() is not pooled and torch.equal(moved.pooled_test().y, union.y)
    val = data.validation_view().pooled_test()
    assert torch.equal(val.y, torch.cat([c.val.y for c in data.clients]))
