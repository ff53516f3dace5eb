"""Partition heatmaps as PNG, drawn with matplotlib (constrained layout: titles and labels fit the image)."""
from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

MAX_NAMED_TICKS = 40  # more columns (or rows) than this: numbered ticks at intervals, names would overlap
MAX_ANNOTATED_CELLS = 400  # counts are written in the cells of a small grid only


def heatmap(counts: Tensor, path: Path, title: str, row_name: str = "client",
            col_names: Sequence[str] = (), col_name: str = "") -> Path:
    """Rows x columns count matrix (e.g. clients x classes) as a white-to-blue grid with a colour bar; counts
    written in the cells of a small grid. Square-root colour scale, so small counts stay visible."""
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no display backend
    from matplotlib.ticker import MaxNLocator

    counts = counts.to(torch.float64).cpu().numpy()
    rows, cols = counts.shape
    width = min(14.0, max(5.0, 2.5 + 0.28 * cols))
    height = min(12.0, max(3.0, 1.8 + 0.24 * rows))
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(counts, cmap="Blues", aspect="auto", interpolation="nearest",
                      norm=PowerNorm(0.5, vmin=0, vmax=max(1.0, float(counts.max()))))
    fig.colorbar(image, ax=ax, label="samples", shrink=0.9)
    ax.set_title(textwrap.fill(title, int(width * 11)), fontsize=10)
    ax.set_ylabel(row_name)
    ax.set_xlabel(col_name)
    if col_names and cols <= MAX_NAMED_TICKS:
        names = [str(c) for c in col_names]
        ax.set_xticks(range(cols), names, rotation=90 if max(map(len, names)) > 3 else 0, fontsize=8)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=20, integer=True))
    if rows <= MAX_NAMED_TICKS:
        ax.set_yticks(range(rows), [str(r) for r in range(rows)], fontsize=8)
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=20, integer=True))
    if rows * cols <= MAX_ANNOTATED_CELLS:
        # the counts sit inside their cells, so the layout need not measure them (a third of the drawing's time)
        top = counts.max()
        for r in range(rows):
            for c in range(cols):
                if counts[r, c]:
                    ax.text(c, r, f"{int(counts[r, c])}", ha="center", va="center", fontsize=7, in_layout=False,
                            color="white" if counts[r, c] > 0.36 * top else "black")  # sqrt scale: past 60% dark
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def write_partition_info(data, path: Path) -> None:
    """partition.json: fingerprint, per-client sizes and the clients x classes label counts."""
    info = {
        "fingerprint": data.fingerprint(),
        "num_clients": data.num_clients,
        "num_classes": data.num_classes,
        "train_sizes": data.train_sizes(),
        "test_sizes": data.test_sizes(),
        "train_label_counts": data.label_counts("train").tolist(),
    }
    Path(path).write_text(json.dumps(info))


def partition_heatmaps(data, run_dir: Path) -> list[Path]:
    """clients x classes (train labels), and clients x domains where the dataset has domains."""
    paths = [heatmap(data.label_counts("train"), Path(run_dir) / "partition_classes.png",
                     f"{data.name}: training samples per client and class", col_names=data.class_names,
                     col_name="class")]
    if data.domain_names:
        counts = torch.stack([torch.bincount(c.train.domain.cpu(), minlength=len(data.domain_names))
                              for c in data.clients])
        paths.append(heatmap(counts, Path(run_dir) / "partition_domains.png",
                             f"{data.name}: training samples per client and domain", col_names=data.domain_names,
                             col_name="domain"))
    return paths
