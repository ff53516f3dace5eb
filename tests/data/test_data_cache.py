"""The image cache (fl/data/cache.py) and memory-mapped pools (fl/core/mapped_images.py): the cache holds exactly the
decoded pool, is rebuilt when a source changes, is never read half-built and resumes a killed build; a mapped split
answers as an in-memory one does, and a run from the map equals the run from memory bit for bit."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch
from omegaconf import OmegaConf

from fl.config import ConfigError, DataConfig, load_config
from fl.core.batches import one_ahead
from fl.core.federated_data import Split, rows_to
from fl.core.mapped_images import DamagedImages, ImageMap, MappedImages
from fl.data import build_data, cache
from fl.data.sources import domains
from fl.data.sources.domains import PACS, load_pacs
from fl.run.train import main
from tests import fakes
from tests.helpers import ROOT, read_metrics, run_cli, run_tiny, tiny


def cfg(root, name="pacs", **kw):
    """The typed data block of data.name=`name` (its own settings, image_size, ... included) with `kw` set."""
    return load_config([f"data.name={name}", f"data.root={root}", *(f"data.{k}={v}" for k, v in kw.items())]).data


def fake_pacs(root, per_class=3):
    return fakes.domain_folders(root, "pacs", PACS.domains, PACS.classes, per_class=per_class)


def decoded_files(monkeypatch) -> list:
    """The files the loader decodes, in the order it decodes them (the cache's row order)."""
    files, decode = [], domains.decode_images
    monkeypatch.setattr(domains, "decode_images", lambda f, size, obtain: files.extend(f) or decode(f, size, obtain))
    return files


def one_by_one(files, size: int) -> torch.Tensor:
    return torch.stack([domains._decode(f, size, "") for f in files])


# ---- the cache --------------------------------------------------------------------------------------------------
def test_the_cache_round_trips_the_decoded_pool_bitwise(tmp_path, monkeypatch):
    fake_pacs(tmp_path)
    monkeypatch.setattr(cache, "PART_BYTES", 3 * 8 * 8 * 5)  # 5 images a part: many parts, a split ending mid-way
    files = decoded_files(monkeypatch)
    mapped = load_pacs(cfg(tmp_path, image_size=8, cache="mmap"))
    assert isinstance(mapped.train.x, MappedImages) and len(files) == len(mapped.train) + len(mapped.test)
    expected = one_by_one(files, 8)
    assert torch.equal(torch.cat([mapped.train.x.load(), mapped.test.x.load()]), expected)
    assert [PACS.classes[k] for k in torch.cat([mapped.train.y, mapped.test.y])] == [f.parent.name for f in files]
    memory = load_pacs(cfg(tmp_path, image_size=8, cache="memory"))  # read back from the same cache
    assert torch.equal(torch.cat([memory.train.x, memory.test.x]), expected) and len(files) == len(expected)
    lo, hi = mapped.train.x.extrema()  # recorded when built
    assert (lo, hi) == (int(memory.train.x.min()), int(memory.train.x.max()))


def test_a_changed_source_or_image_size_rebuilds_the_cache(tmp_path, monkeypatch):
    base = fake_pacs(tmp_path)
    files = decoded_files(monkeypatch)
    before = load_pacs(cfg(tmp_path, image_size=8, cache="mmap"))
    first = files[0]
    monkeypatch.setattr(domains, "decode_images", lambda *a: pytest.fail("the cache was not used"))
    assert torch.equal(load_pacs(cfg(tmp_path, image_size=8, cache="mmap")).train.x.load(), before.train.x.load())
    monkeypatch.undo()
    fakes._image(first, 26, 30, 3, seed=999)  # the same name, other pixels
    os.utime(first, ns=(time.time_ns(), first.stat().st_mtime_ns + 10**9))
    after = load_pacs(cfg(tmp_path, image_size=8, cache="mmap"))
    assert torch.equal(after.train.x[0], domains._decode(first, 8, "")) and not torch.equal(after.train.x[0],
                                                                                               before.train.x[0])
    assert torch.equal(after.train.x.load()[1:], before.train.x.load()[1:])
    bigger = load_pacs(cfg(tmp_path, image_size=12, cache="mmap"))
    assert bigger.train.x.shape[1:] == (3, 12, 12)
    assert sorted(p.name for p in (base / ".fl_cache").iterdir() if p.is_dir()) == ["12px", "8px"]


def test_a_half_built_cache_is_never_read_and_an_interrupted_build_resumes(tmp_path):
    d = cfg(tmp_path, cache="mmap")
    images = torch.randint(0, 256, (10, 2, 3, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    parts, calls = [3, 3, 2, 2], []
    starts = [0, 3, 6, 8, 10]

    def fill(i, stop_at=None):
        if i == stop_at:
            raise KeyboardInterrupt  # Ctrl-C (a kill: tests below) keeps what is on disk
        calls.append(i)
        return images[starts[i]:starts[i + 1]]

    common = {"dataset": "toy", "folder": tmp_path, "tag": "t", "key": "k1", "counts": {"train": 6, "test": 4},
              "shape": (2, 3, 3), "parts": parts}
    with pytest.raises(KeyboardInterrupt):
        cache.cached_images(d, **common, fill=lambda i: fill(i, stop_at=2))
    root = tmp_path / ".fl_cache"
    assert not (root / "t").exists() and json.loads((root / "t.partial" / "progress.json").read_text())[
        "parts_done"] == 2
    calls.clear()
    x = cache.cached_images(d, **common, fill=fill)
    assert calls == [2, 3] and not (root / "t.partial").exists()
    assert torch.equal(x["train"].load(), images[:6]) and torch.equal(x["test"].load(), images[6:])
    assert x["test"].extrema() == (int(images[6:].min()), int(images[6:].max()))
    (root / "t" / "images.u8").write_bytes(b"truncated")  # a damaged cache is rebuilt, not trusted
    calls.clear()
    rebuilt = cache.cached_images(d, **common, fill=fill)
    assert torch.equal(rebuilt["train"].load(), images[:6]) and calls == [0, 1, 2, 3]
    calls.clear()  # another key (a changed source) replaces it
    cache.cached_images(d, **{**common, "key": "k2"}, fill=fill)
    assert calls == [0, 1, 2, 3] and json.loads((root / "t" / "meta.json").read_text())["key"] == "k2"


def overwrite(path, offset: int, size: int = 4096) -> None:
    """Damage that keeps the file's size: `size` bytes at `offset` replaced by others."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(size)
        f.seek(offset)
        f.write(bytes((b + 1) % 256 for b in old))


def test_bytes_overwritten_in_place_are_found_by_the_rows_checksums(tmp_path, capsys):
    """4 KiB overwritten in images.u8 (its size kept) was trained on without a word. Read into memory: every row is
    checked, and the cache rebuilt; memory-mapped: each row on its first read, which names the image and sets the
    cache aside, so the next load rebuilds it."""
    images = torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    calls = []

    def fill(i):
        calls.append(i)
        return images[10 * i:10 * i + 10]

    common = {"dataset": "toy", "folder": tmp_path, "tag": "t", "key": "k", "counts": {"train": 30, "test": 10},
              "shape": (3, 16, 16), "parts": [10, 10, 10, 10]}
    cache.cached_images(cfg(tmp_path, cache="memory"), **common, fill=fill)
    target = tmp_path / ".fl_cache" / "t"
    row = 3 * 16 * 16
    overwrite(target / "images.u8", 25 * row + 100)  # images 25 and 26 (4 KiB > 768 B x 5: up to 30)
    assert (target / "images.u8").stat().st_size == 40 * row
    calls.clear()
    x = cache.cached_images(cfg(tmp_path, cache="memory"), **common, fill=fill)
    assert "is damaged (image 25 does not match its checksum); rebuilding it" in capsys.readouterr().err
    assert calls == [0, 1, 2, 3]
    assert torch.equal(torch.cat([x["train"], x["test"]]), images)

    overwrite(target / "images.u8", 12 * row + 7)  # images 12 to 17
    calls.clear()
    mapped = cache.cached_images(cfg(tmp_path, cache="mmap"), **common, fill=fill)
    assert calls == [] and torch.equal(mapped["train"][torch.arange(0, 12)], images[:12])  # intact rows read
    with pytest.raises(DamagedImages, match=r"image 12 of .*images.u8 does not match the checksum written with it: "
                                            r"the file was changed after it was built; the cache .* is set aside"):
        mapped["train"][torch.tensor([3, 12, 13])]
    assert not (target / "meta.json").exists()
    again = cache.cached_images(cfg(tmp_path, cache="mmap"), **common, fill=fill)
    assert calls == [0, 1, 2, 3] and torch.equal(again["train"].load(), images[:30])


def test_a_run_on_a_map_damaged_in_place_stops_naming_the_image_and_the_next_run_rebuilds_it(out, capsys):
    base = fake_pacs(out / "data", per_class=4)
    args = ["data.name=pacs", "data.image_size=8", "data.cache=mmap", "data.partition.name=iid", "data.num_clients=4",
            "trainer.rounds=2", "trainer.checkpoint_every=0", "trainer.participation=1"]  # every image read in round 0
    run_tiny(out, *args, name="first")
    images = base / ".fl_cache" / "8px" / "images.u8"
    overwrite(images, images.stat().st_size // 2)
    assert main(tiny(out, *args, "fabric.cpu_threads=1", "logger.run_name=damaged")) == 1
    err = capsys.readouterr().err
    assert "does not match the checksum written with it" in err and str(images) in err and "set aside" in err
    again = run_tiny(out, *args, name="again")
    assert read_metrics(again) == read_metrics(out / "outputs" / "first")


def test_a_cache_that_cannot_be_written_is_an_error_for_mmap_and_decoded_in_memory_otherwise(tmp_path, monkeypatch,
                                                                                              capsys):
    fake_pacs(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "build", refuse)
    with pytest.raises(ConfigError, match="data.cache=mmap: cannot write the pacs image cache .*data.cache_dir"):
        load_pacs(cfg(tmp_path, image_size=8, cache="mmap"))
    files = decoded_files(monkeypatch)
    memory = load_pacs(cfg(tmp_path, image_size=8, cache="memory"))
    assert torch.equal(torch.cat([memory.train.x, memory.test.x]), one_by_one(files, 8))
    assert "decoding into memory" in capsys.readouterr().err


def test_the_cache_goes_to_data_cache_dir_when_set(tmp_path):
    base = fake_pacs(tmp_path / "data")
    load_pacs(cfg(tmp_path / "data", image_size=8, cache="mmap", cache_dir=str(tmp_path / "caches")))
    assert (tmp_path / "caches" / "pacs" / "8px" / "images.u8").is_file() and not (base / ".fl_cache").exists()


def test_auto_maps_a_pool_larger_than_its_share_of_the_available_memory(monkeypatch):
    d = OmegaConf.structured(DataConfig(cache_auto_fraction=0.25))
    monkeypatch.setattr(cache, "available_memory", lambda: 1000)
    assert cache.cache_mode(d, 250, "x")[0] == "memory" and cache.cache_mode(d, 251, "x")[0] == "mmap"
    d.cache = "memory"
    with pytest.raises(ConfigError, match="data.cache=memory: the x pool is .* use data.cache=mmap"):
        cache.cache_mode(d, 1001, "x")


def test_mmap_is_refused_for_a_dataset_read_into_memory(tmp_path):
    fakes.cifar10(tmp_path)
    run = OmegaConf.merge(OmegaConf.structured({"seed": 0}), {"data": cfg(tmp_path, name="cifar10", cache="mmap",
                                                                          num_clients=2)})
    with pytest.raises(ConfigError, match="data.cache=mmap: data.name='cifar10' is read into memory"):
        build_data(run)


# ---- mapped splits ----------------------------------------------------------------------------------------------
def mapped_and_tensor(tmp_path, n=12):
    x = torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "x.u8"
    path.write_bytes(x.numpy().tobytes())
    y = torch.arange(n) % 3
    return Split(MappedImages(ImageMap(path, x.shape), torch.arange(n)), y), Split(x, y)


def test_a_mapped_split_subsets_joins_and_gathers_as_a_tensor_split_does(tmp_path, monkeypatch):
    monkeypatch.setattr("fl.core.mapped_images.RELEASE_BYTES", 100)  # pages dropped from the map after most reads
    mapped, memory = mapped_and_tensor(tmp_path)
    idx = torch.tensor([7, 2, 2, 11, 0])
    a, b = mapped.subset(idx), memory.subset(idx)
    assert a.mapped and torch.equal(a.x.load(), b.x) and torch.equal(a.y, b.y)
    assert torch.equal(a.x[torch.tensor([4, 1])], b.x[torch.tensor([4, 1])]) and torch.equal(a.x[-1], b.x[-1])
    assert torch.equal(rows_to(a.x, slice(1, 4), "cpu"), b.x[1:4]) and a.x.shape == b.x.shape
    joined = Split.cat([a, mapped.subset(torch.tensor([5]))])
    assert joined.mapped and torch.equal(joined.x.load(), torch.cat([b.x, memory.x[5:6]]))
    assert torch.equal(Split.cat([a, b]).x, torch.cat([b.x, b.x]))  # mixed: read into memory
    moved = a.to("cpu", torch.float64)
    assert moved.mapped and moved.x.rows is a.x.rows  # stays on the map; nothing is copied
    assert not torch.is_tensor(a.x) and a.x.extrema() == (int(b.x.min()), int(b.x.max()))  # read in pieces


def test_a_mapped_batch_for_a_gpu_is_read_into_pinned_memory(tmp_path, monkeypatch):
    """No GPU here: the allocation's pinning is recorded and the copy to the device is left out."""
    mapped, memory = mapped_and_tensor(tmp_path)
    pinned, empty = [], torch.empty

    def recording_empty(*args, pin_memory=False, **kwargs):
        pinned.append(pin_memory)
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self)
    idx = torch.tensor([3, 0, 3])
    assert torch.equal(rows_to(mapped.x, idx, torch.device("cuda")), memory.x[idx]) and pinned == [True]
    assert torch.equal(rows_to(mapped.x, idx, torch.device("cpu")), memory.x[idx]) and pinned == [True, False]
    with pytest.raises(IndexError):
        mapped.x.gather(torch.tensor([12]))  # past the map's end: refused, never clipped


def test_one_ahead_fetches_the_next_batch_while_the_caller_uses_this_one():
    started: list[int] = []

    def fetch(idx):
        started.append(idx)
        return idx * 10

    items = [(0, 1), (0, 2), (0, None), (1, 3)]
    out = []
    for epoch, idx, fetched in one_ahead(iter(items), fetch):
        out.append((epoch, idx, fetched))
        following = next((i for _, i in items[len(out):] if i is not None), None)  # the next batch, past an end
        deadline = time.monotonic() + 10
        while following is not None and following not in started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert following is None or following in started  # already under way before this batch is used
    assert out == [(0, 1, 10), (0, 2, 20), (0, None, None), (1, 3, 30)]
    assert list(one_ahead(iter(items), None)) == [(e, i, None) for e, i in items]

    def failing(idx):
        raise RuntimeError(f"bad batch {idx}")

    with pytest.raises(RuntimeError, match="bad batch 1"):
        list(one_ahead(iter(items), failing))


# ---- runs -------------------------------------------------------------------------------------------------------
TWINS = {
    "quickstart": [],
    "fedpals_pacs_synthetic": ["data.embedded.samples_per_class=12", "trainer.local_steps=2", "data.num_clients=3"],
    "fedmosaic_domainnet_synthetic": ["data.embedded.samples_per_class=12", "data.public_size=40",
                                      "trainer.local_steps=2", "data.partition.clients_per_domain=1"],
    "feddrm_cifar10_dir03_synthetic": ["data.embedded.samples_per_class=40", "trainer.local_steps=2",
                                       "data.client_transform.after_augment=true", "data.augment=[crop]",
                                       "data.eval_augment=true"],
}


@pytest.mark.parametrize("conf", sorted(TWINS))
def test_a_run_from_the_map_equals_the_run_from_memory(out, conf):
    common = ([] if conf == "quickstart" else [f"conf={conf}"]) + TWINS[conf] + [
        "trainer.rounds=2", "trainer.eval_every=1", "trainer.checkpoint_every=0", "model.width=4"]
    memory = run_tiny(out, *common, "data.cache=memory", name="memory")
    mapped = run_tiny(out, *common, "data.cache=mmap", name="mmap")
    assert read_metrics(memory) == read_metrics(mapped) and len(read_metrics(memory)) == 2
    assert next((out / "data").rglob("images.u8")).is_file()  # the second run read its images from the map


@pytest.mark.slow
def test_a_build_killed_part_way_resumes_where_it_stopped(out, monkeypatch, capsys):
    base = fake_pacs(out / "data", per_class=4)
    args = tiny(out, "data.name=pacs", "data.image_size=8", "data.cache=mmap", "data.partition.name=iid",
                "data.num_clients=4", "logger.run_name=killed")
    env = {"FL_TEST_CACHE_PART_BYTES": str(3 * 8 * 8 * 10), "FL_TEST_KILL_DECODE": "3"}  # killed in part 3 of 12
    killed = run_cli(args, cwd=out, env=env, script=(str(ROOT / "tests" / "killer.py"),))
    assert killed.returncode == -9, killed.stderr[-2000:]
    progress = json.loads((base / ".fl_cache" / "8px.partial" / "progress.json").read_text())
    assert progress["parts_done"] == 2 and not (base / ".fl_cache" / "8px").exists()
    monkeypatch.setattr(cache, "PART_BYTES", int(env["FL_TEST_CACHE_PART_BYTES"]))  # the resume, in this process
    capsys.readouterr()
    assert main(args[:-1] + ["logger.run_name=resumed"]) == 0
    assert "resuming at image 20" in capsys.readouterr().err
    files = sorted(p for p in base.rglob("*") if p.suffix in (".jpg", ".png"))
    meta = json.loads((base / ".fl_cache" / "8px" / "meta.json").read_text())
    assert meta["shape"] == [len(files), 3, 8, 8]
    pool = load_pacs(cfg(out / "data", image_size=8, cache="memory"))
    fake_pacs(out / "fresh", per_class=4)  # the same images, built in one go
    fresh = load_pacs(cfg(out / "fresh", image_size=8, cache="memory"))
    assert torch.equal(torch.cat([pool.train.x, pool.test.x]), torch.cat([fresh.train.x, fresh.test.x]))


def test_a_map_far_larger_than_memory_opens_and_gathers_without_holding_the_pool(tmp_path):
    # a sparse 256 GiB file: mapping it costs nothing, anything sized by the pool (a placeholder array) cannot be made
    rows, shape = 1 << 20, (3, 256, 341)  # 256 GiB
    path = tmp_path / "images.u8"
    with open(path, "wb") as f:
        f.truncate(rows * 3 * 256 * 341)
    images = ImageMap(path, (rows, *shape))
    got = images.gather(torch.tensor([0, rows - 1, 7]), pin=False)
    assert got.shape == (3, *shape) and not got.any()
