"""Real dataset loaders on tiny fabricated copies of their on-disk layouts (tests/fakes.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fl.config import ConfigError, load_config
from fl.core.registry import DATASETS
from fl.data.base import DataError
from fl.data.sources import domains
from fl.data.sources.arrays import load_arrays
from fl.data.sources.cifar import cifar100_fine_labels, load_cifar10, load_cifar20, load_cifar100
from fl.data.sources.domains import load_domainnet, load_office_caltech10, load_pacs
from fl.data.sources.mnist import load_emnist, load_fmnist
from fl.data.sources.tinyimagenet import load_tinyimagenet
from tests import fakes


def cfg(root, name, **kw):
    """The typed data block of data.name=`name` with `kw` set: a key the dataset does not take is refused here."""
    return load_config([f"data.name={name}", f"data.root={root}", *(f"data.{k}={v}" for k, v in kw.items())]).data


def assert_one_line_error(exc_info, path):
    msg = str(exc_info.value)
    assert "\n" not in msg and str(path) in msg, msg


def image_caches(base):
    """The image caches (complete or part-built) under a dataset folder."""
    return [p for p in (base / ".fl_cache").glob("*") if p.is_dir()]


def assert_images(split, n, channels, size):
    assert split.x.shape == (n, channels, size, size) and split.x.dtype == torch.uint8
    assert split.y.shape == (n,) and split.y.dtype == torch.int64


def test_registered():
    expected = {"cifar10", "cifar100", "cifar20", "fmnist", "emnist", "tinyimagenet", "domainnet",
                "office_caltech10", "pacs", "arrays"}
    assert expected <= set(DATASETS)


# ----------------------------------------------------------------------------- CIFAR

def test_cifar10(tmp_path):
    fake = fakes.cifar10(tmp_path)
    pool = load_cifar10(cfg(tmp_path, "cifar10"))
    assert_images(pool.train, 20, 3, 32)
    assert_images(pool.test, 6, 3, 32)
    assert pool.train.y.tolist() == fake["train_labels"] and pool.test.y.tolist() == fake["test_labels"]
    assert pool.num_classes == 10 and pool.class_names == fakes.CIFAR10_NAMES
    assert pool.mean == pool.std == (0.5, 0.5, 0.5) and pool.train.domain is None
    assert load_cifar10(cfg(tmp_path, "cifar10", image_size=16)).train.x.shape == (20, 3, 16, 16)


def test_cifar100_and_cifar20(tmp_path):
    fake = fakes.cifar100(tmp_path)
    c100 = load_cifar100(cfg(tmp_path, "cifar100"))
    assert_images(c100.train, 24, 3, 32)
    assert c100.num_classes == 100 and c100.train.y.tolist() == fake["train_fine"]
    c20 = load_cifar20(cfg(tmp_path, "cifar20"))
    assert c20.num_classes == 20 and c20.class_names[0] == "coarse00"
    assert torch.equal(c20.train.x, c100.train.x)
    assert c20.train.y.tolist() == [f // 5 for f in fake["train_fine"]]
    fine_train, fine_test = cifar100_fine_labels(cfg(tmp_path, "cifar20"))
    assert fine_train.tolist() == fake["train_fine"] and fine_test.tolist() == fake["test_fine"]
    assert [f.tolist() for f in c20.fine_labels] == [fake["train_fine"], fake["test_fine"]]


def test_cifar_errors(tmp_path):
    with pytest.raises(DataError) as e:
        load_cifar10(cfg(tmp_path / "nowhere", "cifar10"))
    assert_one_line_error(e, tmp_path / "nowhere" / "cifar-10-batches-py")
    assert "data.download=true" in str(e.value) and not (tmp_path / "nowhere").exists()
    fakes.cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError) as e:
        load_cifar10(cfg(tmp_path, "cifar10"))
    assert_one_line_error(e, tmp_path / "cifar-10-batches-py" / "test_batch")
    with pytest.raises(ConfigError, match="data.variant is a setting of data.name=emnist, not of data.name='cifar10'"):
        cfg(tmp_path, "cifar10", variant="fine")  # the config refuses what the dataset does not take


# ----------------------------------------------------------------------------- Fashion-MNIST, EMNIST

def test_fmnist(tmp_path):
    fake = fakes.fmnist(tmp_path)
    pool = load_fmnist(cfg(tmp_path, "fmnist"))
    assert_images(pool.train, 20, 1, 28)
    assert_images(pool.test, 10, 1, 28)
    assert torch.equal(pool.train.x[:, 0], torch.from_numpy(fake["train_images"]))
    assert pool.num_classes == 10 and len(pool.class_names) == 10 and pool.mean == (0.5,)
    assert sorted(set(pool.train.y.tolist())) == list(range(10))


def test_emnist_splits(tmp_path):
    fake = fakes.emnist(tmp_path)  # byclass, the default
    pool = load_emnist(cfg(tmp_path, "emnist"))
    assert_images(pool.train, 70, 1, 28)
    assert pool.num_classes == 62 and pool.class_names[:2] == ["0", "1"]
    assert sorted(set(pool.train.y.tolist())) == list(range(62))
    assert torch.equal(pool.train.x[:, 0], torch.from_numpy(fake["train_images"]).transpose(1, 2))  # upright
    fakes.emnist(tmp_path, "letters")
    letters = load_emnist(cfg(tmp_path, "emnist", variant="letters"))
    assert letters.num_classes == 26 and letters.class_names[0] == "a"
    assert sorted(set(letters.train.y.tolist())) == list(range(26))


def test_mnist_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.variant='bogus' is not valid; choices: .*byclass.*letters"):
        cfg(tmp_path, "emnist", variant="bogus")
    with pytest.raises(DataError) as e:
        load_emnist(cfg(tmp_path, "emnist"))
    assert_one_line_error(e, tmp_path / "EMNIST")
    assert not (tmp_path / "EMNIST").exists()
    fakes.fmnist(tmp_path)
    bad = tmp_path / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated
    with pytest.raises(DataError) as e:
        load_fmnist(cfg(tmp_path, "fmnist"))
    assert_one_line_error(e, tmp_path / "FashionMNIST" / "raw")


# ----------------------------------------------------------------------------- TinyImageNet

def test_tinyimagenet(tmp_path, monkeypatch):
    fake = fakes.tinyimagenet(tmp_path)
    pool = load_tinyimagenet(cfg(tmp_path, "tinyimagenet"))
    assert_images(pool.train, 9, 3, 64)
    assert_images(pool.test, 5, 3, 64)
    assert pool.class_names == ["n01", "n02", "n03"]  # sorted, not wnids.txt's order
    assert pool.train.y.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert pool.test.y.tolist() == [pool.class_names.index(w) for w in fake["val_wnids"]]
    grey = pool.train.x[3]  # n02_0.JPEG, written with one channel
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    assert (tmp_path / "tiny-imagenet-200" / ".fl_cache" / "64px" / "meta.json").is_file()
    monkeypatch.setattr(domains, "decode_images", lambda *a: pytest.fail("the cache was not used"))
    again = load_tinyimagenet(cfg(tmp_path, "tinyimagenet"))
    assert torch.equal(again.train.x, pool.train.x) and torch.equal(again.test.y, pool.test.y)
    monkeypatch.undo()
    (tmp_path / "tiny-imagenet-200" / ".fl_cache" / "64px" / "meta.json").write_bytes(b"half-wr")  # rebuilt
    assert torch.equal(load_tinyimagenet(cfg(tmp_path, "tinyimagenet")).train.x, pool.train.x)


def test_tinyimagenet_errors(tmp_path):
    with pytest.raises(DataError) as e:
        load_tinyimagenet(cfg(tmp_path, "tinyimagenet"))
    assert_one_line_error(e, tmp_path / "tiny-imagenet-200")
    assert "tiny-imagenet-200.zip" in str(e.value)
    fakes.tinyimagenet(tmp_path)
    ann = tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + "val_0.JPEG\tn99\t0\t0\t1\t1\n")  # a wnid not in wnids.txt
    with pytest.raises(DataError) as e:
        load_tinyimagenet(cfg(tmp_path, "tinyimagenet", image_size=16))
    assert_one_line_error(e, ann)
    assert not image_caches(tmp_path / "tiny-imagenet-200")  # nothing written on error (a lock file aside)


# ----------------------------------------------------------------------------- DomainNet, Office-Caltech10, PACS

def fake_domainnet(root, **kw):
    return fakes.domain_folders(root, "domainnet", domains.DOMAINNET.domains, domains.DOMAINNET.classes,
                                extra_classes=("aircraft_carrier",), **kw)


def test_domainnet_seeded_split(tmp_path, monkeypatch):
    fake_domainnet(tmp_path / "a")
    pool = load_domainnet(cfg(tmp_path / "a", "domainnet", image_size=16))
    # 3 images per class: round(0.3 * 3) = 1 to test, 2 to train; the extra class is ignored
    assert_images(pool.train, 6 * 10 * 2, 3, 16)
    assert_images(pool.test, 6 * 10 * 1, 3, 16)
    assert pool.class_names == list(domains.DOMAINNET.classes) == sorted(pool.class_names)
    assert pool.domain_names == ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
    assert pool.train.domain.dtype == torch.int64
    assert torch.bincount(pool.train.domain).tolist() == [20] * 6
    assert torch.bincount(pool.test.y).tolist() == [6] * 10
    assert pool.mean == (0.0, 0.0, 0.0) and pool.std == (1.0, 1.0, 1.0)
    # deterministic: the same files elsewhere give the same split and order, whatever the run
    fake_domainnet(tmp_path / "b")
    other = load_domainnet(cfg(tmp_path / "b", "domainnet", image_size=16))
    for a, b in ((pool.train, other.train), (pool.test, other.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.domain, b.domain)
    # cache reuse, then a rebuild when a file is added
    monkeypatch.setattr(domains, "decode_images", lambda *a: pytest.fail("the cache was not used"))
    assert torch.equal(load_domainnet(cfg(tmp_path / "a", "domainnet", image_size=16)).train.x, pool.train.x)
    monkeypatch.undo()
    fakes._image(tmp_path / "a" / "domainnet" / "real" / "zebra" / "new.jpg", 30, 30, 3, seed=7)
    assert len(load_domainnet(cfg(tmp_path / "a", "domainnet", image_size=16)).train) == len(pool.train) + 1


@pytest.mark.parametrize("kind", ["txt", "pkl"])
def test_domainnet_split_files(tmp_path, kind):
    base = fake_domainnet(tmp_path, per_class=2)
    for domain in domains.DOMAINNET.domains:
        files = lambda i, domain=domain: [f"{domain}/{c}/{domain}_{c}_{i}.jpg"  # noqa: E731
                                          for c in domains.DOMAINNET.classes]
        fakes.split_files(base, domain, files(0) + [f"{domain}/aircraft_carrier/{domain}_aircraft_carrier_0.jpg"],
                          files(1), kind)
    pool = load_domainnet(cfg(tmp_path, "domainnet", image_size=8))
    assert len(pool.train) == len(pool.test) == 60
    assert pool.train.y[:10].tolist() == list(range(10))  # the split file's order
    assert torch.equal(pool.test.domain, torch.arange(6).repeat_interleave(10))


def test_office_and_pacs(tmp_path):
    fakes.domain_folders(tmp_path, "office_caltech10", domains.OFFICE_CALTECH10.domains,
                         domains.OFFICE_CALTECH10.classes, per_class=5)
    office = load_office_caltech10(cfg(tmp_path, "office_caltech10", image_size=8))
    assert office.domain_names == ["amazon", "caltech", "dslr", "webcam"] and office.num_classes == 10
    assert len(office.train) == 4 * 10 * 4 and len(office.test) == 4 * 10 * 1  # 20% test
    assert (tmp_path / "office_caltech10" / ".fl_cache" / "8px" / "images.u8").is_file()
    fakes.domain_folders(tmp_path, "pacs", domains.PACS.domains, domains.PACS.classes, png_domains=("sketch",))
    pacs = load_pacs(cfg(tmp_path, "pacs", image_size=8))
    assert pacs.class_names == ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
    assert pacs.domain_names == ["art_painting", "cartoon", "photo", "sketch"]
    assert torch.bincount(pacs.train.domain).tolist() == [14] * 4  # 3 per class: 1 test, 2 train
    assert pacs.mean == (0.485, 0.456, 0.406)


def test_domain_errors(tmp_path):
    with pytest.raises(DataError) as e:
        load_pacs(cfg(tmp_path, "pacs"))
    assert_one_line_error(e, tmp_path / "pacs")
    assert "domaingeneralization.github.io" in str(e.value)
    base = fakes.domain_folders(tmp_path, "pacs", domains.PACS.domains, domains.PACS.classes[:-1], per_class=1)
    with pytest.raises(DataError) as e:  # the class "person" is missing
        load_pacs(cfg(tmp_path, "pacs", image_size=8))
    assert_one_line_error(e, base / "art_painting" / "person")
    fakes.domain_folders(tmp_path, "pacs", domains.PACS.domains, domains.PACS.classes[-1:], per_class=1)
    bad = base / "photo" / "dog" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(DataError) as e:
        load_pacs(cfg(tmp_path, "pacs", image_size=8))
    assert_one_line_error(e, bad)
    (base / "photo_train.txt").write_text("photo/dog/photo_dog_0.jpg 0\n")  # no photo_test file
    with pytest.raises(DataError, match="photo_test"):
        load_pacs(cfg(tmp_path, "pacs", image_size=8))
    assert not image_caches(base)
    with pytest.raises(ConfigError, match="data.variant is a setting of data.name=emnist, not of data.name='pacs'"):
        cfg(tmp_path, "pacs", variant="photo")


# ----------------------------------------------------------------------------- arrays

def test_arrays_images_nhwc_npz(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8)
    path = fakes.arrays(tmp_path / "mine.npz", x=x, y=np.arange(12) % 3, domain=np.arange(12) % 2,
                        x_test=x[:4], y_test=np.array([0, 1, 2, 0]), domain_test=np.array([1, 1, 0, 0]),
                        class_names=np.array(["a", "b", "c"]))
    pool = load_arrays(cfg(path, "arrays"))
    assert_images(pool.train, 12, 3, 8)
    assert torch.equal(pool.train.x, torch.from_numpy(x).permute(0, 3, 1, 2))
    assert pool.class_names == ["a", "b", "c"] and pool.num_classes == 3
    assert pool.domain_names == ["domain0", "domain1"] and pool.test.domain.tolist() == [1, 1, 0, 0]
    assert pool.mean == (0.5, 0.5, 0.5)
    assert load_arrays(cfg(path, "arrays", image_size=16)).test.x.shape == (4, 3, 16, 16)


def test_arrays_features_pt(tmp_path):
    path = fakes.arrays(tmp_path / "feat.pt", x=torch.randn(10, 5, dtype=torch.float64), y=torch.arange(10) % 4)
    pool = load_arrays(cfg(path, "arrays"))
    assert pool.train.x.shape == (10, 5) and pool.train.x.dtype == torch.float32
    assert pool.test is None and pool.num_classes == 4 and pool.mean is None and pool.train.domain is None


def test_arrays_pt_saved_from_a_gpu_loads_on_the_cpu(tmp_path, monkeypatch):
    """A .pt written with CUDA tensors names cuda:0 as their location: without map_location a machine without a GPU
    refuses it (and one with a GPU would put the whole pool on it)."""
    import torch.serialization

    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")  # as torch.save tags CUDA tensors
        path = fakes.arrays(tmp_path / "gpu.pt", x=torch.randn(6, 4), y=torch.arange(6) % 2)
    pool = load_arrays(cfg(path, "arrays"))
    assert pool.train.x.device.type == "cpu" and pool.train.x.shape == (6, 4) and pool.num_classes == 2


def test_arrays_errors(tmp_path):
    with pytest.raises(DataError) as e:
        load_arrays(cfg(tmp_path / "missing.npz", "arrays"))
    assert_one_line_error(e, tmp_path / "missing.npz")
    with pytest.raises(DataError) as e:
        load_arrays(cfg(tmp_path, "arrays"))  # a folder, not a file
    assert_one_line_error(e, tmp_path)
    path = fakes.arrays(tmp_path / "bad.npz", x=np.zeros((4, 3), np.float32), y=np.arange(3))
    with pytest.raises(DataError, match="one per row") as e:
        load_arrays(cfg(path, "arrays"))
    assert_one_line_error(e, path)
    path = fakes.arrays(tmp_path / "half.npz", x=np.zeros((4, 3), np.float32), y=np.arange(4), x_test=np.zeros((2, 3)))
    with pytest.raises(DataError, match="x_test and y_test"):
        load_arrays(cfg(path, "arrays"))


def test_real_loaders_train_end_to_end(tmp_path, capsys):
    """A run as a user would start it, on fabricated CIFAR-10 and DomainNet files."""
    from fl.run.train import main

    fakes.cifar10(tmp_path / "c10", per_batch=40, n_test=30)
    common = ["logger.wandb.mode=disabled", "logger.progress=false", "trainer.rounds=2", "model.width=4",
              f"logger.output_dir={tmp_path / 'out'}"]
    assert main(common + ["data.name=cifar10", f"data.root={tmp_path / 'c10'}", "data.num_clients=4",
                          "data.partition.name=classes", "data.partition.classes_per_client=3",
                          "logger.run_name=c10"]) == 0
    assert (tmp_path / "out" / "c10" / "partition_classes.png").is_file()
    fakes.domain_folders(tmp_path / "dn", "domainnet", ["clipart", "infograph", "painting", "quickdraw", "real",
                                                        "sketch"],
                         ["bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill",
                          "wine_glass", "zebra"], per_class=4)
    assert main(common + ["data.name=domainnet", f"data.root={tmp_path / 'dn'}", "data.image_size=16",
                          "data.num_clients=12", "data.partition.name=domains", "data.partition.clients_per_domain=2",
                          "data.partition.within_domain=classes", "data.partition.classes_per_client=5",
                          "data.partition.min_client_size=2",
                          "data.test_split=official",
                          "logger.run_name=dn"]) == 0
    assert (tmp_path / "out" / "dn" / "partition_domains.png").is_file()
    assert main(common + ["data.name=cifar10", f"data.root={tmp_path / 'nothing'}", "data.partition.min_client_size=2",
                          "logger.run_name=x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(tmp_path / "nothing") in err and not (tmp_path / "out" / "x").exists()
