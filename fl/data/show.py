"""`python -m fl.data.show [conf=NAME] [key=value ...] [png=DIR]`: the partition a config makes, without training.

Prints the fingerprint, per-client sizes and label / domain mix; with png=DIR, also writes the heatmaps.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from fl.config import ConfigError, load_config
from fl.data import build_data
from fl.data.plots import partition_heatmaps


def describe(data) -> str:
    counts = data.label_counts("train")
    lines = [f"dataset {data.name}: {data.num_clients} clients, {data.num_classes} classes, "
             f"input {tuple(data.input_shape)}, fingerprint {data.fingerprint()}"]
    tr, te = data.train_sizes(), data.test_sizes()
    lines.append(f"train sizes: total {sum(tr)}, min {min(tr)}, median {sorted(tr)[len(tr) // 2]}, max {max(tr)}; "
                 f"test sizes: total {sum(te)}, min {min(te)}, max {max(te)}")
    present = (counts > 0).sum(1)
    lines.append(f"classes per client: min {int(present.min())}, mean {present.double().mean():.1f}, "
                 f"max {int(present.max())}")
    for name, split in (("public", data.public), ("global test", data.global_test)):
        if split is not None:
            lines.append(f"{name} set: {len(split)} samples")
    if data.target is not None:
        t = data.target
        lines.append(f"target: distribution {[round(float(p), 3) for p in t.distribution]}, "
                     f"val {len(t.val)}, test {len(t.test)}")
    lines.append(f"{'client':>6} {'domain':>10} {'train':>6} {'test':>6}  label counts (train)")
    for i, c in enumerate(data.clients):
        dom = data.domain_names[c.domain] if data.domain_names else "-"
        lines.append(f"{i:>6} {dom:>10} {tr[i]:>6} {te[i]:>6}  {counts[i].tolist()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    png = next((a.split("=", 1)[1] for a in argv if a.startswith("png=")), None)
    try:
        cfg = load_config([a for a in argv if not a.startswith("png=")])
        data = build_data(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_printoptions(linewidth=200)
    print(describe(data))
    if png:
        Path(png).mkdir(parents=True, exist_ok=True)
        for p in partition_heatmaps(data, Path(png)):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
