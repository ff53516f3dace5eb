"""A loader's decoded images, written once to disk and then read into memory or memory-mapped (`data.cache`).

Layout: <root>/<tag>/ holds images.u8 (every image of every split, uint8 C-order rows, the splits one after the
other), rows.crc32 (each row's CRC-32, uint32 little-endian) and meta.json (the key, the shape, each split's rows and
pixel range). <root> is the dataset's folder's
.fl_cache/, or <data.cache_dir>/<dataset>/; the tag names the decode settings (e.g. 224px), so another image size is
another cache, and the key fingerprints the source files and labels, so a changed source rebuilds the cache in place.

The build writes <tag>.partial/ part by part (a part: a few dozen MiB of rows, or one generated block), saving after
each part how many are on disk; a build that is killed resumes at the next part, and a finished one is renamed into
place, so a half-built cache is never read. One process builds at a time (a lock file beside it), the others wait and
then read what it built.

A cache is trusted only whole: a missing or short file, another format or key is rebuilt; bytes changed in place
(the size kept) are found by the rows' checksums, all of them when the cache is read into memory (it is then rebuilt)
and each row on its first read when it is memory-mapped (the run stops there, naming the image, and the cache is set
aside, so the next start rebuilds it). bench/README.md gives what the checks cost.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor
from tqdm import tqdm

from fl.config import ConfigError
from fl.core.mapped_images import ImageMap, MappedImages, row_checksums

FORMAT = 2  # of images.u8 + rows.crc32 + meta.json (1: without the checksums); another format is rebuilt
PART_BYTES = 64 << 20
IMAGES, CHECKSUMS, META, PROGRESS = "images.u8", "rows.crc32", "meta.json", "progress.json"
# the datasets whose loaders go through the cache (the others read small array files into memory)
MAPPED = ("tinyimagenet", "domainnet", "office_caltech10", "pacs", "iwildcam", "embedded", "embedded_domains")


def available_memory() -> int:
    """Bytes the operating system can give this process now (MemAvailable)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def cache_mode(d: DictConfig, nbytes: int, dataset: str) -> tuple[str, str]:
    """("memory" | "mmap", why) for a pool of `nbytes` of images under `data.cache`."""
    free = available_memory()
    if d.cache == "mmap":
        return "mmap", "data.cache=mmap"
    if d.cache == "memory":
        if nbytes > free:
            raise ConfigError(f"data.cache=memory: the {dataset} pool is {gib(nbytes)} of images, more than the "
                              f"{gib(free)} of memory available; use data.cache=mmap (or auto)")
        return "memory", "data.cache=memory"
    share = d.cache_auto_fraction
    if nbytes > share * free:
        return "mmap", f"data.cache=auto: more than {share:g} of the {gib(free)} available"
    return "memory", f"data.cache=auto: at most {share:g} of the {gib(free)} available"


