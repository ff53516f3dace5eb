"""The per-batch and per-evaluation code that used to make a GPU wait for the host, before and after (issue 25, items
11, 12, 13, 17, 19): CPU time per call (process time, median of repeats, one thread) and host reads per call, for

* prepare():   normalising a batch of 128 CIFAR images (mean/std tensors built per batch, before)
* crop / resized_crop / rotate: augmenting it (torchvision per image, before; one gather or grid per batch, after)
* colour:      FedDRM's per-batch colour shift of 128 images of 8 owners (PIL per owner on the CPU, before)
* routing:     the queries routed to each client per test split, 20 clients, 10 000 pooled queries (a nonzero() per
               (client, split) pair, before)
* beta 1-D / 2-D: pFedFDA's beta search on 500 Gaussian features of dimension 128, 10 classes (single and
               separate betas; a float() per objective evaluation, before)

Host reads: calls that read a tensor's value (item, tolist, float(), int(), bool(), nonzero(), cpu(), numpy()) or build
a tensor from Python data on a given device (torch.tensor(..., device=...)), on any tensor: on a GPU each read of
device data waits for it. The resized crop's reads are its draws from the CPU generator (the same before and after),
not reads of the batch.

    python bench/host_stalls.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torchvision.transforms.v2 import functional as TF

from fl.core.federated_data import FederatedData
from fl.data.augment import _crop, _resized_crop, _rotate, resized_crop_params
from fl.data.transforms import feddrm_color, feddrm_color_by_owner
from fl.methods.pfedfda.stats import cv_objective, cv_parts, solve_beta
from fl.metrics.system import routed_queries

READS = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "nonzero", "cpu", "numpy"}


class HostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        self.count += name in READS or (name == "tensor" and "device" in kwargs)
        return func(*args, **kwargs)


# ---- the paths as they were ------------------------------------------------------------------------------------------
def prepare_before(data, x):
    x = x.to(torch.float32).div_(255)
    shape = (1, -1, 1, 1)
    return x.sub_(torch.tensor(data.mean, dtype=torch.float32, device=x.device).view(shape)).div_(
        torch.tensor(data.std, dtype=torch.float32, device=x.device).view(shape))


def crop_before(x, gen, pad=4):
    h, w = x.shape[-2:]
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen).tolist()
    dx = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen).tolist()
    return torch.stack([padded[i, :, a:a + h, b:b + w] for i, (a, b) in enumerate(zip(dy, dx))])


def resized_crop_before(x, gen):
    h, w = x.shape[-2:]
    return torch.stack([TF.resized_crop(img, *resized_crop_params(h, w, gen), [h, w], antialias=True) for img in x])


def rotate_before(x, gen, degrees=30.0):
    angles = torch.empty(len(x)).uniform_(-degrees, degrees, generator=gen).tolist()
    return torch.stack([TF.rotate(img, a) for img, a in zip(x, angles)])


def colour_before(x, owner, num_clients):
    out = x.clone()
    for cid in owner.unique().tolist():
        rows = owner == cid
        out[rows] = feddrm_color(x[rows], cid, num_clients, backend="pil").to(out.device)
    return out


def routing_before(route, sizes):
    start, out = 0, []
    for n in sizes:
        out += [(route[start:start + n] == c).nonzero().flatten() for c in range(len(sizes))]
        start += n
    return out


def routing_after(route, sizes):
    routed = routed_queries(route, sizes)
    return [routed(c, j) for j in range(len(sizes)) for c in range(len(sizes))]


def host_golden_section(f, lo, hi, tol):
    """The golden-section search as pFedFDA's beta search ran it before: every evaluation of f read on the host."""
    ratio = (math.sqrt(5) - 1) / 2
    c, d = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > tol:
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - ratio * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + ratio * (hi - lo)
            fd = f(d)
    return (c, fc) if fc <= fd else (d, fd)


