"""A paper's qualitative claims as checks over its table cells, each reported HOLDS, FAILS, UNRESOLVED or, over
several columns or rows, HOLDS in k of n.

Our value of a cell is the mean ± sample std over seeds (fl/reproduce/cells.py), in the paper's units. Two cells'
seed spreads OVERLAP when their intervals [mean - std, mean + std] intersect; a rule never picks a winner between
overlapping cells: it says UNRESOLVED. A cell with fewer than 2 seeds has no spread, so a rule reading it is
UNRESOLVED too. The rules:

- better (A better than B by a margin m >= 0, in the table's units; "better" is higher, or lower for a table of
  losses or risks): with d = A - B (B - A when lower is better) and s = std_A + std_B, HOLDS when d - s > m (even
  the nearest ends of the intervals are m apart), FAILS when d + s <= m (even the farthest ends are not), else
  UNRESOLVED. With m = 0 this is exactly: HOLDS when A's interval lies above B's, FAILS when it lies below or they
  are equal points, UNRESOLVED when they overlap.
- rank (A ranks k-th or better in its column): each other row B is certainly above A when "B better than A" HOLDS,
  possibly above when "A better than B" does not HOLD. A's rank lies in [1 + certainly above, 1 + possibly above];
  HOLDS when the worst of it is <= k, FAILS when the best of it is > k, else UNRESOLVED. A row the paper prints
  with exactly A's number there (the claim's `ties`) is a tie, as in the paper: it counts against A only when it is
  certainly above A, never for merely overlapping it.
- spearman (our ranking of a column's rows agrees with the paper's): rho of our means against the paper's means,
  and rho of each seed's values (the seeds are paired: seed s is the same data split for every method), against
  the one-sided 5% critical value of Spearman's rho for the number of rows that ran (fl/reproduce/spearman.py:
  exact, 0.536 for 11 rows, 1 for 4). HOLDS when rho of the means and of every seed reach it, FAILS when none
  does, else UNRESOLVED (the seeds disagree). Needs 2 seeds that every row has, and 4 rows: no ranking of 3 rows
  is significant at 5% (the best has p = 1/6).
- within (A is within t of the paper's number, in the table's units): HOLDS when A's interval lies inside [paper - t,
  paper + t], FAILS when it lies wholly outside, else UNRESOLVED. Checked at --scale paper only: a twin's absolute
  numbers are not the paper's.

A claim over several columns (`columns:`) or rows (`rows:`) is one check per column or row; n counts those whose
cells exist at this scale (a column with no sweep here, or a cell the twin cannot run, is named and left out; one
outside the twin's time budget counts, not run). It FAILS when any check fails, HOLDS only when all n checks ran
and hold, is PARTIAL, printed `HOLDS in k of n`, when k >= 1 checks hold and none fails, and is otherwise
UNRESOLVED. A claim none of whose checks ran is reported as not checked at this scale.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fl.reproduce.cells import Cell, CellKey
from fl.reproduce.claim_cells import cells_of, instances, paper_mean, stated_ties
from fl.reproduce.paper import Claim, Paper, Table
from fl.reproduce.spearman import critical_rho, p_value, spearman_rho

HOLDS, FAILS, UNRESOLVED, PARTIAL = "HOLDS", "FAILS", "UNRESOLVED", "PARTIAL"


@dataclass
class Check:
    label: str              # which column / row this check is about
    verdict: Optional[str]  # None: its cells were not run at this scale
    detail: str
    counts: bool = True     # whether it is one of the claim's n at this scale (False: no cell of it exists here)


@dataclass
class ClaimResult:
    claim: Claim
    verdict: Optional[str]           # None: not checked at this scale
    checks: list[Check] = field(default_factory=list)
    note: str = ""                   # why it was not checked, or the known reason beside a twin's failure

    @property
    def held(self) -> int:
        return sum(c.verdict == HOLDS for c in self.checks)

    @property
    def named(self) -> int:
        """n: the checks whose cells exist at this scale, run or not."""
        return sum(c.counts for c in self.checks)

    @property
    def label(self) -> str:
        """The verdict as printed: PARTIAL is `HOLDS in k of n`."""
        if self.verdict is None:
            return "NOT CHECKED"
        return f"HOLDS in {self.held} of {self.named}" if self.verdict == PARTIAL else self.verdict


# ---- the rules ---------------------------------------------------------------------------------------------
def fmt(cell: Cell, digits: int = 2) -> str:
    if cell.n == 0:
        return "no value"
    std = "" if cell.std is None else f" ± {cell.std:.{digits}f}"
    return f"{cell.mean:.{digits}f}{std} (n={cell.n})"


def _spread(cell: Cell) -> Optional[str]:
    """Why a cell cannot take part in a spread comparison, or None."""
    if cell.n == 0:
        return "no finished run" + (f" ({cell.notes[0]})" if cell.notes else "")
    if cell.n < 2:
        return "1 seed: no spread to compare"
    return None


def better(a: Cell, b: Cell, table: Table, margin: float = 0.0) -> tuple[str, str]:
    """The `better` rule (module docstring): verdict and the numbers behind it."""
    why = _spread(a) or _spread(b)
    sign = -1.0 if table.lower_is_better else 1.0
    n = table.digits
    if why:
        return UNRESOLVED, f"{fmt(a, n)} vs {fmt(b, n)}: {why}"
    d, s = sign * (a.mean - b.mean), a.std + b.std
    verdict = HOLDS if d - s > margin else FAILS if d + s <= margin else UNRESOLVED
    word = "lower" if table.lower_is_better else "higher"
    gap = f"by {d:+.{n}f} ({word} is better), spreads sum {s:.{n}f}" + (f", margin {margin:g}" if margin else "")
    shape = {HOLDS: "intervals apart", FAILS: "intervals apart the other way" if d < 0 else "short of the margin",
             UNRESOLVED: "intervals overlap" if abs(d) <= s else "within the spreads of the margin"}[verdict]
    return verdict, f"{fmt(a, n)} vs {fmt(b, n)}: {gap}: {shape}"


def rank(target: str, cells: dict[str, Cell], table: Table, k: int, ties: tuple = ()) -> tuple[str, str]:
    """The `rank` rule (module docstring); `ties`: the rows the paper ties with the target in this column."""
    a, n = cells[target], table.digits
    why = _spread(a)
    others = {m: c for m, c in cells.items() if m != target and c.n}
    if why:
        return UNRESOLVED, f"{target} {fmt(a, n)}: {why}"
    thin = [m for m, c in others.items() if _spread(c)]
    sign = -1.0 if table.lower_is_better else 1.0
    by_mean = 1 + sum(sign * (c.mean - a.mean) > 0 for c in others.values())
    above = [m for m, c in others.items() if m not in thin and better(c, a, table)[0] == HOLDS]
    maybe = [m for m, c in others.items() if m in above or (m not in ties and (
        m in thin or better(a, c, table)[0] != HOLDS))]
    best, worst = 1 + len(above), 1 + len(maybe)
    verdict = HOLDS if worst <= k else FAILS if best > k else UNRESOLVED
    text = (f"{target} {fmt(a, n)} ranks {by_mean} of {len(others) + 1} by mean; by the seed spreads {best}"
            + (f" to {worst}" if worst != best else "") + f" (needs {k} or better)")
    if ties:
        text += f"; tied with it in the paper, so not counted above it unless certainly above: {', '.join(ties)}"
    if above:
        text += f"; certainly above it: {', '.join(above)}"
    if verdict == UNRESOLVED:
        text += f"; overlapping it: {', '.join(m for m in maybe if m not in above)}"
    return verdict, text


def spearman(ours: dict[str, Cell], paper: dict[str, float]) -> tuple[str, str]:
    """The `spearman` rule (module docstring), against the critical value for the rows that ran."""
    rows = [m for m in paper if m in ours and ours[m].n]
    critical = critical_rho(len(rows))
    if critical is None:
        return UNRESOLVED, (f"{len(rows)} rows with both numbers: no ranking of {len(rows)} rows is significant at "
                            "the one-sided 5% level (needs 4 rows)")
    rho = spearman_rho([ours[m].mean for m in rows], [paper[m] for m in rows])
    seeds = sorted(set.intersection(*(set(ours[m].seeds) for m in rows)), key=str)
    per_seed = [spearman_rho([ours[m].seeds[s] for m in rows], [paper[m] for m in rows]) for s in seeds]
    p = p_value(len(rows), rho)
    text = (f"rho = {rho:.2f} over {len(rows)} rows (means" + (f", one-sided p = {p:.3f}" if p is not None else "")
            + "); per seed: " + (", ".join(f"{r:.2f}" for r in per_seed) or "none shared by every row")
            + f" (needs >= {critical:.3f}, the one-sided 5% critical value for {len(rows)} rows)")
    if len(seeds) < 2:
        return UNRESOLVED, text + "; fewer than 2 seeds shared by every row"
    values = [rho, *per_seed]
    reach = [v >= critical - 1e-9 for v in values]  # rho lies on a grid of 6 / (n (n^2 - 1)): float rounding only
    verdict = HOLDS if all(reach) else FAILS if not any(reach) else UNRESOLVED
    return verdict, text + ("; the seeds disagree" if verdict == UNRESOLVED else "")


def within(a: Cell, paper: Optional[float], tolerance: float, digits: int = 2) -> tuple[str, str]:
    why = _spread(a)
    if paper is None:
        return UNRESOLVED, "the paper prints no number for this cell"
    if why:
        return UNRESOLVED, f"{fmt(a, digits)} vs the paper's {paper:g}: {why}"
    lo, hi = a.mean - a.std, a.mean + a.std
    verdict = (HOLDS if paper - tolerance <= lo and hi <= paper + tolerance
               else FAILS if hi < paper - tolerance or lo > paper + tolerance else UNRESOLVED)
    return verdict, f"{fmt(a, digits)} vs the paper's {paper:g} ± {tolerance:g}"


# ---- evaluation ---------------------------------------------------------------------------------------------
def _column_cells(results: dict[CellKey, Cell], table: Table, column: str) -> dict[str, Cell]:
    return {r.method: results[CellKey(table.id, column, r.method)] for r in table.rows
            if CellKey(table.id, column, r.method) in results}


def exists_at(paper: Paper, key: CellKey, scale: str) -> bool:
    """Whether a cell has a run at this scale at all: its column has a sweep here and (twin) the row is not one the
    twin cannot run. A cell outside the twin's time budget exists (--every-cell runs it)."""
    column = paper.table(key.table).column(key.column)
    if column.refs[scale] is None:
        return False
    return not (scale == "twin" and key.row is not None and key.row in column.twin_skip)


