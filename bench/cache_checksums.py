"""What the image cache's per-row checksums cost (fl/data/cache.py, fl/core/mapped_images.py; issue 34, item 6).

A synthetic pool of N uint8 images (default 8192 x 3x64x64, 96 MiB) goes through fl.data.cache.cached_images in a
temporary folder, and each phase is timed with and without the checksums (the "without" rows call the same code
with the CRC-32 step taken out):
- build: writing the cache (the rows' CRC-32s are computed and written beside them);
- memory load: reading the cache into memory (every row's CRC-32 checked against the written one);
- mmap first epoch: every row gathered once from the map in shuffled batches of 64 (each row checked on this read);
- mmap second epoch: the same again (a checked row costs a flag lookup).
Each figure is the median of --repeat runs (the page cache is warm after the first: these are CPU costs, not disk
reads). Prints one Markdown table.

    python bench/cache_checksums.py [--images 8192] [--side 64] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from fl.core import mapped_images
from fl.data import cache


def data_block(cache_mode: str):
    return OmegaConf.create({"cache": cache_mode, "cache_dir": None, "cache_auto_fraction": 0.25})


@contextlib.contextmanager
def checksums_off():
    """The same code with the CRC-32 step taken out: every row's checksum a constant 0, never compared."""
    rows, check = mapped_images.row_checksums, mapped_images.ImageMap._check
    fake = lambda x: np.zeros(len(x), dtype=np.uint32)  # noqa: E731
    mapped_images.row_checksums = cache.row_checksums = fake
    mapped_images.ImageMap._check = lambda self, at, got: None
    try:
        yield
    finally:
        mapped_images.row_checksums = cache.row_checksums = rows
        mapped_images.ImageMap._check = check


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def phases(folder: Path, images: torch.Tensor, key: str) -> dict[str, float]:
    n, shape = len(images), tuple(images.shape[1:])
    parts = cache.parts_of({"train": n}, images[0].numel())
    starts = np.cumsum([0, *parts]).tolist()
    common = {"dataset": "bench", "folder": folder, "tag": key, "key": key, "counts": {"train": n}, "shape": shape,
              "parts": parts, "fill": lambda i: images[starts[i]:starts[i + 1]]}
    out = {"build": timed(lambda: cache.cached_images(data_block("memory"), **common))}
    out["memory load"] = timed(lambda: cache.cached_images(data_block("memory"), **common))
    x = cache.cached_images(data_block("mmap"), **common)["train"]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    epoch = lambda: [x.gather(b) for b in order.split(64)]  # noqa: E731
    out["mmap first epoch"] = timed(epoch)
    out["mmap second epoch"] = timed(epoch)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=8192)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    images = torch.randint(0, 256, (args.images, 3, args.side, args.side), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name in ("with", "without"):
                with checksums_off() if name == "without" else contextlib.nullcontext():
                    runs[name].append(phases(Path(tmp) / f"{name}{i}", images, f"{name}{i}"))
    mib = images.numel() / 2**20
    print(f"{args.images} images of 3x{args.side}x{args.side} ({mib:.0f} MiB), median of {args.repeat}, "
          f"1 intra-op thread\n")
    print("| phase | without checksums | with checksums | cost of the checksums |")
    print("|---|---|---|---|")
    for phase in runs["with"][0]:
        a, b = (statistics.median(r[phase] for r in runs[k]) for k in ("without", "with"))
        print(f"| {phase} | {a:.3f} s | {b:.3f} s | {b - a:+.3f} s ({(b - a) / mib * 1e3:+.2f} ms/MiB) |")


if __name__ == "__main__":
    main()
