"""Whether a column's runs are in the paper's regime: each of the table's reference baselines (`baselines:` in the
paper file: FedAvg and Local where the table has them) near the paper's own value for it. A claim's check on a column
outside the regime is NOT JUDGED (fl/reproduce/claims.py): the twin's setting, not the method, would decide it.

- accuracies (unit percent or fraction): within REGIME_POINTS accuracy points of the paper's value;
- raw units (a KL divergence, a risk): within a factor REGIME_RATIO of it either way, of the same sign. They have no
  common scale of points: a twin's KL a third of the paper's describes another regime, whatever its units.

Decided per table and column: one set of runs read through two metrics (FedACD's accuracy and KL tables) can be in
the regime of one and not of the other.
"""
from __future__ import annotations

from typing import Optional

from fl.reproduce.cells import Cell, CellKey
from fl.reproduce.claim_cells import paper_mean
from fl.reproduce.paper import Table

REGIME_POINTS = 10.0
REGIME_RATIO = 2.0


def outside(table: Table, paper: float, ours: float) -> str:
    """How far `ours` (in the paper's units) is from the paper's value when that is outside the regime; "" inside."""
    if table.unit in ("percent", "fraction"):
        points = abs(ours - paper) * 100.0 / table.factor
        return f"{points:.1f} points from it" if points > REGIME_POINTS else ""
    if paper == 0.0 or ours == 0.0 or (paper > 0) != (ours > 0):
        return "not of the same sign" if paper != ours else ""
    ratio = max(ours / paper, paper / ours)
    return f"a factor {ratio:.1f} from it" if ratio > REGIME_RATIO else ""


def column_regime(table: Table, column: str, results: dict[CellKey, Cell]) -> tuple[Optional[bool], str]:
    """(in regime, why not): False when a reference baseline that ran is outside the regime, True when at least one
    ran and all are inside, None when none ran or the paper prints none for this column."""
    verdict, why = None, []
    for method in table.baselines:
        paper = paper_mean(table, column, method)
        cell = results.get(CellKey(table.id, column, method))
        if paper is None or cell is None or not cell.n:
            continue
        far = outside(table, paper, cell.mean)
        if far:
            why.append(f"{method} {cell.mean:.{table.digits}f} against the paper's {paper:.{table.digits}f}, {far}")
        verdict = (verdict is not False) and not far
    return verdict, "; ".join(why)
