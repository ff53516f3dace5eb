"""The partition heatmaps (fl/data/plots.py): drawn by matplotlib, with room for the title and axis labels."""
import numpy as np
import torch
from omegaconf import OmegaConf
from PIL import Image

from fl.config.blocks import chosen, schema
from fl.core import Split
from fl.data.base import Pool
from fl.data.federate import federate
from fl.data.plots import heatmap, partition_heatmaps

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
DOMAINS = ["clipart", "infograph", "painting", "quickdraw"]


def domain_pool(n_per_class: int = 12) -> Pool:
    def split(n):
        y = torch.arange(len(CLASSES)).repeat_interleave(n).repeat(len(DOMAINS))
        dom = torch.arange(len(DOMAINS)).repeat_interleave(n * len(CLASSES))
        return Split(torch.zeros(len(y), 1), y, dom)
    return Pool("fake_domains", split(n_per_class), split(n_per_class // 3), len(CLASSES), class_names=CLASSES,
                domain_names=DOMAINS)


def domains_split(num_clients: int):
    """The data config of a split by domains (FedMosaic's hybrid without the label skew)."""
    d = schema(chosen(OmegaConf.create({"data": {"partition": {"name": "domains"}}}))).data
    d.num_clients, d.partition.clients_per_domain = num_clients, 2
    d.partition.min_client_size = 5
    return d


def margins_are_blank(path) -> bool:
    """Nothing drawn in the outer 2 pixels: a clipped title, tick label or axis label would reach the edge."""
    img = np.asarray(Image.open(path).convert("L"))
    return all((edge == 255).all() for edge in (img[:2], img[-2:], img[:, :2], img[:, -2:]))


def test_partition_heatmaps_are_matplotlib_figures_with_nothing_clipped(tmp_path):
    data = federate(domain_pool(), domains_split(8), seed=0)
    paths = partition_heatmaps(data, tmp_path)
    assert [p.name for p in paths] == ["partition_classes.png", "partition_domains.png"]
    for path in paths:
        img = Image.open(path)
        assert img.info["Software"].startswith("Matplotlib")
        assert img.width >= 500 and img.height >= 300
        assert margins_are_blank(path)


def test_a_large_grid_keeps_its_labels_inside_the_image(tmp_path):
    counts = torch.randint(0, 40, (120, 100), generator=torch.Generator().manual_seed(0))
    path = heatmap(counts, tmp_path / "big.png", "cifar100: training samples per client and class " * 3,
                   col_names=[f"class_name_{i}" for i in range(100)], col_name="class")
    img = Image.open(path)
    assert img.info["Software"].startswith("Matplotlib") and img.width <= 1600 and img.height <= 1400
    assert margins_are_blank(path)
