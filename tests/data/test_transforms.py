"""Per-client covariate transforms (FedDRM colour, pFedFDA CIFAR-S) and the embedded multi-domain pool:
closed forms, the specs' assignment tables, invariants and determinism."""
import collections
import math

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fl.data import embedded_domains as ED
from fl.data import transforms as T


def smooth_images(n=12, size=32, seed=0):
    """Natural-ish test images: random 8x8 colours, bicubically upsampled."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(n, 3, 8, 8, generator=g)
    return (F.interpolate(base, size=size, mode="bicubic").clamp(0, 1) * 255).to(torch.uint8)


def constant(value, n=4, size=32):
    return torch.full((n, 3, size, size), value, dtype=torch.uint8)


# ----------------------------------------------------------------------------- FedDRM (Sec. 3.1, App. F)

def test_feddrm_main_grid_maps_bits_to_gamma_hue_saturation():
    # i & 1 -> gamma, (i >> 1) & 1 -> hue, (i >> 2) & 1 -> saturation
    assert T.feddrm_params(0, 8) == (0.6, -0.1, 0.5, False)
    assert T.feddrm_params(1, 8) == (1.4, -0.1, 0.5, False)
    assert T.feddrm_params(2, 8) == (0.6, 0.1, 0.5, False)
    assert T.feddrm_params(5, 8) == (1.4, -0.1, 1.5, False)
    assert T.feddrm_params(7, 8) == (1.4, 0.1, 1.5, False)
    assert len({T.feddrm_params(i, 8) for i in range(8)}) == 8
    assert T.feddrm_params(3, 8, "low") == (1.1, 0.01, 0.9, False)
    assert T.feddrm_params(4, 8, "mid") == (0.75, -0.05, 1.3, False)


def test_feddrm_scalability_pool():
    assert T.feddrm_params(13, 16) == (1.0, 0.0, 1.0, False)  # the identity client
    assert T.feddrm_params(5, 16) == (1.4, 0.0, 0.4, False)  # 5 % 3, (5 // 3) % 3, (5 // 9) % 3
    assert T.feddrm_params(26, 32) == (1.4, 0.15, 1.6, False)
    assert T.feddrm_params(27, 32) == (0.6, -0.15, 0.4, True)  # (27 // 27) % 2 == 1: posterize
    assert T.feddrm_params(3, 8, "pool") == (0.6, 0.0, 0.4, False)
    assert len({T.feddrm_params(i, 32) for i in range(32)}) == 32


@pytest.mark.parametrize("backend", ["pil", "tensor"])
def test_feddrm_color_identity_and_types(backend):
    x = smooth_images()
    assert torch.equal(T.feddrm_color(x, 13, 16, backend=backend), x)
    out = T.feddrm_color(x, 3, 8, backend=backend)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, T.feddrm_color(x, 3, 8, backend=backend))  # deterministic
    outs = [T.feddrm_color(x, i, 8, backend=backend) for i in range(8)]
    assert all(not torch.equal(outs[i], outs[j]) for i in range(8) for j in range(i))


@pytest.mark.parametrize("backend", ["pil", "tensor"])
def test_feddrm_color_closed_forms(backend):
    v = torch.arange(256, dtype=torch.uint8)
    ramp = v.view(1, 1, 16, 16).expand(1, 3, 16, 16).contiguous()  # every grey level
    # pool client 12 is gamma 0.6 alone: floor(255.999 * (v / 255) ** 0.6) per level
    expected = torch.floor((255 + 1 - 1e-3) * (v.double() / 255) ** 0.6).to(torch.uint8)
    assert torch.equal(T.feddrm_color(ramp, 12, 16, backend=backend)[0, 0].flatten(), expected)
    # pool client 4 is saturation 0.4 alone: grey stays grey, a colour moves toward its grey
    assert torch.equal(T.feddrm_color(ramp, 4, 16, backend=backend), ramp)
    red = torch.tensor([200, 40, 40], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 4, 4).contiguous()
    out = T.feddrm_color(red, 4, 16, backend=backend)[0, :, 0, 0].int()
    assert out[0] < 200 and out[1] > 40 and out[1] == out[2]
    # pool client 10 is hue -0.15 alone: pure red (0 deg) turns to 306 deg: R = 255, G = 0, B ~ 229.5
    pure = torch.tensor([255, 0, 0], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 4, 4).contiguous()
    r, g, b = T.feddrm_color(pure, 10, 16, backend=backend)[0, :, 0, 0].tolist()
    assert (r, g) == (255, 0) and abs(b - 229.5) < 10  # PIL quantises hue to 1/255 of a turn
    # posterize 2 bits (client 27 also shifts colours, so look only at the levels)
    assert set(T.feddrm_color(smooth_images(), 27, 32, backend=backend).unique().tolist()) <= {0, 64, 128, 192}


def pixel_mix(seed=0):
    """Random colours, every grey level, and pixels with two equal channels (the ties of PIL's hue)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8, generator=g)
    x[0] = x[0, :1]
    x[1, 1] = x[1, 0]
    x[2, 2] = x[2, 1]
    x[3, :, :16, :16] = torch.arange(256, dtype=torch.uint8).view(1, 16, 16)
    return x


@pytest.mark.parametrize("clients, level", [(32, "auto"), (8, "low"), (8, "mid"), (8, "high")])
def test_feddrm_color_tensor_backend_equals_pil_bit_for_bit(clients, level):
    """The torch ops reproduce PIL's integer and float steps (a one-off run over all 2^24 colours found no
    difference for any of the saturation factors and hue shifts the levels use; the gamma and posterize tables
    are PIL's own)."""
    x = pixel_mix()
    for client in range(clients):
        assert torch.equal(T.feddrm_color(x, client, clients, level, backend="tensor"),
                           T.feddrm_color(x, client, clients, level, backend="pil")), client


def test_feddrm_color_by_owner_equals_each_owners_shift_and_reads_nothing_from_the_device():
    from tests.helpers import TorchCalls

    x = pixel_mix(1).repeat(4, 1, 1, 1)
    owner = torch.tensor([0, 3, 13, 27, 5, 5, 31, 1, 26, 4, 12, 10, 2, 7, 6, 8])
    out = T.feddrm_color_by_owner(x, owner, 32)
    for i, cid in enumerate(owner.tolist()):
        assert torch.equal(out[i:i + 1], T.feddrm_color(x[i:i + 1], cid, 32, backend="pil")), i
    T.feddrm_color_by_owner(x.to("meta"), owner.to("meta"), 32)  # the first call builds the tables on the device
    with TorchCalls() as calls:
        T.feddrm_color_by_owner(x.to("meta"), owner.to("meta"), 32)
    assert calls.host_reads == []


def test_feddrm_color_rejects_bad_input():
    with pytest.raises(ValueError):
        T.feddrm_color(smooth_images(), 8, 8)
    with pytest.raises(ValueError):
        T.feddrm_color(smooth_images().float(), 0, 8)


# ----------------------------------------------------------------------------- CIFAR-S (pFedFDA Sec. 5.1, App. C.1.1)

def test_cifar_s_code_assignment():
    assert T.CIFAR_S_DEFAULT_MODE == "code"
    pairs = [T.cifar_s_assignment(i, 100) for i in range(100)]
    assert pairs[:10] == [("motion_blur", 1), ("defocus_blur", 2), ("gaussian_noise", 3), ("shot_noise", 4),
                          ("impulse_noise", 5), ("frost", 1), ("fog", 2), ("jpeg_compression", 3),
                          ("brightness", 4), ("contrast", 5)]
    counts = collections.Counter(pairs[:50])
    assert len(counts) == 10 and set(counts.values()) == {5}  # 10 distinct pairs x 5 clients
    assert all(p is None for p in pairs[50:])  # clients >= 50 are clean


def test_cifar_s_unique_assignment():
    pairs = [T.cifar_s_assignment(i, 100, "unique") for i in range(100)]
    assert len(set(pairs[:50])) == 50
    assert pairs[0] == ("motion_blur", 1) and pairs[10] == ("motion_blur", 2) and pairs[49] == ("contrast", 5)
    assert all(p is None for p in pairs[50:])
    assert T.cifar_s_assignment(3, 10, num_corrupted=2) is None
    with pytest.raises(ValueError):
        T.cifar_s_assignment(0, 10, "random")
    with pytest.raises(ValueError):
        T.cifar_s_assignment(10, 10)


@pytest.fixture
def no_frost_dir(monkeypatch):
    monkeypatch.delenv("FL_FROST_DIR", raising=False)
    monkeypatch.setattr(T, "_warned_frost", True)  # the substitute's one-time warning is tested on its own


def mean_change(x, name, severity, frost_dir=None):
    out = T.corrupt(x, name, severity, torch.Generator().manual_seed(1), frost_dir=frost_dir)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    return (out.double() - x.double()).abs().mean().item()


@pytest.mark.parametrize("name", [c for c in T.CORRUPTIONS if c != "frost"])
def test_cifar_s_severity_is_monotone(name, no_frost_dir):
    x = smooth_images()
    changes = [mean_change(x, name, s) for s in range(1, 6)]
    # non-decreasing (motion blur's severities 3 and 4 differ only in kernel tail weights below 1e-9)
    assert all(b >= a - 1e-9 for a, b in zip(changes, changes[1:])), changes
    assert changes[-1] > changes[0] > 0


def test_frost_severity(no_frost_dir):
    # Hendrycks' frost table lowers the image weight while raising the frost weight, so the mean change
    # is not monotone in severity (s3 changes more than s4 for most images); the frost share is.
    ratios = [c1 / c0 for c0, c1 in T.FROST]
    assert all(b > a for a, b in zip(ratios, ratios[1:]))
    x = smooth_images()
    assert mean_change(x, "frost", 5) > mean_change(x, "frost", 1) > 0


def test_frost_with_texture_files(tmp_path):
    """The faithful path: c0 * x + c1 * crop of one of frost1..5, truncated to uint8."""
    for name in T.FROST_FILES:
        Image.new("RGB", (200, 200), (100, 100, 100)).save(tmp_path / name)
    x = smooth_images()
    for s in (1, 5):
        c0, c1 = T.FROST[s - 1]
        out = T.corrupt(x, "frost", s, torch.Generator().manual_seed(0), frost_dir=tmp_path)
        expected = (c0 * x.double() + c1 * 100).clamp(0, 255).floor()
        assert (out.double() - expected).abs().max() <= 1  # JPEG files may decode 100 as 99 or 101


def test_frost_substitute_warns(monkeypatch):
    monkeypatch.delenv("FL_FROST_DIR", raising=False)
    monkeypatch.setattr(T, "_warned_frost", False)
    with pytest.warns(UserWarning, match="frost"):
        T.corrupt(smooth_images(2), "frost", 3, torch.Generator().manual_seed(0))


def test_corruption_closed_forms():
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    grey = constant(128, n=8)
    # brightness: black has V = 0, so it becomes grey c; contrast keeps a constant image
    assert torch.equal(T.brightness(constant(0), 1, gen()), constant(math.floor(0.05 * 255)))
    assert torch.equal(T.contrast(grey, 5, gen()), grey)
    x = smooth_images()
    c = T.CONTRAST[1]
    mean = x.double().mean(dim=(2, 3), keepdim=True)
    assert (T.contrast(x, 2, gen()).double() - ((x.double() - mean) * c + mean).floor()).abs().max() <= 1
    # noises at mid grey: Gaussian std c * 255, shot std sqrt(v / lambda) * 255, impulse flips a fraction c
    d = T.gaussian_noise(grey, 3, gen()).double() - 128
    assert abs(d.std().item() - 0.08 * 255) < 1.0
    d = T.shot_noise(grey, 5, gen()).double() - 128
    assert abs(d.std().item() - math.sqrt(128 / 255 / 50) * 255) < 1.5
    flipped = (T.impulse_noise(grey, 4, gen()) != 128).double().mean().item()
    assert abs(flipped - 0.05) < 0.01
    # blurs keep a constant image (up to make_cifar_c's truncation), JPEG is close on smooth images
    assert (T.motion_blur(grey, 5, gen()) == 128).all()
    assert (T.defocus_blur(grey, 5, gen()).int() - 128).abs().max() <= 1
    out = T.jpeg_compression(x, 1, gen())
    assert 0 < (out.double() - x.double()).abs().mean() < 15 and out.dtype == torch.uint8
    # the defocus kernels are normalised and symmetric
    for r, a in T.DEFOCUS_BLUR:
        k = T._defocus_kernel(r, a)
        assert abs(k.sum().item() - 1) < 1e-6 and torch.allclose(k, k.flip(0)) and torch.allclose(k, k.T)


def test_cifar_s_reproducible_and_seeded(no_frost_dir):
    x = smooth_images()
    a = T.cifar_s(x, 2, 100, seed=0)  # gaussian noise
    assert torch.equal(a, T.cifar_s(x, 2, 100, seed=0))
    assert not torch.equal(a, T.cifar_s(x, 2, 100, seed=1))
    assert not torch.equal(a, T.cifar_s(x, 12, 100, seed=0))  # same pair, another client: other noise
    assert torch.equal(T.cifar_s(x, 60, 100), x)  # clean
    for client in range(10):  # every corruption runs through the public entry point
        out = T.cifar_s(x, client, 100, mode="code", seed=0)
        assert out.dtype == torch.uint8 and out.shape == x.shape and not torch.equal(out, x)


def test_client_transforms_registry(no_frost_dir):
    from fl.config import load_config
    from fl.core.registry import CLIENT_TRANSFORMS, load_plugins

    load_plugins()
    assert {"none", "feddrm_color", "cifar_s"} <= set(CLIENT_TRANSFORMS)
    x = smooth_images(4)
    colour = load_config(["data.client_transform.name=feddrm_color"]).data.client_transform
    assert torch.equal(CLIENT_TRANSFORMS["feddrm_color"].fn(x, 1, 8, 0, colour), T.feddrm_color(x, 1, 8))
    owner = torch.tensor([1, 1, 5, 5])
    assert torch.equal(CLIENT_TRANSFORMS["feddrm_color"].batch(x, owner, 8, colour),
                       T.feddrm_color_by_owner(x, owner, 8))
    corrupted = load_config(["data.client_transform.name=cifar_s"]).data.client_transform
    assert torch.equal(CLIENT_TRANSFORMS["cifar_s"].fn(x, 3, 100, 5, corrupted), T.cifar_s(x, 3, 100, seed=5))
    assert CLIENT_TRANSFORMS["cifar_s"].batch is None  # random corruptions: no per-batch form


# ----------------------------------------------------------------------------- embedded multi-domain pool

def small_pool(**kw):
    args = {"num_classes": 4, "num_domains": 3, "train_per_class_domain": 6, "test_per_class_domain": 3,
            "image_size": 16}
    return ED.make_pool(**{**args, **kw})


def test_embedded_domains_shapes_and_labels():
    pool = small_pool()
    assert pool.train.x.shape == (4 * 3 * 6, 3, 16, 16) and pool.train.x.dtype == torch.uint8
    assert pool.test.x.shape == (4 * 3 * 3, 3, 16, 16) and pool.test.x.dtype == torch.uint8
    for split, per in ((pool.train, 6), (pool.test, 3)):
        assert torch.equal(torch.bincount(split.y), torch.full((4,), 3 * per))
        assert torch.equal(torch.bincount(split.domain), torch.full((3,), 4 * per))
        assert split.y.dtype == torch.int64 and split.domain.dtype == torch.int64
    assert pool.num_classes == 4 and len(pool.class_names) == 4
    assert pool.domain_names == list(ED.STYLES[:3])
    assert len(pool.mean) == 3 and len(pool.std) == 3
    assert all(0 < m < 1 for m in pool.mean) and all(0 < s < 1 for s in pool.std)


def test_embedded_domains_deterministic_and_disjoint():
    a, b = small_pool(), small_pool()
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.x, b.test.x)
    train = {bytes(img.flatten().tolist()) for img in a.train.x}
    assert not any(bytes(img.flatten().tolist()) in train for img in a.test.x)
    # the test split is its own stream: it does not move when the train size changes
    assert torch.equal(small_pool(train_per_class_domain=9).test.x, a.test.x)


