"""The docs' examples work: the README's "Adding a method" registered under a test name runs, keeps its persistent
attribute per client across rounds, and K clients at once give its sequential run; docs/larger-than-memory.md's
worked example maps the pool and runs as the pool in memory does; docs/adding-data.md's dataset, partition and client
transform and docs/aggregators.md's aggregator are one file each."""
import re
import shlex
import sys

import pytest
import torch

from fl.config import ConfigError
from fl.core import registry, sample_clients
from fl.run.train import main as train_main
from tests.helpers import assert_same_rows, doc_section, global_params, load_ckpt, read_metrics, run_tiny


def register_example(name: str) -> None:
    """The README's "Adding a method" example, registered as method `name`."""
    section = doc_section("README.md", "## Adding a method")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code.replace('"mymethod"', f'"{name}"'), "README.md", "exec"), {})


def test_the_add_a_method_example_registers_and_runs(out):
    register_example("readme_example")
    run_dir = run_tiny(out, "method.name=readme_example", "method.server_lr=0.5", name="readme")
    rows = read_metrics(run_dir)
    assert all(f"client/{c}/ce" in rows[0] for c in sample_clients(0, 0, 6, 0.5))
    visits = {c: sum(c in sample_clients(0, r, 6, 0.5) for r in range(3)) for c in range(6)}
    clients = load_ckpt(run_dir)["clients"]
    assert {c: s["visits"] for c, s in clients.items()} == {c: v for c, v in visits.items() if v}


def test_the_example_trains_k_clients_at_once_as_one_at_a_time(out, monkeypatch):
    # it opts in (functional = True): its one client_loss serves the vmapped step, which must then give the same run
    import fl.core.parallel as parallel

    groups, train = [], parallel.ParallelClients.train

    def counted(self, rnd, cids, load):
        groups.append(len(cids))
        return train(self, rnd, cids, load)

    monkeypatch.setattr(parallel.ParallelClients, "train", counted)
    register_example("readme_example_k")
    extra = ("method.name=readme_example_k", "method.server_lr=0.5", "optim.momentum=0.9")
    sequential = run_tiny(out, *extra, name="sequential")
    assert groups == []
    vmapped = run_tiny(out, *extra, "trainer.parallel_clients=4", name="k4")
    assert groups == [3, 3, 3]  # every round's 3 clients at once
    assert_same_rows(read_metrics(sequential), read_metrics(vmapped), abs=1e-5)
    ga, gb = global_params(sequential), global_params(vmapped)
    for name, value in ga.items():
        torch.testing.assert_close(gb[name], value, rtol=0, atol=1e-5)


def test_the_larger_than_memory_example_maps_the_pool_and_runs_as_the_pool_in_memory(out, monkeypatch, capsys):
    """The page's two commands, run in this process from `out` (their paths are relative)."""
    section = doc_section("docs/larger-than-memory.md", "# Datasets larger than memory")
    commands = [shlex.split(line) for line in re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines()]
    assert [c[:3] for c in commands] == [["python", "-m", "fl.train"]] * 2
    monkeypatch.chdir(out)
    errs = []
    for c in commands:
        assert train_main(c[3:] + ["logger.wandb.mode=disabled", "logger.progress=false"]) == 0
        errs.append(capsys.readouterr().err)
    printed = " ".join(re.search(r"prints `(data: .*?)`", section, re.S).group(1).split())
    assert re.search(re.escape(printed).replace("<hash>", r"\w+"), errs[0]), errs[0][-2000:]
    assert "memory-mapped" not in errs[1] and (out / "data" / "embedded" / ".fl_cache").is_dir()
    mapped, in_memory = (read_metrics(out / "outputs" / c[-1].split("=")[1]) for c in commands)
    assert mapped == in_memory and len(mapped) == 2


@pytest.fixture
def registry_restored():
    """The plug-in tables and modules as they were: what a test drops in is gone afterwards."""
    tables = (registry.DATASETS, registry.PARTITIONS, registry.CLIENT_TRANSFORMS, registry.AGGREGATORS)
    saved, modules = [dict(t) for t in tables], set(sys.modules)
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_the_add_a_dataset_partition_transform_examples_are_one_file_each(out, monkeypatch, capsys,
                                                                          registry_restored):
    """Each of the three files of docs/adding-data.md, dropped into a folder of its package's path (as into
    fl/data/sources/, ...) and found by the same discovery, shows its settings in --help and runs; nothing else is
    edited."""
    import fl.data.client_transforms
    import fl.data.partitions
    import fl.data.sources
    from fl.config import load_config
    from fl.data import build_data
    from fl.run.train import main

    section = doc_section("docs/adding-data.md", "# Adding a dataset, a partition or a client transform")
    codes = re.findall(r"```python\n(.*?)```", section, re.S)
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


def test_the_add_an_aggregator_example_is_one_file(out, monkeypatch, capsys, registry_restored):
    """docs/aggregators.md's rule, dropped into a folder of fl.aggregators' path and found by discovery: listed, its
    setting in --help, a hand-computed case, and a FedProx run."""
    import fl.aggregators
    from fl.core.aggregation import ClientUpload, Uploads
    from fl.run.train import main

    section = doc_section("docs/aggregators.md", "## Adding an aggregator")
    code, = re.findall(r"```python\n(.*?)```", section, re.S)
    (out / "aggregators").mkdir()
    (out / "aggregators" / "readme_mean_around_median.py").write_text(code)
    monkeypatch.setattr(fl.aggregators, "__path__", [*fl.aggregators.__path__, str(out / "aggregators")])
    registry.discover("fl.aggregators")
    assert main(["--list", "aggregators"]) == 0 and "mean_around_median" in capsys.readouterr().out.split()
    assert main(["server.aggregator.name=mean_around_median", "--help"]) == 0
    assert "server.aggregator.keep=0.5  (float)  [> 0.0, <= 1.0]" in capsys.readouterr().out
    # 0, 1, 10: the median is 1, the two nearest it are 1 and 0, their weighted mean (weights 1 and 3) is 0.25
    uploads = Uploads.kept([ClientUpload(cid, {"w": torch.tensor([x])}, w) for cid, (x, w) in
                            enumerate([(0.0, 3.0), (1.0, 1.0), (10.0, 5.0)])])
    plugin = registry.AGGREGATORS["mean_around_median"]
    assert torch.equal(plugin.fn(uploads, {}, plugin.settings(keep=0.6))["w"], torch.tensor([0.25]))
    run_tiny(out, "method.name=fedprox", "server.aggregator.name=mean_around_median", "server.aggregator.keep=0.6",
             "trainer.rounds=1", name="around")
