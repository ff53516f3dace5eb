"""Images read in place from a memory-mapped uint8 file (`data.cache=mmap`): a pool larger than memory is indexed,
never loaded. fl/data/cache.py writes the file; a split's `x` is then a `MappedImages`, the rows of the map it holds,
and every batch is gathered from the map into a fresh (pinned, for a CUDA device) buffer. Each row's CRC-32, written
with the file, is checked the first time the row is read, so damage that keeps the file's size (bytes overwritten in
place) stops the run instead of training on it."""
from __future__ import annotations

import math
import mmap
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

# A gather's pages stay in the page cache (shared by every process that maps the file, given back under memory
# pressure) but are dropped from this process's mapping every RELEASE_BYTES read, so its resident set holds a window
# of the pool, not every image it has read so far.
RELEASE_BYTES = 256 << 20


def row_checksums(rows: np.ndarray) -> np.ndarray:
    """CRC-32 of each row of a uint8 array [N, ...] (C order), as uint32: what the cache writes beside its images and
    ImageMap checks on first read."""
    flat = np.ascontiguousarray(rows).reshape(len(rows), -1)
    return np.fromiter((zlib.crc32(row) for row in flat), dtype=np.uint32, count=len(flat))


class DamagedImages(RuntimeError):
    """A row of an image map whose bytes no longer match the checksum written with them."""


class ImageMap:
    """uint8 images [N, *shape[1:]] stored raw (C order) from byte `offset` of `path`, mapped read-only and shared
    (a private writable map of a file larger than memory is refused by the kernel's overcommit check).

    A gather asks the kernel for exactly its rows' pages first (MADV_WILLNEED, one read per row), then copies them
    (numpy's take): with the default readahead a fault reads a whole window around it (8 MiB on the development
    machine, 15x a batch of 224 px images, which thrashes the page cache), so the map is advised MADV_RANDOM; torch's
    index_select on 4-d uint8 rows is 10-40x slower than numpy's take (bench/README.md, "Datasets larger than
    memory").

    `checksums` (uint32 per row, row_checksums of the rows as written): each row read for the first time is checked
    against its own, and a mismatch raises DamagedImages, after `on_damage(row)` (a picklable callable: the cache sets
    itself aside there) returned what the message adds. The check costs a CRC-32 of each row once per process
    (bench/README.md, "Datasets larger than memory"); later reads look up one flag per row."""

    def __init__(self, path: Path, shape: tuple[int, ...], offset: int = 0, checksums: Optional[np.ndarray] = None,
                 on_damage: Optional[Callable[[int], str]] = None):
        self.path, self.shape, self.offset = Path(path), tuple(int(s) for s in shape), int(offset)
        self.checksums, self.on_damage = checksums, on_damage
        if checksums is not None and len(checksums) != self.shape[0]:
            raise ValueError(f"{len(checksums)} checksums for the {self.shape[0]} rows of {self.path}")
        self._checked = None if checksums is None else np.zeros(self.shape[0], dtype=bool)
        self.row_bytes = math.prod(self.shape[1:])
        n = self.shape[0] * self.row_bytes
        self._map: Optional[mmap.mmap] = None
        if not n:  # nothing to map (mmap refuses length 0)
            self._rows = np.zeros((self.shape[0], self.row_bytes), dtype=np.uint8)
        else:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), self.offset + n, access=mmap.ACCESS_READ)
            self._map.madvise(mmap.MADV_RANDOM)
            self._rows = np.frombuffer(self._map, dtype=np.uint8, count=n, offset=self.offset).reshape(
                self.shape[0], self.row_bytes)
        self._read = 0
        self._lock = threading.Lock()  # gathers come from the training thread and the prefetching one

    def gather(self, rows: Tensor, pin: bool) -> Tensor:
        """The images at `rows` (CPU int64 positions) in a new tensor, in pinned memory if `pin`."""
        out = torch.empty((len(rows),) + self.shape[1:], dtype=torch.uint8, pin_memory=pin)
        if not len(rows):
            return out
        at = rows.numpy().astype(np.int64, copy=False)
        if at.min() < 0 or at.max() >= self.shape[0]:
            raise IndexError(f"rows {int(at.min())}..{int(at.max())} of an image map of {self.shape[0]}")
        page = mmap.PAGESIZE
        for start in (at * self.row_bytes + self.offset).tolist():
            self._map.madvise(mmap.MADV_WILLNEED, start - start % page, start % page + self.row_bytes)
        np.take(self._rows, at, axis=0, out=out.numpy().reshape(len(at), -1), mode="clip")  # in bounds: checked
        if self._checked is not None:
            self._check(at, out.numpy().reshape(len(at), -1))
        with self._lock:
            self._read += out.numel()
            release, self._read = self._read >= RELEASE_BYTES, self._read % RELEASE_BYTES
        if release:
            self._map.madvise(mmap.MADV_DONTNEED)  # unmap, not evict: the next read is a page-cache hit
        return out

    def _check(self, at: np.ndarray, rows: np.ndarray) -> None:
        """The rows read now (positions `at`, bytes `rows`) that were never checked, against their checksums."""
        fresh = np.flatnonzero(~self._checked[at])
        for i in fresh.tolist():
            row = int(at[i])
            if zlib.crc32(rows[i]) != int(self.checksums[row]):
                note = self.on_damage(row) if self.on_damage is not None else ""
                raise DamagedImages(f"image {row} of {self.path} does not match the checksum written with it: the file "
                                    f"was changed after it was built{'; ' + note if note else ''}")
        self._checked[at[fresh]] = True  # a flag set twice by the two reading threads is set all the same

    def __reduce__(self):  # a copy (pickle, deepcopy) maps the same file again, its rows checked again
        return ImageMap, (self.path, self.shape, self.offset, self.checksums, self.on_damage)