def test_embedded_domains_styles_differ():
    """Every style renders; the domains' mean images are far apart although the glyphs are shared."""
    pool = small_pool(num_domains=len(ED.STYLES), num_classes=2)
    means = torch.stack([pool.train.x[pool.train.domain == d].double().mean(0) for d in range(len(ED.STYLES))])
    dist = torch.cdist(means.flatten(1), means.flatten(1)) / math.sqrt(means[0].numel())
    assert dist[~torch.eye(len(ED.STYLES), dtype=torch.bool)].min() > 10  # grey levels, RMS per pixel
    with pytest.raises(ValueError, match="num_domains"):
        ED.make_pool(num_domains=0)


def test_embedded_domains_past_the_six_styles_are_new_draws_of_them():
    """Domain d >= 6 (iWildCam's many cameras) is style d mod 6 painted from its own stream."""
    k = len(ED.STYLES)
    pool = small_pool(num_domains=k + 1, num_classes=2)
    assert pool.domain_names[k] == f"{ED.STYLES[0]}1"
    first, extra = (pool.train.x[pool.train.domain == d] for d in (0, k))
    assert first.shape == extra.shape and not torch.equal(first, extra)


@pytest.mark.parametrize("level", ["low", "mid", "high"])
def test_feddrm_colour_levels_reach_every_client(tmp_path, level):
    """data.client_transform.level sets FedDRM's colour-shift intensity (Fig. 5): each client's train and test
    images are its own transform of the untransformed split at that level."""
    from fl.config import ConfigError, load_config
    from fl.data import build_data

    common = [f"data.root={tmp_path}", "data.num_clients=4", "data.embedded.samples_per_class=20",
              "data.partition.min_client_size=5"]
    plain = build_data(load_config(common))
    shifted = build_data(load_config(common + ["data.client_transform.name=feddrm_color",
                                               f"data.client_transform.level={level}"]))
    for cid, (p, s) in enumerate(zip(plain.clients, shifted.clients)):
        expected = T.feddrm_color(torch.cat([p.train.x, p.test.x]), cid, 4, level)
        assert torch.equal(torch.cat([s.train.x, s.test.x]), expected)
    with pytest.raises(ConfigError, match="data.client_transform.level is a setting of data.client_transform.name="
                                          "feddrm_color, not of data.client_transform.name='cifar_s'"):
        load_config(common + ["data.client_transform.name=cifar_s", "data.client_transform.level=low"])
