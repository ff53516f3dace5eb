"""Ours beside the paper's, per table and column: each row's paper number and rank, our mean ± std over seeds and
rank, and Spearman's rho between the two columns of means."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fl.reproduce.cells import Cell, CellKey
from fl.reproduce.paper import Column, Table
from fl.reproduce.spearman import critical_rho, spearman_rho


@dataclass
class Line:
    method: str
    paper: Optional[tuple[float, Optional[float]]]
    paper_rank: Optional[int]
    ours: Optional[Cell]
    our_rank: Optional[int]
    why_not: str = ""          # why ours is missing: not run at this scale (and why), or no finished run


@dataclass
class ColumnView:
    table: Table
    column: Column
    lines: list[Line] = field(default_factory=list)
    rho: Optional[float] = None
    rho_rows: int = 0
    same_as: Optional[str] = None  # a variant column whose every cell equals its base column's, seed for seed

    @property
    def notes(self) -> list[str]:
        """The footnotes under the table: each cell's (diverged runs, repeats, ...), then a variant that changed
        nothing."""
        out = [f"{ln.method}: {n}" for ln in self.lines if ln.ours for n in ln.ours.notes]
        if self.same_as:
            out.append(f"every cell equals the same seed's in `{self.same_as}`: this variant's overrides changed no "
                       "run's result, so it is no harder (or other) setting")
        return out

    @property
    def rho_text(self) -> str:
        """rho with the critical value it is read against (fl/reproduce/spearman.py)."""
        if self.rho is None:
            return "Spearman's rho: fewer than 3 rows with both numbers."
        critical = critical_rho(self.rho_rows)
        against = (f"the one-sided 5% critical value for {self.rho_rows} rows: {critical:.3f}" if critical is not None
                   else f"no ranking of {self.rho_rows} rows is significant at the one-sided 5% level")
        return f"Spearman's rho, ours against the paper's means: {self.rho:.2f} over {self.rho_rows} rows ({against})."

    @property
    def digits(self) -> int:
        return self.table.digits


def ranks(values: dict[str, float], lower_is_better: bool) -> dict[str, int]:
    """1 = best; equal values share the better rank."""
    sign = 1.0 if lower_is_better else -1.0
    return {m: 1 + sum(sign * (o - v) < 0 for o in values.values()) for m, v in values.items()}


def column_view(table: Table, column: Column, results: dict[CellKey, Cell], not_run: dict[CellKey, str]
                ) -> ColumnView:
    view = ColumnView(table, column)
    paper = {r.method: r.paper[column.paper_column] for r in table.rows if column.paper_column in r.paper}
    ours = {r.method: results[CellKey(table.id, column.id, r.method)] for r in table.rows
            if CellKey(table.id, column.id, r.method) in results}
    paper_ranks = ranks({m: v[0] for m, v in paper.items()}, table.lower_is_better)
    our_ranks = ranks({m: c.mean for m, c in ours.items() if c.n}, table.lower_is_better)
    for r in table.rows:
        key = CellKey(table.id, column.id, r.method)
        cell = ours.get(r.method)
        why = not_run.get(key, "") if cell is None else ("" if cell.n else "no finished run: see the notes")
        view.lines.append(Line(r.method, paper.get(r.method), paper_ranks.get(r.method), cell,
                               our_ranks.get(r.method), why))
    if column.paper_column != column.id:  # a variant of another column: did its overrides change anything?
        base = {r.method: results.get(CellKey(table.id, column.paper_column, r.method)) for r in table.rows}
        shared = [m for m, c in ours.items() if c.seeds and base.get(m) is not None and base[m].seeds]
        if shared and all(ours[m].seeds == base[m].seeds for m in shared):
            view.same_as = column.paper_column
    both = [m for m in paper if m in our_ranks]
    if len(both) >= 3:
        view.rho = spearman_rho([ours[m].mean for m in both], [paper[m][0] for m in both])
        view.rho_rows = len(both)
    return view
