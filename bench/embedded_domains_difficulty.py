"""How hard is the embedded multi-domain dataset? Centralised baselines with a tiny CNN, plain PyTorch.

Three settings, each trained for the same number of SGD steps so that only the data differ:
  (i)   pooled: train on every domain, test on every domain (and per domain);
  (ii)  transfer: train on one domain (all of its training images), test on each domain;
  (iii) few-shot local: train on `--few` samples per class of one domain, test on that domain.
Model: the framework's `cnn` (conv 16 -> conv 32 -> hidden 64 at width 16); SGD with momentum, batch 32,
inputs normalised with the pool's mean/std. Mean and std over `--seeds` seeds.

    python bench/embedded_domains_difficulty.py [--steps 1000] [--seeds 3] [--few 30]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.data.embedded_domains import make_pool
from fl.models.small import cnn


def normalise(x: torch.Tensor, mean, std) -> torch.Tensor:
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    return (x.float() / 255 - m) / s


def train(x, y, num_classes: int, steps: int, seed: int, args) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = cnn(load_config([f"model.width={args.width}"]).model, tuple(x.shape[1:]), num_classes)  # fl's defaults
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    gen = torch.Generator().manual_seed(seed)
    done = 0
    while done < steps:
        for idx in torch.randperm(len(y), generator=gen).split(args.batch_size):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    return model.eval()


@torch.no_grad()
def accuracy(model, x, y) -> float:
    return sum((model(xb).argmax(1) == yb).sum().item() for xb, yb in zip(x.split(1000), y.split(1000))) / len(y)


def few_per_class(y: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([c[torch.randperm(len(c), generator=gen)[:k]] for c in
                      (torch.nonzero(y == cls).flatten() for cls in y.unique())])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--few", type=int, default=30)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--domains", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(2)

    t0 = time.time()
    pool = make_pool(num_domains=args.domains)
    print(f"make_pool: {time.time() - t0:.1f} s; train {tuple(pool.train.x.shape)}, test {tuple(pool.test.x.shape)}")
    k, names = pool.num_classes, pool.domain_names
    xtr, ytr, dtr = normalise(pool.train.x, pool.mean, pool.std), pool.train.y, pool.train.domain
    xte, yte, dte = normalise(pool.test.x, pool.mean, pool.std), pool.test.y, pool.test.domain
    per_domain = lambda m: [accuracy(m, xte[dte == d], yte[dte == d]) for d in range(len(names))]  # noqa: E731

    pooled, transfer, few = [], [], []
    t0 = time.time()
    for seed in range(args.seeds):
        m = train(xtr, ytr, k, args.steps, seed, args)
        pooled.append([accuracy(m, xte, yte)] + per_domain(m))
        transfer.append([per_domain(train(xtr[dtr == d], ytr[dtr == d], k, args.steps, seed, args))
                         for d in range(len(names))])
        row = []
        for d in range(len(names)):
            idx = few_per_class(ytr[dtr == d], args.few, seed)
            m = train(xtr[dtr == d][idx], ytr[dtr == d][idx], k, args.steps, seed, args)
            row.append(accuracy(m, xte[dte == d], yte[dte == d]))
        few.append(row)
    elapsed = time.time() - t0

    def fmt(values: torch.Tensor) -> str:
        return f"{100 * values.mean():5.1f} ± {100 * values.std(unbiased=False):3.1f}"

    pooled, transfer, few = torch.tensor(pooled), torch.tensor(transfer), torch.tensor(few)
    print(f"\n{args.seeds} seeds, {args.steps} steps each, lr {args.lr}, momentum {args.momentum}, "
          f"{elapsed:.0f} s of training\n")
    print("(i) pooled train, pooled test:", fmt(pooled[:, 0]))
    print("    per test domain:", ", ".join(f"{n} {fmt(pooled[:, 1 + d])}" for d, n in enumerate(names)))
    print("\n(ii) train on one domain (rows) -> test on each domain (columns); diagonal = in-domain")
    print(" " * 10 + "".join(f"{n:>14}" for n in names) + f"{'off-diag mean':>16}")
    for d, n in enumerate(names):
        off = torch.cat([transfer[:, d, :d], transfer[:, d, d + 1:]], 1).mean(1)
        print(f"{n:>10}" + "".join(f"{fmt(transfer[:, d, e]):>14}" for e in range(len(names))) + f"{fmt(off):>16}")
    print(f"\n(iii) {args.few} per class of one domain -> same domain (vs the full {len(ytr) // k // len(names)}"
          " per class: the diagonal of (ii))")
    print("    " + ", ".join(f"{n} {fmt(few[:, d])}" for d, n in enumerate(names)) + f"; mean {fmt(few.mean(1))}")


if __name__ == "__main__":
    main()