def parts_of(counts: dict[str, int], row_bytes: int) -> list[int]:
    """Rows per part, about PART_BYTES each, no part across two splits."""
    rows = max(1, PART_BYTES // max(1, row_bytes))
    return [min(rows, n - start) for n in counts.values() for start in range(0, n, rows)]


def cached_images(d: DictConfig, *, dataset: str, folder: Path, tag: str, key: str, counts: dict[str, int],
                  shape: Sequence[int], parts: Sequence[int], fill: Callable[[int], Tensor | np.ndarray],
                  mode: tuple[str, str] | None = None) -> dict[str, Tensor | MappedImages]:
    """Each split's images (`counts` rows of `shape`, the splits in this order): from the cache when it holds `key`,
    else built by writing `fill(i)` (uint8 [parts[i], *shape]) part by part. In memory (tensors) or memory-mapped
    (views of one map) as `mode` (what `cache_mode` returned) says, or else as `data.cache` decides for the pool's
    size."""
    shape = tuple(int(s) for s in shape)
    total, row_bytes = sum(counts.values()), math.prod(shape)
    if sum(parts) != total:
        raise ValueError(f"parts cover {sum(parts)} rows, the splits {total}")
    mode, why = mode or cache_mode(d, total * row_bytes, dataset)
    root = Path(d.cache_dir) / dataset if d.cache_dir else Path(folder) / ".fl_cache"
    target = root / tag
    meta = _read_meta(target, key, total, row_bytes)
    opened = None if meta is None else _open(target, meta, (total,) + shape, mode)
    if isinstance(opened, int):  # read into memory, and a row's bytes do not match its checksum
        print(f"data: the {dataset} image cache {target} is damaged (image {opened} does not match its checksum); "
              "rebuilding it", file=sys.stderr)
        set_aside(target)
        meta = None
    if meta is None:
        try:
            meta = build(root, tag, key, counts, shape, parts, fill, dataset)
        except OSError as err:  # an unwritable folder, a full disk
            if mode == "mmap":
                raise ConfigError(f"data.cache=mmap: cannot write the {dataset} image cache in {root} "
                                  f"({err.strerror or err}); set data.cache_dir to a writable folder with room"
                                  ) from None
            print(f"data: cannot write the {dataset} image cache in {root} ({err.strerror or err}); decoding into "
                  "memory", file=sys.stderr)
            x = torch.cat([torch.as_tensor(fill(i)) for i in range(len(parts))]) if parts else \
                torch.empty((0,) + shape, dtype=torch.uint8)
            return dict(zip(counts, x.split(list(counts.values()))))
        opened = _open(target, meta, (total,) + shape, mode)
        if isinstance(opened, int):  # damaged again as soon as written: a disk that does not keep what it is given
            raise ConfigError(f"data: the {dataset} image cache {target} was just written and image {opened} does "
                              "not read back as written; check the disk, or set data.cache_dir to another one")
    if mode == "mmap":
        print(f"data: {dataset}: {gib(total * row_bytes)} of images memory-mapped from {target / IMAGES} ({why})",
              file=sys.stderr)
    return opened


def _read_meta(target: Path, key: str, rows: int, row_bytes: int) -> dict | None:
    """The complete cache's meta.json when it holds `key` and all its bytes and checksums; else None (it is then
    rebuilt)."""
    try:
        meta = json.loads((target / META).read_text())
        if (meta.get("format") == FORMAT and meta.get("key") == key
                and (target / IMAGES).stat().st_size == rows * row_bytes
                and (target / CHECKSUMS).stat().st_size == rows * 4):
            return meta
    except (OSError, ValueError):
        pass
    return None


def set_aside(target: Path, row: int | None = None) -> str:
    """Mark the cache in `target` damaged: without its meta.json the next load rebuilds it (a process that maps it
    now keeps reading the old file). Returns what a damage message adds (ImageMap's on_damage)."""
    with contextlib.suppress(OSError):
        (target / META).unlink()
    return f"the cache {target} is set aside and rebuilt when the data is next loaded"


def _open(target: Path, meta: dict, shape: tuple[int, ...], mode: str) -> dict[str, Tensor | MappedImages] | int:
    """Each split's images, in memory (every row checked against its checksum: the first damaged row's index is
    returned instead) or memory-mapped (each row checked on its first read)."""
    splits = meta["splits"]
    checksums = np.fromfile(target / CHECKSUMS, dtype="<u4").astype(np.uint32, copy=False)
    if mode == "memory":
        x = torch.from_numpy(np.fromfile(target / IMAGES, dtype=np.uint8)).view(shape)
        bad = np.flatnonzero(row_checksums(x.numpy()) != checksums)
        if len(bad):
            return int(bad[0])
        return {name: x[s["rows"][0]:s["rows"][1]] for name, s in splits.items()}
    source = ImageMap(target / IMAGES, shape, checksums=checksums, on_damage=functools.partial(set_aside, target))
    return {name: MappedImages(source, torch.arange(*s["rows"]), (s["min"], s["max"])) for name, s in splits.items()}


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path, what: str):
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"data: waiting for another process building {what}", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(root: Path, tag: str, key: str, counts: dict[str, int], shape: tuple[int, ...], parts: Sequence[int],
           fill: Callable[[int], Tensor | np.ndarray], dataset: str) -> dict:
    """Write the cache (resuming a killed build of the same key) and move it into place; returns its meta."""
    root.mkdir(parents=True, exist_ok=True)
    target, partial = root / tag, root / f"{tag}.partial"
    row_bytes, total = math.prod(shape), sum(counts.values())
    with _locked(root / f"{tag}.lock", partial):
        meta = _read_meta(target, key, total, row_bytes)
        if meta is not None:  # another process built it while this one waited
            return meta
        progress = _progress(partial, key)
        if progress is None:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            for name, size in ((IMAGES, total * row_bytes), (CHECKSUMS, total * 4)):
                with open(partial / name, "wb") as f:
                    f.truncate(size)
            progress = {"key": key, "parts_done": 0, "extrema": []}
            _write_json(partial / PROGRESS, progress)
        done = progress["parts_done"]
        starts = np.cumsum([0, *parts]).tolist()
        need, free = (total - starts[done]) * row_bytes, shutil.disk_usage(root).free
        if need > free:  # checked first: a disk that fills up part-way costs the time spent so far
            raise OSError(errno.ENOSPC, f"{gib(free)} free, {gib(need)} more needed")
        resumed = f", resuming at image {starts[done]}" if done else ""
        print(f"data: writing the {dataset} image cache {target} ({total} images, {gib(total * row_bytes)}"
              f"{resumed})", file=sys.stderr, flush=True)
        began = time.perf_counter()
        try:
            with open(partial / IMAGES, "r+b") as f, open(partial / CHECKSUMS, "r+b") as sums, \
                    tqdm(total=total, initial=starts[done], unit="img", desc=f"{dataset} cache",
                         disable=not sys.stderr.isatty(), file=sys.stderr) as bar:
                for i in range(done, len(parts)):
                    x = np.ascontiguousarray(torch.as_tensor(fill(i)).numpy())
                    if x.dtype != np.uint8 or x.shape != (parts[i], *shape):
                        raise ValueError(f"part {i} of the {dataset} image cache is {x.dtype} {x.shape}, not uint8 "
                                         f"{(parts[i], *shape)}")
                    _pwrite_all(f.fileno(), memoryview(x).cast("B"), starts[i] * row_bytes)
                    _pwrite_all(sums.fileno(), memoryview(row_checksums(x).astype("<u4")).cast("B"), starts[i] * 4)
                    os.fdatasync(f.fileno())  # the bytes are on disk before the progress says so
                    os.fdatasync(sums.fileno())
                    progress["extrema"].append([int(x.min()), int(x.max())] if x.size else [255, 0])
                    progress["parts_done"] = i + 1
                    _write_json(partial / PROGRESS, progress)
                    bar.update(parts[i])
        except Exception:  # a bad source file or a full disk: a rebuild starts afresh; a kill (or Ctrl-C) resumes
            shutil.rmtree(partial, ignore_errors=True)
            raise
        meta = {"format": FORMAT, "key": key, "dataset": dataset, "shape": [total, *shape],
                "splits": _split_meta(counts, parts, progress["extrema"]),
                "built_s": round(time.perf_counter() - began, 3)}
        _write_json(partial / META, meta)
        (partial / PROGRESS).unlink()
        for old in root.glob(f"{tag}.stale.*"):  # left by a process killed between the two renames below
            shutil.rmtree(old, ignore_errors=True)
        stale = root / f"{tag}.stale.{os.getpid()}"
        if target.exists():  # another key (a changed source): replaced, never overwritten in place
            os.rename(target, stale)
        os.rename(partial, target)
        shutil.rmtree(stale, ignore_errors=True)
        print(f"data: wrote the {dataset} image cache in {meta['built_s']:.1f} s", file=sys.stderr)
        return meta


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):  # one write moves at most about 2 GiB
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _progress(partial: Path, key: str) -> dict | None:
    """The saved progress of an interrupted build of `key`, or None (start afresh)."""
    try:
        progress = json.loads((partial / PROGRESS).read_text())
        whole = (partial / IMAGES).is_file() and (partial / CHECKSUMS).is_file()  # a format-1 build has no checksums
        return progress if progress.get("key") == key and whole else None
    except (OSError, ValueError):
        return None


def _split_meta(counts: dict[str, int], parts: Sequence[int], extrema: list[list[int]]) -> dict:
    """Each split's rows [start, stop) and pixel range, from the parts' (which never span two splits)."""
    out, row, part = {}, 0, 0
    for name, n in counts.items():
        lo, hi, end = 255, 0, row + n
        while row < end:
            lo, hi = min(lo, extrema[part][0]), max(hi, extrema[part][1])
            row += parts[part]
            part += 1
        if row != end:
            raise ValueError(f"a part spans splits at row {end}")
        out[name] = {"rows": [end - n, end], "min": lo, "max": hi}
    return out
