"""FedDRM's pipeline order (official utils/dataset.py): RandomResizedCrop, then the client's colour shift.
`data.client_transform.after_augment` shifts each batch after its augmentation; `data.eval_augment` crops
evaluation batches too (seeded per batch)."""
import pytest
import torch

from fl.config import ConfigError, load_config
from fl.core import make_client_module
from fl.core.batches import augment
from fl.core.seeding import generator
from fl.data import build_data
from fl.data.transforms import feddrm_color
from fl.run.train import make_fabric
from tests.helpers import read_metrics, run_tiny, tiny

FEDDRM = ["conf=feddrm_cifar10_dir03_synthetic", "trainer.rounds=2", "data.embedded.samples_per_class=20",
          "model.width=4"]


def module_and_data(out, *extra):
    cfg = load_config(tiny(out, *FEDDRM, *extra))
    fabric = make_fabric(cfg, [], [])
    module, data = make_client_module(cfg, fabric, build_data(cfg))
    module.cid, module.round = 0, 0
    return module, data, fabric


def raw_images(out, cid):
    """Client `cid`'s stored training images with no colour shift (the same split: the partition does not
    depend on the transform)."""
    _, data, _ = module_and_data(out, "data.client_transform.name=none")
    return data.clients[cid].train.x


def test_training_batches_are_cropped_then_colour_shifted(tmp_path):
    module, data, _fabric = module_and_data(tmp_path, "data.augment=[resized_crop]",
                                            "data.client_transform.after_augment=true")
    cid, idx = 3, torch.arange(7)
    raw = raw_images(tmp_path, cid)[idx]
    want = feddrm_color(augment(raw, ["resized_crop"], generator(0, 0, cid, "x")), cid, data.num_clients)
    x, _ = module.make_batch(data.clients[cid].train, idx, generator(0, 0, cid, "x"))
    assert torch.equal(x, data.prepare(want))
    # the other order (colour once, then crop) gives other pixels: the option changes what the model sees
    cached, _, _ = module_and_data(tmp_path, "data.augment=[resized_crop]", "data.client_transform.after_augment=false")
    y, _ = cached.make_batch(cached.data.clients[cid].train, idx, generator(0, 0, cid, "x"))
    assert not torch.equal(x, y)
    assert torch.equal(y, data.prepare(augment(feddrm_color(raw, cid, data.num_clients), ["resized_crop"],
                                               generator(0, 0, cid, "x"))))


def test_pooled_batches_take_each_samples_own_shift(tmp_path):
    module, data, _fabric = module_and_data(tmp_path, "data.client_transform.after_augment=true")
    pooled = data.pooled_train()
    x, _ = module.make_batch(pooled, torch.arange(len(pooled)))
    start = 0
    for cid, c in enumerate(data.clients):
        want = feddrm_color(raw_images(tmp_path, cid), cid, data.num_clients)
        assert torch.equal(x[start:start + len(c.train)], data.prepare(want))
        start += len(c.train)


@pytest.mark.slow
def test_without_augmentation_per_batch_shift_equals_shifting_the_stored_images(tmp_path):
    once = run_tiny(tmp_path, *FEDDRM, "data.client_transform.after_augment=false", name="once")
    per_batch = run_tiny(tmp_path, *FEDDRM, "data.client_transform.after_augment=true", name="per_batch")
    assert read_metrics(once) == read_metrics(per_batch)  # every value bitwise; the wall times aside


def test_eval_augment_is_seeded_per_batch_position(tmp_path):
    module, data, _fabric = module_and_data(tmp_path, "data.augment=[resized_crop]", "data.eval_augment=true",
                                            "trainer.eval_batch_size=8")
    test = data.clients[0].test
    ident = lambda x: x  # noqa: E731
    whole = torch.cat([x for x, _ in module.eval_pass(test, ident)])
    assert torch.equal(whole, torch.cat([x for x, _ in module.eval_pass(test, ident)]))  # reproducible
    shards = [list(module.eval_pass(test, ident, start=s, stride=2)) for s in (0, 1)]
    interleaved = [b for pair in zip(*shards) for b in pair] + shards[0][len(shards[1]):]
    assert torch.equal(whole, torch.cat([x for x, _ in interleaved]))  # two processes see the same crops
    plain, _, _ = module_and_data(tmp_path, "data.augment=[resized_crop]", "trainer.eval_batch_size=8")
    assert not torch.equal(whole, torch.cat([x for x, _ in plain.eval_pass(plain.data.clients[0].test, ident)]))


def test_per_batch_shift_needs_a_deterministic_transform(tmp_path):
    with pytest.raises(ConfigError, match="data.client_transform.after_augment=true .*feddrm_color"):
        module_and_data(tmp_path, "data.client_transform.name=cifar_s", "data.client_transform.after_augment=true")