class MappedImages:
    """The images of `rows` of an ImageMap, in that order: a split's `x` without a copy. It answers what code asks of
    an image tensor (shape, dtype, device, dim, x[idx] as a tensor) and `select` makes sub-views, so a split of it is
    subset and concatenated as index lists. `value_range` is the (min, max) pixel of these rows when known (the cache
    records it per split), so checking the pool does not read it all."""

    def __init__(self, source: ImageMap, rows: Tensor, value_range: Optional[tuple[int, int]] = None):
        self.source, self.rows, self.value_range = source, rows, value_range

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows),) + self.source.shape[1:])

    dtype = torch.uint8
    device = torch.device("cpu")  # the map is host memory, whatever data.on_device says

    def dim(self) -> int:
        return len(self.source.shape)

    def is_floating_point(self) -> bool:
        return False

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, idx) -> MappedImages:
        """The sub-view of positions `idx` (a slice, an index or a boolean mask), sharing the map."""
        return MappedImages(self.source, self.rows[idx])

    def gather(self, idx, pin: bool = False) -> Tensor:
        """The images at positions `idx` of this view, read from the map into a new (pinned if `pin`) tensor."""
        if isinstance(idx, int):
            return self.source.gather(self.rows[idx:idx + 1 or None], pin)[0]
        return self.source.gather(self.rows[idx], pin)

    __getitem__ = gather  # x[idx] is a tensor, as for an image tensor

    def load(self) -> Tensor:
        """Every image of the view, in memory."""
        return self.gather(slice(None))

    def extrema(self) -> tuple[int, int]:
        """(min, max) pixel of the view: the recorded range, or else read through the map in pieces."""
        if self.value_range is not None:
            return self.value_range
        lo, hi = 255, 0
        for part in self.rows.split(max(1, RELEASE_BYTES // max(1, self.source.row_bytes))):
            x = self.source.gather(part, pin=False)
            lo, hi = min(lo, int(x.min())), max(hi, int(x.max()))
        return lo, hi

    @staticmethod
    def cat(views: list[MappedImages]) -> MappedImages:
        if any(v.source is not views[0].source for v in views):
            raise ValueError("cannot join views of different image maps")
        return MappedImages(views[0].source, torch.cat([v.rows for v in views]))
