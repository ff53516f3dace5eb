"""Local batches (fl/core/batches.py): index batches over epochs or steps, and seeded augmentation."""
import pytest
import torch

from fl.config import load_config
from fl.core import augment, batch_indices
from fl.core.batches import count_batches, eval_batch_size
from fl.core.seeding import generator


def test_batch_indices_epochs_cover_each_sample_once_per_pass():
    seen = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=2) if idx is not None]
    assert [len(i) for i in seen] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(seen[:3]).tolist()) == list(range(10))
    marks = [e for e, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=2) if idx is None]
    assert marks == [0, 1]


def test_the_evaluation_batch_size_is_the_devices_unless_set():
    default = load_config([])
    assert default.trainer.eval_batch_size is None
    devices = ("cpu", torch.device("cpu"), "cuda", "cuda:1")
    assert [eval_batch_size(default, d) for d in devices] == [128, 128, 1024, 1024]
    assert eval_batch_size(load_config(["trainer.eval_batch_size=7"]), "cuda") == 7


def test_batch_indices_steps_counts_steps_across_passes():
    got = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), steps=5) if idx is not None]
    assert len(got) == 5
    dropped = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=1, drop_last=True)
               if idx is not None]
    assert [len(i) for i in dropped] == [4, 4]


@pytest.mark.parametrize("n,bs,epochs,steps,drop_last", [(130, 64, 1, None, False), (130, 64, 5, None, True),
                                                         (130, 64, None, 7, False), (30, 64, 2, None, True),
                                                         (0, 8, 1, None, False)])
def test_count_batches_counts_what_batch_indices_yields(n, bs, epochs, steps, drop_last):
    gen = torch.Generator().manual_seed(0)
    yielded = sum(idx is not None for _, idx in batch_indices(n, bs, gen, epochs=epochs, steps=steps,
                                                              drop_last=drop_last))
    assert count_batches(n, bs, epochs, steps, drop_last) == yielded


def test_augmentations_are_seeded_and_keep_shapes():
    x = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    names = ["flip", "crop", "resized_crop", "rotate"]
    a = augment(x, names, generator(0, 1, 2, "train/augment"))
    b = augment(x, names, generator(0, 1, 2, "train/augment"))
    c = augment(x, names, generator(0, 1, 3, "train/augment"))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    flipped = augment(x, ["flip"], generator(0, 0, 0, "f"))  # each image is itself or its mirror
    assert all(torch.equal(f, i) or torch.equal(f, i.flip(-1)) for f, i in zip(flipped, x))
    with pytest.raises(ValueError, match="image batches"):
        augment(torch.zeros(4, 10), ["flip"], generator(0, 0, 0, "f"))


@pytest.mark.parametrize("size, scale, ratio", [((32, 32), (0.9, 1.0), (3 / 4, 4 / 3)),
                                                ((32, 32), (0.08, 1.0), (3 / 4, 4 / 3)),
                                                ((24, 40), (0.9, 1.0), (1.0, 1.0))])
def test_resized_crop_boxes_are_torchvisions(size, scale, ratio):
    """The box of `resized_crop` is torchvision's RandomResizedCrop.get_params draw for draw (10 tries, then the
    centre crop): the same seed in our generator and in torch's global one gives the same box."""
    from torchvision import transforms as T

    from fl.data.augment import resized_crop_params

    img = torch.zeros(3, *size)
    for seed in range(300):
        torch.manual_seed(seed)
        expected = T.RandomResizedCrop.get_params(img, list(scale), list(ratio))
        assert resized_crop_params(*size, torch.Generator().manual_seed(seed), scale, ratio) == expected, seed


def test_resized_crop_at_feddrms_scale_crops_most_images():
    """scale 0.9-1 on 32 px images: torchvision keeps about 9% of the images whole (a single draw with a
    whole-image fallback kept 72%)."""
    from fl.data.augment import resized_crop_params

    gen = torch.Generator().manual_seed(0)
    boxes = [resized_crop_params(32, 32, gen) for _ in range(4000)]
    whole = sum(b == (0, 0, 32, 32) for b in boxes) / len(boxes)
    assert 0.05 < whole < 0.14


