"""The README's "Adding a method" example is code that works: registered under a test name, it runs, and its
persistent attribute is kept per client across rounds; its dataset, partition and client transform examples are one
file each."""
import re
import sys
from pathlib import Path

import pytest
import torch

from fl.config import ConfigError
from fl.core import registry, sample_clients
from tests.helpers import load_ckpt, read_metrics, run_tiny

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_add_a_method_example_registers_and_runs(out):
    section = README.read_text().split("## Adding a method", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code.replace('"mymethod"', '"readme_example"'), "README.md", "exec"), {})
    run_dir = run_tiny(out, "method.name=readme_example", "method.server_lr=0.5", name="readme")
    rows = read_metrics(run_dir)
    assert all(f"client/{c}/ce" in rows[0] for c in sample_clients(0, 0, 6, 0.5))
    visits = {c: sum(c in sample_clients(0, r, 6, 0.5) for r in range(3)) for c in range(6)}
    clients = load_ckpt(run_dir)["clients"]
    assert {c: s["visits"] for c, s in clients.items()} == {c: v for c, v in visits.items() if v}


@pytest.fixture
def registry_restored():
    """The plug-in tables and modules as they were: what a test drops in is gone afterwards."""
    tables = (registry.DATASETS, registry.PARTITIONS, registry.CLIENT_TRANSFORMS)
    saved, modules = [dict(t) for t in tables], set(sys.modules)
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_the_add_a_dataset_partition_transform_examples_are_one_file_each(out, monkeypatch, capsys,
                                                                          registry_restored):
    """Each of the README's three files, dropped into a folder of its package's path (as into fl/data/sources/, ...)
    and found by the same discovery, shows its settings in --help and runs; nothing else is edited."""
    import fl.data.client_transforms
    import fl.data.partitions
    import fl.data.sources
    from fl.config import load_config
    from fl.data import build_data
    from fl.run.train import main

    section = README.read_text().split("## Adding a dataset, a partition or a client transform", 1)[1]
    codes = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert len(codes) == 3
    for package, (file, code) in zip((fl.data.sources, fl.data.partitions, fl.data.client_transforms),
                                     zip(("blobs", "label_chunks", "invert"), codes)):
        folder = out / package.__name__.rsplit(".", 1)[1]
        folder.mkdir()
        (folder / f"readme_{file}.py").write_text(code)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        registry.discover(package.__name__)

    assert main(["data.name=blobs", "--help"]) == 0
    assert "data.spread=0.5  (float)  [> 0.0]\n      std of each blob" in capsys.readouterr().out
    assert main(["data.partition.name=label_chunks", "data.client_transform.name=invert", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "data.partition.descending=False  (bool)" in shown and "data.client_transform.every=2  (int)" in shown
    with pytest.raises(ConfigError, match="data.spread is a setting of data.name=blobs"):
        load_config(["data.spread=1"])

    run_tiny(out, "data.name=blobs", "data.spread=1.0", "model.name=mlp", name="blobs")
    chunks = ["data.partition.name=label_chunks", "data.client_transform.name=invert", "data.client_transform.every=3"]
    run_tiny(out, *chunks, name="chunks")
    common = [f"data.root={out / 'data'}", "data.num_clients=6", "data.embedded.samples_per_class=40"]
    plain = build_data(load_config(common + chunks[:1]))
    shifted = build_data(load_config(common + chunks))
    labels = [c.train.y for c in plain.clients]
    assert all(a.max() <= b.min() for a, b in zip(labels, labels[1:]))  # contiguous label chunks
    for cid, (p, s) in enumerate(zip(plain.clients, shifted.clients)):
        assert torch.equal(s.train.x, 255 - p.train.x if cid % 3 == 0 else p.train.x)
