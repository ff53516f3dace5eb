"""A paper's qualitative claims as checks over its table cells, each reported HOLDS, FAILS or UNRESOLVED.

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
  HOLDS when the worst of it is <= k, FAILS when the best of it is > k, else UNRESOLVED.
- spearman (our ranking of a column's rows agrees with the paper's: Spearman's rho >= r): rho of our means against
  the paper's means, and rho of each seed's values (the seeds are paired: seed s is the same data split for every
  method). HOLDS when rho of the means and of every seed is >= r, FAILS when all are < r, else UNRESOLVED (the seeds
  disagree). Needs 3 rows and 2 seeds that every row has.
- within (A is within t of the paper's number, in the table's units): HOLDS when A's interval lies inside [paper - t,
  paper + t], FAILS when it lies wholly outside, else UNRESOLVED. Checked at --scale paper only: a twin's absolute
  numbers are not the paper's.

A claim over several columns (`columns:`) or rows (`rows:`) is one check per column or row: it HOLDS when every check
holds, FAILS when any fails, and is otherwise UNRESOLVED. A check whose cells were not run at this scale is left out
and named; a claim none of whose checks could run is reported as not checked at this scale.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from fl.reproduce.cells import Cell, CellKey
from fl.reproduce.spec import Claim, Paper, ReproduceError, Table

HOLDS, FAILS, UNRESOLVED = "HOLDS", "FAILS", "UNRESOLVED"
RULES = ("better", "rank", "spearman", "within")
CELL_FIELDS = ("table", "column", "row")


@dataclass
class Check:
    label: str            # which column / row this check is about
    verdict: Optional[str]  # None: its cells were not run at this scale
    detail: str


@dataclass
class ClaimResult:
    claim: Claim
    verdict: Optional[str]           # None: not checked at this scale
    checks: list[Check] = field(default_factory=list)
    note: str = ""                   # why it was not checked, or the known reason beside a twin's failure


# ---- the claim's cells --------------------------------------------------------------------------------------
def _instances(claim: Claim) -> list[tuple[str, dict]]:
    """(label, params with `column` / `row` filled in) for each column or row the claim is checked on."""
    p = claim.params
    if "columns" in p:
        return [(c, {**p, "column": c}) for c in p["columns"]]
    if "rows" in p:
        return [(r, {**p, "row": r}) for r in p["rows"]]
    return [("", p)]


def _cell(params: dict, which: str) -> CellKey:
    """The cell named by params[which] ({table, column, row}, missing fields from the claim's own)."""
    ref = params.get(which) or {}
    if isinstance(ref, str):
        ref = {"row": ref}
    return CellKey(*(ref.get(k, params.get(k)) for k in CELL_FIELDS))


def cells_of(claim: Claim) -> list[list[CellKey]]:
    """For each check of the claim, the cells it reads (spearman and rank: every row of the column)."""
    return [[_cell(p, w) for w in ("a", "b") if w in p] or [CellKey(p.get("table"), p.get("column"), p.get("row"))]
            for _, p in _instances(claim)]


def check_claim(paper: Paper, claim: Claim) -> None:
    """ReproduceError naming the claim and field when its rule is unknown or a cell it names does not exist."""
    where = f"{paper.path.name}: claims({claim.id})"
    if claim.rule not in RULES:
        raise ReproduceError(f"{where}.rule: {claim.rule!r} is not valid; choices: {', '.join(RULES)}")
    for key, kind in (("margin", (int, float)), ("tolerance", (int, float)), ("min_rho", (int, float)),
                      ("rank", int)):
        if key in claim.params and (not isinstance(claim.params[key], kind) or isinstance(claim.params[key], bool)):
            raise ReproduceError(f"{where}.{key}: expected a number")
    need = {"better": ("a", "b"), "rank": ("rank",), "spearman": ("min_rho",), "within": ("tolerance",)}[claim.rule]
    missing = [k for k in need if k not in claim.params]
    if missing:
        raise ReproduceError(f"{where}: rule {claim.rule} needs {', '.join(need)}; {missing[0]} is missing")
    for keys in cells_of(claim):
        for key in keys:
            try:
                table = paper.table(key.table)
            except ReproduceError:
                raise ReproduceError(f"{where}: table {key.table!r} is not one of "
                                     f"{', '.join(t.id for t in paper.tables)}") from None
            if key.column not in {c.id for c in table.columns}:
                raise ReproduceError(f"{where}: column {key.column!r} is not a column of {table.id}")
            if key.row is not None and key.row not in {r.method for r in table.rows}:
                raise ReproduceError(f"{where}: row {key.row!r} is not a row of {table.id}")
            if claim.rule in ("better", "within", "rank") and key.row is None:
                raise ReproduceError(f"{where}: rule {claim.rule} needs a row")
        if claim.rule == "better" and len({k.table for k in keys}) > 1:
            raise ReproduceError(f"{where}: a and b must be cells of one table (one unit, one direction)")


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


def rank(target: str, cells: dict[str, Cell], table: Table, k: int) -> tuple[str, str]:
    a, n = cells[target], table.digits
    why = _spread(a)
    others = {m: c for m, c in cells.items() if m != target and c.n}
    if why:
        return UNRESOLVED, f"{target} {fmt(a, n)}: {why}"
    thin = [m for m, c in others.items() if _spread(c)]
    sign = -1.0 if table.lower_is_better else 1.0
    by_mean = 1 + sum(sign * (c.mean - a.mean) > 0 for c in others.values())
    above = [m for m, c in others.items() if m not in thin and better(c, a, table)[0] == HOLDS]
    maybe = [m for m, c in others.items() if m in thin or better(a, c, table)[0] != HOLDS]
    best, worst = 1 + len(above), 1 + len(maybe)
    verdict = HOLDS if worst <= k else FAILS if best > k else UNRESOLVED
    text = (f"{target} {fmt(a, n)} ranks {by_mean} of {len(others) + 1} by mean; by the seed spreads {best}"
            + (f" to {worst}" if worst != best else "") + f" (needs {k} or better)")
    if above:
        text += f"; certainly above it: {', '.join(above)}"
    if verdict == UNRESOLVED:
        text += f"; overlapping it: {', '.join(m for m in maybe if m not in above)}"
    return verdict, text


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


def spearman(ours: dict[str, Cell], paper: dict[str, float], min_rho: float) -> tuple[str, str]:
    rows = [m for m in paper if m in ours and ours[m].n]
    if len(rows) < 3:
        return UNRESOLVED, f"{len(rows)} rows with both numbers; needs 3"
    rho = spearman_rho([ours[m].mean for m in rows], [paper[m] for m in rows])
    seeds = sorted(set.intersection(*(set(ours[m].seeds) for m in rows)), key=str)
    per_seed = [spearman_rho([ours[m].seeds[s] for m in rows], [paper[m] for m in rows]) for s in seeds]
    text = (f"rho = {rho:.2f} over {len(rows)} rows (means); per seed: "
            + (", ".join(f"{r:.2f}" for r in per_seed) or "none shared by every row") + f" (needs >= {min_rho:g})")
    if len(seeds) < 2:
        return UNRESOLVED, text + "; fewer than 2 seeds shared by every row"
    values = [rho, *per_seed]
    verdict = HOLDS if all(v >= min_rho for v in values) else FAILS if all(v < min_rho for v in values) else UNRESOLVED
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
def _column_cells(paper: Paper, results: dict[CellKey, Cell], table: Table, column: str) -> dict[str, Cell]:
    return {r.method: results[CellKey(table.id, column, r.method)] for r in table.rows
            if CellKey(table.id, column, r.method) in results}


def paper_value(table: Table, column: str, row: str) -> Optional[float]:
    value = table.row(row).paper.get(table.column(column).paper_column)
    return None if value is None else value[0]


def evaluate(paper: Paper, claim: Claim, results: dict[CellKey, Cell], scale: str) -> ClaimResult:
    """The claim's verdict at `scale` from our cells (`results`: only the cells run at this scale)."""
    if scale not in claim.scales:
        return ClaimResult(claim, None, note=f"checked at --scale {' / '.join(claim.scales)} only")
    checks = []
    for (label, p), keys in zip(_instances(claim), cells_of(claim)):
        table = paper.table(keys[0].table)
        column_cells = _column_cells(paper, results, table, keys[0].column)
        if claim.rule == "spearman":  # its key names the column only: it reads every row run there
            missing = [] if column_cells else [keys[0]]
        else:
            missing = [k for k in (keys if claim.rule in ("better", "within") else keys[:1]) if k not in results]
        if missing:
            checks.append(Check(label, None, ", ".join(
                f"{k.table}/{k.column}/{k.row}" if k.row else f"{k.table}/{k.column}" for k in missing)))
            continue
        if claim.rule == "better":
            verdict, text = better(results[keys[0]], results[keys[1]], table, float(p.get("margin", 0.0)))
        elif claim.rule == "rank":
            verdict, text = rank(keys[0].row, column_cells, table, int(p["rank"]))
        elif claim.rule == "spearman":
            numbers = {r.method: paper_value(table, keys[0].column, r.method) for r in table.rows}
            verdict, text = spearman(column_cells, {m: v for m, v in numbers.items() if v is not None},
                                     float(p["min_rho"]))
        else:
            verdict, text = within(results[keys[0]], paper_value(table, keys[0].column, keys[0].row),
                                   float(p["tolerance"]), table.digits)
        checks.append(Check(label, verdict, text))
    ran = [c.verdict for c in checks if c.verdict is not None]
    if not ran:
        return ClaimResult(claim, None, checks, note="its cells were not run at this scale")
    verdict = FAILS if FAILS in ran else HOLDS if all(v == HOLDS for v in ran) else UNRESOLVED
    note = claim.twin_note if scale == "twin" and verdict != HOLDS else ""
    return ClaimResult(claim, verdict, checks, note)
