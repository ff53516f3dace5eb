"""The procedurally generated datasets (no download, no files): `embedded`, the quickstart's images of one domain
(fl/data/embedded.py), and `embedded_domains`, glyph images in several visual styles with a test split of their own
(fl/data/embedded_domains.py). The shape of the generated data is their `data.embedded` block."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import DictConfig

from fl.config import param
from fl.core import Split
from fl.core.registry import register_dataset
from fl.data import embedded, embedded_domains
from fl.data.base import Pool, image_size_param


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
    """The quickstart's procedurally generated images (one domain, no official test split)."""
    e = d.embedded
    x, y = embedded.load_or_generate(d.root, e.num_classes, e.samples_per_class, e.channels, d.image_size or 16,
                                     e.noise)
    pixels = x.double().div(255).transpose(0, 1).flatten(1)  # per-channel statistics for normalisation
    return Pool("embedded", Split(x, y), None, e.num_classes, [f"class{k}" for k in range(e.num_classes)],
                mean=tuple(pixels.mean(1).tolist()), std=tuple(pixels.std(1).tolist()))


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
    e = d.embedded
    return embedded_domains.make_pool(e.num_classes, e.num_domains, e.samples_per_class,
                                      max(1, e.samples_per_class // 3), d.image_size or 32)
