"""Spearman's critical values (fl/reproduce/spearman.py): the exact null distribution counted by the dynamic program
equals brute-force enumeration of the rankings, and the critical values are the published ones."""
import itertools
import math

import pytest

from fl.reproduce.spearman import EXACT_MAX, critical_rho, null_counts, p_value


@pytest.mark.parametrize("n", range(1, 8))
def test_the_dynamic_program_counts_what_enumerating_every_ranking_counts(n):
    brute: dict[int, int] = {}
    for perm in itertools.permutations(range(1, n + 1)):
        t = sum(i * j for i, j in zip(range(1, n + 1), perm))
        brute[t] = brute.get(t, 0) + 1
    assert null_counts(n) == brute
    assert sum(null_counts(n).values()) == math.factorial(n)


# one-sided alpha = 0.05, from the published tables of Spearman's critical values (e.g. Zar's)
PUBLISHED = {5: 0.900, 6: 0.829, 7: 0.714, 8: 0.643, 9: 0.600, 10: 0.564, 11: 0.536, 12: 0.503, 13: 0.484,
             14: 0.464}


@pytest.mark.parametrize("n, value", sorted(PUBLISHED.items()))
def test_the_exact_critical_values_are_the_published_ones(n, value):
    assert round(critical_rho(n), 3) == value
    assert p_value(n, critical_rho(n)) <= 0.05  # the critical value itself is significant ...
    # D = sum of squared rank differences is always even: rho moves in steps of 12 / (n (n^2 - 1))
    below = max(r for r in (1 - 6 * d / (n * (n * n - 1)) for d in range(0, n ** 3, 2)) if r < critical_rho(n) - 1e-12)
    assert p_value(n, below) > 0.05  # ... and the next value of rho down is not


def test_four_rows_need_a_perfect_ranking_and_three_can_never_be_significant():
    assert critical_rho(4) == 1.0 and p_value(4, 1.0) == pytest.approx(1 / 24)  # 0.042 < 0.05
    assert p_value(3, 1.0) == pytest.approx(1 / 6) and critical_rho(3) is None
    assert critical_rho(2) is None and critical_rho(1) is None


def test_above_the_exact_range_the_t_approximation_continues_the_exact_values():
    with pytest.raises(ValueError):
        null_counts(EXACT_MAX + 1)
    assert p_value(EXACT_MAX + 1, 0.5) is None
    values = [critical_rho(n) for n in range(EXACT_MAX - 2, EXACT_MAX + 6)]
    assert all(a > b for a, b in zip(values, values[1:]))  # falls with n, across the switch
    assert abs(critical_rho(EXACT_MAX + 1) - critical_rho(EXACT_MAX)) < 0.03
