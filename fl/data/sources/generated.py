"""The procedurally generated datasets (no download, no files): `embedded`, the quickstart's images of one domain
(fl/data/embedded.py), and `embedded_domains`, glyph images in several visual styles with a test split of their own
(fl/data/embedded_domains.py). The shape of the generated data is their `data.embedded` block."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from fl.config import param
from fl.core import Split
from fl.core.federated_data import images
from fl.core.registry import register_dataset
from fl.data import embedded, embedded_domains
from fl.data.base import Pool, image_size_param, pixel_stats
from fl.data.cache import cache_mode, cached_images


@dataclass
class EmbeddedShape:
    """data.embedded with data.name=embedded."""
    num_classes: int = param(10, ge=2)
    samples_per_class: int = param(300, ge=4, help="images per class")
    channels: int = param(3, ge=1)
    noise: float = param(0.6, ge=0.0, help="pixel noise std (harder when larger)")


@dataclass
class EmbeddedSettings:
    """data.* keys of the embedded dataset (data.root: where it is cached)."""
    image_size: Optional[int] = image_size_param(16)
    embedded: EmbeddedShape = field(default_factory=EmbeddedShape)


@register_dataset("embedded", EmbeddedSettings)
def embedded_images(d: DictConfig) -> Pool:
    """The quickstart's procedurally generated images (one domain, no official test split); memory-mapped from an
    image cache when data.cache says so."""
    e, size = d.embedded, d.image_size or 16
    n = e.num_classes * e.samples_per_class
    mode = cache_mode(d, n * e.channels * size * size, "embedded")
    if mode[0] == "memory":
        x, y = embedded.load_or_generate(d.root, e.num_classes, e.samples_per_class, e.channels, size, e.noise)
    else:
        key = embedded.cache_key(e.num_classes, e.samples_per_class, e.channels, size, e.noise)
        x = cached_images(d, dataset="embedded", folder=Path(d.root) / "embedded", tag=_tag(key), key=key,
                          counts={"train": n}, shape=(e.channels, size, size), parts=[n], mode=mode,
                          fill=lambda i: embedded.generate(e.num_classes, e.samples_per_class, e.channels, size,
                                                           e.noise)[0])["train"]
        y = embedded.labels(e.num_classes, e.samples_per_class)
    mean, std = pixel_stats(images(x))  # per-channel statistics for normalisation
    return Pool("embedded", Split(x, y), None, e.num_classes, [f"class{k}" for k in range(e.num_classes)],
                mean=mean, std=std)


@dataclass
class DomainsShape:
    """data.embedded with data.name=embedded_domains."""
    num_classes: int = param(10, ge=2)
    num_domains: int = param(4, ge=1, help="number of domains (6 visual styles; more domains repeat a style with "
                             "their own random stream, like more cameras)")
    samples_per_class: int = param(300, ge=4, help="training images per class and domain (a third as many test "
                                   "images)")


@dataclass
class EmbeddedDomainsSettings:
    """data.* keys of the embedded multi-domain dataset (generated anew each run: data.root is not read)."""
    image_size: Optional[int] = image_size_param(32)
    embedded: DomainsShape = field(default_factory=DomainsShape)


@register_dataset("embedded_domains", EmbeddedDomainsSettings)
def embedded_multi_domain(d: DictConfig) -> Pool:
    """Generated glyph images in `num_domains` visual styles, with a test split of its own."""
    e, size = d.embedded, d.image_size or 32
    per_test = max(1, e.samples_per_class // 3)
    nbytes = e.num_domains * e.num_classes * (e.samples_per_class + per_test) * 3 * size * size
    mode, store = cache_mode(d, nbytes, "embedded_domains"), None
    if mode[0] == "mmap":
        key = "-".join(map(str, (embedded_domains.CACHE_VERSION, e.num_classes, e.num_domains, e.samples_per_class,
                                 per_test, size)))
        store = functools.partial(cached_images, d, dataset="embedded_domains", mode=mode, key=key, tag=_tag(key),
                                  folder=Path(d.root) / "embedded_domains")
    return embedded_domains.make_pool(e.num_classes, e.num_domains, e.samples_per_class, per_test, size, store)


def _tag(key: str) -> str:
    """A generated pool's cache is named by its settings' hash (the key is those settings)."""
    return hashlib.sha1(key.encode()).hexdigest()[:12]
