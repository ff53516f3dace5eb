"""Local batches (fl/core/batches.py): index batches over epochs or steps, and seeded augmentation."""
import pytest
import torch

from fl.core import augment, batch_indices
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
