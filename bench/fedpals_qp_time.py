"""Solve time of FedPALS' aggregation QP (cvxpy, CLARABEL) for M clients x K classes.

    python bench/fedpals_qp_time.py [M=100] [K=10] [repeats=20]
"""
import statistics
import sys
import time

import numpy as np

from fl.methods.fedpals.qp import fedpals_weights, lambda_for_ess


def timed(fn, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    opts = dict(a.split("=") for a in sys.argv[1:])
    M, K, repeats = int(opts.get("M", 100)), int(opts.get("K", 10)), int(opts.get("repeats", 20))
    rng = np.random.default_rng(0)
    S, T, n = rng.dirichlet(np.full(K, 0.3), M), rng.dirichlet(np.ones(K)), rng.integers(50, 1000, M)
    print(f"FedPALS QP, M={M} clients x K={K} classes, median of {repeats}:")
    for lam in (100.0, 0.0):
        print(f"  lam={lam:<6} {1000 * timed(lambda lam=lam: fedpals_weights(S, T, n, lam), repeats):7.1f} ms")
    print(f"  ess_frac=0.5 (bisection, ~20 solves) {1000 * timed(lambda: lambda_for_ess(S, T, n, 0.5), 3):7.1f} ms")


if __name__ == "__main__":
    main()
