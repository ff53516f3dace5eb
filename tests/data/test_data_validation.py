"""Data faults are refused when the data is loaded: exit 2, one line naming the file and the problem, no run
directory. Before, they surfaced later as some method's failure, or not at all."""
import numpy as np
import pytest
import torch

from fl.config import ConfigError
from fl.core import Split
from fl.data.base import Pool
from fl.run.train import main
from tests import fakes
from tests.helpers import tiny

N = 60
rng = np.random.default_rng(0)
Y = np.arange(N) % 3


def images(*shape, dtype=np.float32):
    if dtype == np.uint8:
        return rng.integers(0, 256, (N, *shape), dtype=np.uint8)
    return rng.normal(size=(N, *shape)).astype(dtype)


def with_nan():
    x = images(3, 8, 8)
    x[7, 1, 2, 3] = np.nan
    return x


def with_inf():
    x = images(3, 8, 8)
    x[4, 0, 0, 0] = np.inf
    return x


def arrays_args(out, path, *extra):
    return ["logger.wandb.mode=disabled", "logger.progress=false", "data.name=arrays", f"data.root={path}",
            "data.num_clients=3", "data.partition.min_client_size=2", "model.width=4", "trainer.rounds=1",
            "trainer.batch_size=16", "fabric.cpu_threads=1", f"logger.output_dir={out / 'outputs'}", *extra]


@pytest.mark.parametrize("name, arrays, words", [
    # trained silently on a NaN pixel
    ("nan", {"x": with_nan(), "y": Y}, ["x holds NaN or inf", "sample 7", "finite"]),
    # stopped later with "non-finite loss in method 'fedavg'"
    ("inf", {"x": with_inf(), "y": Y}, ["x holds NaN or inf", "sample 4"]),
    ("all_nan", {"x": np.full((N, 3, 8, 8), np.nan, np.float32), "y": Y}, ["x holds NaN or inf", f"{N} of {N}"]),
    ("nan_test", {"x": images(3, 8, 8), "y": Y, "x_test": with_nan()[:9], "y_test": Y[:9]},
     ["x_test holds NaN or inf", "1 of 9"]),
    # every pixel identical: nothing to learn, and a std computed from the data is 0
    ("constant", {"x": np.full((N, 8, 8, 3), 7, np.uint8), "y": Y}, ["every value of x is 7", "zero std"]),
    ("constant_float", {"x": np.ones((N, 5), np.float32), "y": Y}, ["every value of x is 1", "zero std"]),
    ("zero_std", {"x": images(8, 8, dtype=np.uint8), "y": Y, "std": np.array([0.0])}, ["std=[0.0]", "> 0"]),
    # crashed in torchmetrics
    ("one_class", {"x": images(3, 8, 8), "y": np.zeros(N, np.int64)}, ["one class (0)", "at least 2 classes"]),
    # an evaluator allocated a buffer sized by the largest id (80 GB)
    ("sparse", {"x": images(3, 8, 8), "y": np.where(Y == 0, 0, 10**9)},
     ["labels must be integers in [0, num_classes)", "2 distinct labels up to 1000000000", "remap"]),
])
def test_data_fault_is_one_line_exit_2_and_writes_nothing(out, capsys, name, arrays, words):
    path = fakes.arrays(out / f"{name}.npz", **arrays)
    assert main(arrays_args(out, path)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (out / "outputs").exists()


def test_labels_outside_the_classes_are_refused_for_any_loader():
    """A loader that names K classes but gives label K (or -1): one line, not an index error in a metric."""
    from fl.data.base import check_pool

    x = torch.randn(8, 4)
    for y, bad in ((torch.tensor([0, 1, 2, 3] * 2), "label 3"), (torch.tensor([0, 1, -1, 2] * 2), "label -1")):
        with pytest.raises(ConfigError, match=rf"data.name='mine': y holds {bad}; .*\[0, 3\)"):
            check_pool(Pool("mine", Split(x, y), None, 3), "data.name='mine'")


def test_float_images_without_a_channel_axis_train_with_the_default_cnn(out):
    """[N, H, W] floats are grayscale images: a channel axis is added (a traceback before)."""
    torch.set_num_threads(1)
    path = fakes.arrays(out / "gray.npz", x=images(8, 8), y=Y)
    assert main(arrays_args(out, path, "logger.run_name=gray")) == 0
    assert (out / "outputs" / "gray" / "summary.json").is_file()


def test_float_images_channel_last_become_nchw(out):
    from fl.data.sources.arrays import load_arrays
    from tests.data.test_loaders import cfg

    x = images(8, 8, 3)
    pool = load_arrays(cfg(fakes.arrays(out / "nhwc.npz", x=x, y=Y), "arrays"))
    assert pool.train.x.shape == (N, 3, 8, 8) and torch.equal(pool.train.x, torch.from_numpy(x).permute(0, 3, 1, 2))
    assert pool.mean is None  # floats are used as given
    assert load_arrays(cfg(fakes.arrays(out / "feat.npz", x=images(5), y=Y), "arrays")).train.x.shape == (N, 5)


def test_colour_transforms_refuse_grayscale_in_one_line(out, capsys):
    path = fakes.arrays(out / "gray_u8.npz", x=images(8, 8, dtype=np.uint8), y=Y)
    assert main(arrays_args(out, path, "data.client_transform.name=feddrm_color")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data.client_transform.name='feddrm_color' needs uint8 RGB images") and "\n" not in err
    assert not (out / "outputs").exists()


def test_an_image_model_on_feature_vectors_is_one_line_naming_the_fix(out, capsys):
    path = fakes.arrays(out / "feat.npz", x=images(5), y=Y)
    assert main(arrays_args(out, path)) == 2  # the default model is the CNN
    err = capsys.readouterr().err.strip()
    assert "model.name='cnn' cannot take the inputs" in err and "model.name=mlp" in err and "\n" not in err
    assert not (out / "outputs").exists()


def test_garbage_embedded_cache_is_regenerated(out):
    """The embedded data is generated, so an unreadable cache file is rebuilt (with one warning), not a
    traceback from unpickling."""
    torch.set_num_threads(1)
    assert main(tiny(out, "trainer.rounds=1", "fabric.cpu_threads=1", "logger.run_name=first")) == 0
    (cache,) = (out / "data" / "embedded").glob("*.pt")
    first = torch.load(cache)["x"]
    cache.write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match=f"embedded data cache {cache} is unreadable.*regenerating it"):
        assert main(tiny(out, "trainer.rounds=1", "fabric.cpu_threads=1", "logger.run_name=second")) == 0
    assert torch.equal(torch.load(cache)["x"], first)