# ---- the batched augmentations against torchvision's per-image calls, with the same draws ----------------------
def per_image_crop(x, gen, pad=4):
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen).tolist()
    dx = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen).tolist()
    return torch.stack([padded[i, :, a:a + h, b:b + w] for i, (a, b) in enumerate(zip(dy, dx))])


def per_image_rotate(x, gen, degrees=30.0):
    from torchvision.transforms.v2 import functional as TF

    angles = torch.empty(len(x)).uniform_(-degrees, degrees, generator=gen).tolist()
    return torch.stack([TF.rotate(img, a) for img, a in zip(x, angles)])


def per_image_resized_crop(x, gen, scale=(0.9, 1.0), as_float=False):
    from torchvision.transforms.v2 import functional as TF

    from fl.data.augment import resized_crop_params

    h, w = x.shape[-2:]
    crops = [TF.resized_crop(img.float() if as_float else img, *resized_crop_params(h, w, gen, scale), [h, w],
                             antialias=True) for img in x]
    return torch.stack([c.round().to(x.dtype) if as_float else c for c in crops])


def images(shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(64, 3, 32, 32), (16, 3, 24, 40), (16, 1, 28, 28)])
def test_crop_and_rotate_equal_torchvisions_per_image_calls_bit_for_bit(shape):
    from fl.data.augment import _crop, _rotate

    x = images(shape)
    for img in (x, x.float() / 255, x.double() / 255):
        for batched, per_image in ((_crop, per_image_crop), (_rotate, per_image_rotate)):
            assert torch.equal(batched(img, torch.Generator().manual_seed(7)),
                               per_image(img, torch.Generator().manual_seed(7))), (batched.__name__, img.dtype)


@pytest.mark.parametrize("scale", [(0.9, 1.0), (0.08, 1.0)])
def test_resized_crop_equals_torchvisions_float_resize_and_its_uint8_kernel_within_one_grey_level(scale):
    """uint8 images are resampled in float32 and rounded, as torchvision resizes them on a GPU: equal to that bit
    for bit. torchvision's CPU uint8 kernel rounds fixed-point weights: one grey level apart on some pixels (6% at
    FedDRM's scale 0.9-1, 17% at 0.08-1 on random images). Float images: equal up to float rounding."""
    from fl.data.augment import _resized_crop

    x = images((256, 3, 32, 32))
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    out = _resized_crop(x, gen(), scale)
    assert torch.equal(out, per_image_resized_crop(x, gen(), scale, as_float=True))
    apart = (out.int() - per_image_resized_crop(x, gen(), scale).int()).abs()
    assert apart.max() <= 1 and apart.float().mean() < (0.1 if scale[0] == 0.9 else 0.25)
    for dtype, tol in ((torch.float32, 2e-7), (torch.float64, 1e-15)):
        img = x.to(dtype) / 255
        torch.testing.assert_close(_resized_crop(img, gen(), scale), per_image_resized_crop(img, gen(), scale),
                                   rtol=0, atol=tol)
    whole = torch.Generator().manual_seed(0)  # whole-image boxes come back unchanged
    assert torch.equal(_resized_crop(x[:1], whole, (1.0, 1.0), ratio=(1.0, 1.0)), x[:1])


def test_augmentations_run_a_fixed_number_of_torch_calls_whatever_the_batch_size():
    """One gather or one sampling grid per batch, not calls per image, on the batch's device (the resized crop's
    draws are the CPU generator's, image after image, as torchvision draws them)."""
    from tests.helpers import TorchCalls

    def calls(name, n):
        x = images((n, 3, 16, 16)).to("meta")
        with TorchCalls() as c:
            augment(x, [name], generator(0, 0, 0, "a"))
        return len(c.on("meta"))

    for name in ("flip", "crop", "resized_crop", "rotate"):
        assert calls(name, 4) == calls(name, 32), name