def host_bounded_min(f, dims, tol=1e-7):
    """The host-driven grid and golden-section refinement of f over [0, 1]^dims, as before: (point, value)."""
    def value(point):
        v = f(*point)
        return v if math.isfinite(v) else math.inf

    n = 21 if dims == 1 else 11
    axis = [i / (n - 1) for i in range(n)]
    grid = [(a,) for a in axis] if dims == 1 else [(a, b) for a in axis for b in axis]
    values = [value(p) for p in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    point, fbest = list(grid[best]), values[best]
    if not math.isfinite(fbest):
        return tuple(point), fbest
    for _ in range(1 if dims == 1 else 8):
        moved = 0.0
        for i in range(dims):
            lo, hi = max(0.0, point[i] - 1 / (n - 1)), min(1.0, point[i] + 1 / (n - 1))
            t, ft = host_golden_section(lambda t, i=i: value(point[:i] + [t] + point[i + 1:]), lo, hi, tol)
            if ft < fbest:
                moved, point[i], fbest = max(moved, abs(t - point[i])), t, ft
        if moved < 10 * tol:
            break
    return tuple(point), fbest


def beta_before(z, y, glob, lp, dims):
    """The host-driven grid and golden-section search over the same objective J."""
    J = cv_objective(cv_parts(z, y, glob, 2, "paper", torch.Generator().manual_seed(0)), glob, lp, 1e-4)

    def value(*b):
        with torch.no_grad():
            return float(J(torch.tensor(b[0], dtype=torch.float64), torch.tensor(b[-1], dtype=torch.float64)))
    return list(host_bounded_min(value, dims)[0])


def beta_after(z, y, glob, lp, dims):
    r = solve_beta(z, y, glob, lp, mode="single" if dims == 1 else "separate", k=2, cov_reg="paper", shrink_eps=1e-4,
                   max_iter=10, gtol=1e-3, gen=torch.Generator().manual_seed(0))
    return [r.beta_mu, r.beta_cov][:dims]


# ---- measuring -------------------------------------------------------------------------------------------------------
def measure(fn, repeats: int) -> tuple[float, int]:
    fn()  # warm-up (tables, caches)
    with HostReads() as reads:
        fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()  # CPU time: the machine is shared, wall time there measures the neighbours
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3, reads.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8, generator=g)
    owner = torch.arange(128) % 8
    data = FederatedData("cifar", 10, (3, 32, 32), [], mean=(0.4914, 0.4822, 0.4465), std=(0.247, 0.243, 0.261))
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    sizes = [500] * 20
    route = torch.randint(0, 20, (sum(sizes),), generator=g)
    mu = torch.randn(10, 128, generator=g, dtype=torch.float64)
    y = torch.arange(500) % 10
    z = mu[y] * 0.7 + torch.randn(500, 128, generator=g, dtype=torch.float64)
    glob, lp = (mu, torch.eye(128, dtype=torch.float64)), torch.full((10,), -math.log(10), dtype=torch.float64)
    assert routing_before(route, sizes)[7].tolist() == routing_after(route, sizes)[7].tolist()
    assert beta_before(z, y, glob, lp, 1) == beta_after(z, y, glob, lp, 1)
    cases = [
        ("prepare (128 images)", lambda: prepare_before(data, x), lambda: data.prepare(x)),
        ("crop (128 images)", lambda: crop_before(x, gen()), lambda: _crop(x, gen())),
        ("resized_crop (128 images)", lambda: resized_crop_before(x, gen()), lambda: _resized_crop(x, gen())),
        ("rotate (128 images)", lambda: rotate_before(x, gen()), lambda: _rotate(x, gen())),
        ("colour, 8 owners (128 images)", lambda: colour_before(x, owner, 8),
         lambda: feddrm_color_by_owner(x, owner, 8)),
        ("routing (20 clients, 10 000 queries)", lambda: routing_before(route, sizes),
         lambda: routing_after(route, sizes)),
        *[(f"beta {dims}-D (n 500, d 128, C 10)", lambda dims=dims: beta_before(z, y, glob, lp, dims),
           lambda dims=dims: beta_after(z, y, glob, lp, dims)) for dims in (1, 2)],
    ]
    print("| call | before: ms | before: host reads | after: ms | after: host reads |")
    print("|---|---|---|---|---|")
    for name, before, after in cases:
        (tb, rb), (ta, ra) = measure(before, args.repeats), measure(after, args.repeats)
        print(f"| {name} | {tb:.2f} | {rb} | {ta:.2f} | {ra} |", flush=True)


if __name__ == "__main__":
    main()
