"""Spearman's rank correlation and its one-sided critical value at 5%: the smallest rho that n rows reach with
probability at most alpha when every ranking of them is equally likely (no association).

The null distribution is exact up to EXACT_MAX rows: rho = 1 - 6 D / (n (n^2 - 1)) with D = sum_i (i - pi(i))^2
= 2 sum_i i^2 - 2 T, T = sum_i i pi(i), and T's distribution over the n! rankings pi is counted by a dynamic program
over the set of ranks already used (2^n sets). Above EXACT_MAX (no table here has more rows) it is the usual t
approximation, r = t / sqrt(n - 2 + t^2) with t Student's one-sided quantile on n - 2 degrees of freedom. The
exact values are the published ones (tables of Spearman's critical values at alpha(1) = 0.05, e.g. Zar's): n = 5:
0.900, 7: 0.714, 10: 0.564, 11: 0.536 (tests/reproduce/test_spearman.py). With n = 4 only rho = 1 is significant
(p = 1/24 = 0.042); with 3 rows or fewer none is (the smallest p is 1/6)."""
from __future__ import annotations

import math
import statistics
from fractions import Fraction
from functools import cache
from typing import Optional

import numpy as np

ALPHA = 0.05
EXACT_MAX = 14  # 2^14 sets of ranks: a fraction of a second; 16 would take seconds


def spearman_rho(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank); 0.0 when either side is constant."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                out[order[t]] = (i + j) / 2 + 1
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else 0.0


@cache
def null_counts(n: int) -> dict[int, int]:
    """T = sum_i i pi(i) -> the number of the n! rankings pi of 1..n with that T (exact; n <= EXACT_MAX)."""
    if not 1 <= n <= EXACT_MAX:
        raise ValueError(f"exact counts for 1 to {EXACT_MAX} rows, not {n}")
    top = sum(i * i for i in range(1, n + 1))
    level = {0: np.zeros(top + 1, dtype=np.int64)}
    level[0][0] = 1
    for i in range(1, n + 1):  # position i takes one of the ranks not yet used (bit j - 1 of the set)
        nxt: dict[int, np.ndarray] = {}
        for used, counts in level.items():
            for j in range(1, n + 1):
                if used >> (j - 1) & 1:
                    continue
                target = nxt.setdefault(used | 1 << (j - 1), np.zeros(top + 1, dtype=np.int64))
                target[i * j:] += counts[:top + 1 - i * j]
        level = nxt
    (counts,) = level.values()
    return {t: int(c) for t, c in enumerate(counts) if c}


def rho_of_t(n: int, t: int) -> Fraction:
    squares = n * (n + 1) * (2 * n + 1) // 6
    return 1 - Fraction(6 * (2 * squares - 2 * t), n * (n * n - 1))


def p_value(n: int, rho: float) -> Optional[float]:
    """P(rho' >= rho) over the n! equally likely rankings, exact (None above EXACT_MAX rows). Values of rho are
    multiples of 6 / (n (n^2 - 1)) apart; 1e-9 absorbs the float rounding of an observed one."""
    if not 1 <= n <= EXACT_MAX:
        return None
    counts = null_counts(n)
    return sum(c for t, c in counts.items() if rho_of_t(n, t) >= rho - 1e-9) / math.factorial(n)


def critical_rho(n: int, alpha: float = ALPHA) -> Optional[float]:
    """The one-sided critical value: the smallest rho with P(rho' >= rho) <= alpha under no association, or None
    when no rho of n rows is that unlikely (n <= 3 at 5%)."""
    if n < 2:
        return None
    if n > EXACT_MAX:
        from scipy.stats import t as student_t  # scipy comes with cvxpy; only tables above EXACT_MAX rows need it

        q = float(student_t.ppf(1 - alpha, n - 2))
        return q / math.sqrt(n - 2 + q * q)
    counts, total = null_counts(n), math.factorial(n)
    tail, critical = 0, None
    for t in sorted(counts, reverse=True):  # the largest rho first
        tail += counts[t]
        if Fraction(tail, total) > Fraction(alpha).limit_denominator(10**6):
            break
        critical = rho_of_t(n, t)
    return None if critical is None else float(critical)