def combine(checks: list[Check]) -> Optional[str]:
    """The claim's verdict from its checks (module docstring); None when none ran."""
    ran = [c.verdict for c in checks if c.verdict is not None]
    if not ran:
        return None
    if FAILS in ran:
        return FAILS
    held = ran.count(HOLDS)
    if held == len(ran) and len(ran) == sum(c.counts for c in checks):
        return HOLDS
    return PARTIAL if held else UNRESOLVED


def evaluate(paper: Paper, claim: Claim, results: dict[CellKey, Cell], scale: str) -> ClaimResult:
    """The claim's verdict at `scale` from our cells (`results`: only the cells run at this scale)."""
    if scale not in claim.scales:
        return ClaimResult(claim, None, note=f"checked at --scale {' / '.join(claim.scales)} only")
    checks = []
    for (label, p), keys in zip(instances(claim), cells_of(claim)):
        table = paper.table(keys[0].table)
        column_cells = _column_cells(results, table, keys[0].column)
        if claim.rule == "spearman":  # its key names the column only: it reads every row run there
            needed = [keys[0]]
            missing = [] if column_cells else needed
        else:
            needed = keys if claim.rule in ("better", "within") else keys[:1]
            missing = [k for k in needed if k not in results]
        if missing:
            checks.append(Check(label, None, ", ".join(
                f"{k.table}/{k.column}/{k.row}" if k.row else f"{k.table}/{k.column}" for k in missing),
                all(exists_at(paper, k, scale) for k in needed)))
            continue
        if claim.rule == "better":
            verdict, text = better(results[keys[0]], results[keys[1]], table, float(p.get("margin", 0.0)))
        elif claim.rule == "rank":
            verdict, text = rank(keys[0].row, column_cells, table, int(p["rank"]),
                                 tuple(stated_ties(claim, keys[0].column)))
        elif claim.rule == "spearman":
            numbers = {r.method: paper_mean(table, keys[0].column, r.method) for r in table.rows}
            verdict, text = spearman(column_cells, {m: v for m, v in numbers.items() if v is not None})
        else:
            verdict, text = within(results[keys[0]], paper_mean(table, keys[0].column, keys[0].row),
                                   float(p["tolerance"]), table.digits)
        checks.append(Check(label, verdict, text))
    verdict = combine(checks)
    if verdict is None:
        return ClaimResult(claim, None, checks, note="its cells were not run at this scale")
    note = claim.twin_note if scale == "twin" and verdict != HOLDS else ""
    return ClaimResult(claim, verdict, checks, note)
