"""Local batches (fl/core/batches.py): index batches over epochs or steps, and seeded augmentation."""
import pytest
import torch

from fl.core import augment, batch_indices
from fl.core.batches import count_batches
from fl.core.seeding import generator


def test_batch_indices_epochs_cover_each_sample_once_per_pass():
    seen = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=2) if idx is not None]
    assert [len(i) for i in seen] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(seen[:3]).tolist()) == list(range(10))
    marks = [e for e, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=2) if idx is None]
    assert marks == [0, 1]


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
