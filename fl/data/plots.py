"""Partition heatmaps as PNG, drawn with Pillow (shipped with torchvision): no plotting dependency."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor


def heatmap(counts: Tensor, path: Path, title: str, row_name: str = "client",
            col_names: Sequence[str] = ()) -> Path:
    """Rows x columns count matrix (e.g. clients x classes) as a white-to-blue grid; counts written in
    the cells when they fit. Square-root colour scale, so small counts stay visible."""
    counts = counts.to(torch.float64).cpu()
    rows, cols = counts.shape
    cell = max(3, min(28, 900 // max(rows, cols)))
    font = ImageFont.load_default()
    left, top = 70, 40
    bottom = 30 + (max((len(str(c)) for c in col_names), default=0) * 6 if cell >= 12 else 0)
    img = Image.new("RGB", (left + cols * cell + 20, top + rows * cell + bottom), "white")
    draw = ImageDraw.Draw(img)
    scale = counts.max().clamp_min(1).sqrt()
    for r in range(rows):
        for c in range(cols):
            v = float(counts[r, c])
            t = (v ** 0.5) / float(scale)
            colour = (int(255 - 222 * t), int(255 - 180 * t), int(255 - 80 * t))
            x0, y0 = left + c * cell, top + r * cell
            draw.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=colour)
            if cell >= 24 and v:
                draw.text((x0 + 2, y0 + cell // 3), f"{int(v)}", fill="white" if t > 0.6 else "black", font=font)
    draw.text((left, 8), title, fill="black", font=font)
    step = max(1, 12 // cell + (rows > 40) * (rows // 40))
    for r in range(0, rows, step):
        draw.text((8, top + r * cell + max(0, cell // 2 - 6)), f"{row_name} {r}", fill="black", font=font)
    cstep = max(1, 12 // cell)
    for c in range(0, cols, cstep):
        label = str(col_names[c]) if col_names and cell >= 12 else str(c)
        draw.text((left + c * cell, top + rows * cell + 4), label[:10], fill="black", font=font)
    path = Path(path)
    img.save(path)
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
                     f"{data.name}: training samples per client and class", col_names=data.class_names)]
    if data.domain_names:
        counts = torch.stack([torch.bincount(c.train.domain.cpu(), minlength=len(data.domain_names))
                              for c in data.clients])
        paths.append(heatmap(counts, Path(run_dir) / "partition_domains.png",
                             f"{data.name}: training samples per client and domain", col_names=data.domain_names))
    return paths
