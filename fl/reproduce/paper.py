"""A seed paper's tables and claims as data: the objects fl/reproduce/spec.py reads a paper file into, and the error
every mistake in one raises. Nothing here reads a file or judges a claim."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

PAPERS_DIR = Path(__file__).resolve().parent / "papers"
ROOT = Path(__file__).resolve().parent.parent.parent
SCALES = ("twin", "paper")
STATS = ("final", "last", "best_val")
UNITS = {"percent": 100.0, "fraction": 1.0, "raw": 1.0}


class ReproduceError(ValueError):
    """Bad input to fl.reproduce: a paper file, a table id, an option; the message is one line (exit 2)."""


@dataclass(frozen=True)
class SweepRef:
    sweep: str                           # a sweep file, relative to the repository root (or absolute)
    where: dict = field(default_factory=dict)      # key -> value or list: the sweep's points this column runs
    overrides: tuple = ()                # key=value given to every run of this column (a harder twin setting)

    @property
    def path(self) -> Path:
        return ROOT / self.sweep


@dataclass
class Column:
    id: str
    label: str
    refs: dict[str, Optional[list[SweepRef]]]   # scale -> sweeps (None: not run at that scale)
    notes: dict[str, str]                        # scale -> why it is not run there, or what it is
    paper_column: str                            # whose paper numbers it is compared with (itself by default)
    metric: Optional[str] = None                 # the table's metric unless set (e.g. one client's accuracy)
    twin_budget: Any = True                      # at twin scale: every row (True), none (False) or these rows,
                                                 # unless --every-cell; the budget of `--scale twin` (bench/README.md)
    twin_skip: dict = field(default_factory=dict)  # row -> why its twin cell cannot run (a measured failure)

    def in_budget(self, method: str) -> bool:
        return self.twin_budget is True or (isinstance(self.twin_budget, list) and method in self.twin_budget)


@dataclass
class Row:
    method: str
    points: list[dict]                            # filters (key -> value or list), any of which selects a point
    paper: dict[str, tuple[Optional[float], Optional[float]]]   # column id -> (mean, std) as printed
    note: str = ""
    metric: Optional[str] = None                  # the column's (or table's) metric unless set


@dataclass
class Table:
    id: str
    caption: str
    source: str
    metric: str
    stat: str
    unit: str
    lower_is_better: bool
    select: Optional[str]
    paper_seeds: Optional[int]
    paper_std: str
    columns: list[Column]
    rows: list[Row]
    notes: list[str]
    baselines: list[str] = field(default_factory=list)  # the reference rows a twin is calibrated on (setting.py)

    @property
    def digits(self) -> int:
        """The decimals the paper prints this table's numbers with (at least 1)."""
        shown = [v for r in self.rows for pair in r.paper.values() for v in pair if v is not None]
        return max([1] + [len(repr(v).split(".")[1].rstrip("0")) for v in shown if "." in repr(v)])

    @property
    def factor(self) -> float:
        """Ours (as logged: accuracies are fractions) times this is in the paper's units."""
        return UNITS[self.unit]

    def column(self, cid: str) -> Column:
        return next(c for c in self.columns if c.id == cid)

    def row(self, method: str) -> Row:
        return next(r for r in self.rows if r.method == method)

    def metric_of(self, column: Column, row: Row) -> str:
        return row.metric or column.metric or self.metric


@dataclass
class Claim:
    id: str
    text: str
    rule: str
    source: str
    params: dict                 # the rule's cells and numbers (fl/reproduce/claims.py reads them)
    scales: tuple[str, ...]
    twin_note: str = ""          # a measured reason, known before, for why it may not hold on the twin


@dataclass
class Paper:
    id: str
    title: str
    source: str
    tables: list[Table]
    claims: list[Claim]
    path: Path

    def table(self, tid: str) -> Table:
        found = [t for t in self.tables if t.id == tid]
        if not found:
            raise ReproduceError(f"--table {tid!r} is not a table of {self.id}; choices: "
                                 f"{', '.join(t.id for t in self.tables)}")
        return found[0]
