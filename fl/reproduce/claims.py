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

A claim over several columns (`columns:`) or rows (`rows:`) is one check per column or row. A check that ran is
judged only where the reading is about the method, not the twin:
- regime: its columns are in the paper's regime (fl/reproduce/regime.py: the table's reference baselines near the
  paper's values); elsewhere it is NOT JUDGED with cause `regime`;
- budget (twin scale): the judged cells of one seed are also run at twice the twin's training rounds
  (fl/reproduce/plan.py); each cell moved by that seed's change, its spread kept, the rule is applied again. A check
  whose verdict differs there (or whose run there is missing) is budget-limited: NOT JUDGED with cause `budget`.
n counts the judged checks; a check not run (outside the twin's time budget: --every-cell) or with no cell at this
scale (paper scale only) is named and not counted. The claim FAILS (cause `method`, printed `FAILS in k of n`) when
any judged check fails, HOLDS when all n hold, is PARTIAL (`HOLDS in k of n`, k < n) when some hold and the rest are
UNRESOLVED, and is UNRESOLVED otherwise (both with cause `overlap`); with no judged check it is NOT JUDGED (cause
`regime` or `budget`), and with none run, not checked at this scale.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fl.reproduce.cells import Cell, CellKey
from fl.reproduce.claim_cells import cells_of, instances, paper_mean, read_by, stated_ties
from fl.reproduce.paper import Claim, Paper, Table
from fl.reproduce.regime import column_regime
from fl.reproduce.spearman import critical_rho, p_value, spearman_rho

HOLDS, FAILS, UNRESOLVED, PARTIAL, NOT_JUDGED = "HOLDS", "FAILS", "UNRESOLVED", "PARTIAL", "NOT JUDGED"
REGIME, BUDGET, OVERLAP, METHOD = "regime", "budget", "overlap", "method"  # why a verdict is short of HOLDS
CAUSE_WORDS = {
    REGIME: "not judged: the twin is outside the paper's regime there",
    BUDGET: "not judged: the verdict changes at twice the twin's training budget, or was not run there",
    OVERLAP: "the seed spreads overlap (or a cell has one seed)",
    METHOD: "in the paper's regime, the same at twice the twin's budget, the spreads apart: the method fails on the "
            "twin"}


@dataclass
class Check:
    label: str              # which column / row this check is about
    verdict: Optional[str]  # None: its cells were not run at this scale
    detail: str
    counts: bool = True     # whether a cell of it exists at this scale (False: paper scale only)
    regime: bool = True     # its columns are in the paper's regime (fl/reproduce/regime.py)
    regime_why: str = ""
    budget: Optional[str] = None  # twin scale: "stable", "limited" (its verdict differs at twice the budget) or
                                  # "missing" (a run at twice the budget is); None at paper scale
    doubled_detail: str = ""      # its numbers at twice the budget

    @property
    def cause(self) -> Optional[str]:
        """Why a check that ran is not judged (REGIME, BUDGET), or None."""
        if not self.verdict:
            return None
        if not self.regime:
            return REGIME
        return BUDGET if self.budget in ("limited", "missing") else None


@dataclass
class ClaimResult:
    claim: Claim
    verdict: Optional[str]           # None: not checked at this scale
    checks: list[Check] = field(default_factory=list)
    note: str = ""                   # why it was not checked, or the known reason beside a twin's failure
    cause: Optional[str] = None      # REGIME, BUDGET, OVERLAP or METHOD when the verdict is short of HOLDS

    @property
    def judged(self) -> list[Check]:
        return [c for c in self.checks if c.verdict and c.cause is None]

    @property
    def held(self) -> int:
        return sum(c.verdict == HOLDS for c in self.judged)

    @property
    def failed(self) -> int:
        return sum(c.verdict == FAILS for c in self.judged)

    @property
    def named(self) -> int:
        """n: the checks that ran and are judged at this scale."""
        return len(self.judged)

    @property
    def label(self) -> str:
        """The verdict as printed, with k of n where the claim has several checks: `HOLDS in 2 of 3`, `FAILS in 1 of
        3` (PARTIAL is `HOLDS in k of n` with k < n), UNRESOLVED, `NOT JUDGED (regime)`."""
        if self.verdict is None:
            return "NOT CHECKED"
        if self.verdict == NOT_JUDGED:
            return f"NOT JUDGED ({self.cause})"
        word = HOLDS if self.verdict == PARTIAL else self.verdict
        if len(self.checks) == 1 or word == UNRESOLVED:
            return word
        return f"{word} in {self.failed if word == FAILS else self.held} of {self.named}"


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


def at_double(cell: Cell, doubled: Optional[Cell]) -> Optional[Cell]:
    """The cell at twice the twin's training budget: the change one seed's run made there (the doubled budget runs
    one seed) applied to every seed, the seed spread kept. None when that run is missing."""
    shared = [s for s in (doubled.seeds if doubled else {}) if s in cell.seeds]
    if not shared or cell.mean is None:
        return None
    change = doubled.seeds[shared[0]] - cell.seeds[shared[0]]
    return Cell(cell.mean + change, cell.std, cell.n, {s: v + change for s, v in cell.seeds.items()})


def _judge(claim: Claim, table: Table, keys: list[CellKey], p: dict, results: dict[CellKey, Cell]) -> tuple[str, str]:
    """One check's verdict and numbers by the claim's rule, over `results`."""
    if claim.rule == "better":
        return better(results[keys[0]], results[keys[1]], table, float(p.get("margin", 0.0)))
    if claim.rule == "rank":
        return rank(keys[0].row, _column_cells(results, table, keys[0].column), table, int(p["rank"]),
                    tuple(stated_ties(claim, keys[0].column)))
    if claim.rule == "spearman":
        numbers = {r.method: paper_mean(table, keys[0].column, r.method) for r in table.rows}
        return spearman(_column_cells(results, table, keys[0].column),
                        {m: v for m, v in numbers.items() if v is not None})
    return within(results[keys[0]], paper_mean(table, keys[0].column, keys[0].row), float(p["tolerance"]),
                  table.digits)


def _budget(claim, table, keys, p, results, doubled) -> tuple[Optional[str], str]:
    """The check at twice the twin's budget: its verdict there (None: a doubled run is missing) and its words, led by
    that verdict."""
    read = [k for k in read_by(claim, table, keys) if k in results and results[k].n]
    moved = {k: at_double(results[k], doubled.get(k)) for k in read}
    if any(c is None for c in moved.values()):
        missing = [k.row for k, c in moved.items() if c is None]
        return None, f"not run at twice the twin's budget: {', '.join(missing)}"
    verdict, text = _judge(claim, table, keys, p, {**results, **moved})
    return verdict, f"{verdict} at twice the budget: {text}"


def evaluate(paper: Paper, claim: Claim, results: dict[CellKey, Cell], scale: str,
             doubled: Optional[dict[CellKey, Cell]] = None) -> ClaimResult:
    """The claim's verdict at `scale` from our cells (`results`: only the cells run at this scale), each check judged
    only in the paper's regime (fl/reproduce/regime.py) and, at twin scale, only where it does not change at twice
    the twin's training budget (`doubled`: the cells of one seed run so; None: not run)."""
    if scale not in claim.scales:
        return ClaimResult(claim, None, note=f"checked at --scale {' / '.join(claim.scales)} only")
    checks = []
    for (label, p), keys in zip(instances(claim), cells_of(claim)):
        table = paper.table(keys[0].table)
        if claim.rule == "spearman":  # its key names the column only: it reads every row run there
            needed = [keys[0]]
            missing = [] if _column_cells(results, table, keys[0].column) else needed
        else:
            needed = keys if claim.rule in ("better", "within") else keys[:1]
            missing = [k for k in needed if k not in results]
        if missing:
            checks.append(Check(label, None, ", ".join(
                f"{k.table}/{k.column}/{k.row}" if k.row else f"{k.table}/{k.column}" for k in missing),
                all(exists_at(paper, k, scale) for k in needed)))
            continue
        verdict, text = _judge(claim, table, keys, p, results)
        check = Check(label, verdict, text)
        regimes = [column_regime(paper.table(k.table), k.column, results) for k in dict.fromkeys(
            CellKey(k.table, k.column, None) for k in keys)]
        check.regime = not any(r is False for r, _ in regimes)
        check.regime_why = "; ".join(why for _, why in regimes if why)
        if scale == "twin":
            at_twice, check.doubled_detail = _budget(claim, table, keys, p, results, doubled or {})
            check.budget = "missing" if at_twice is None else "stable" if at_twice == verdict else "limited"
        checks.append(check)
    return judge_claim(claim, checks, scale)


def judge_claim(claim: Claim, checks: list[Check], scale: str) -> ClaimResult:
    """The claim's verdict and cause from its checks (module docstring)."""
    ran = [c for c in checks if c.verdict]
    if not ran:
        return ClaimResult(claim, None, checks, note="its cells were not run at this scale")
    judged = [c for c in ran if c.cause is None]
    note = claim.twin_note if scale == "twin" else ""
    if not judged:
        cause = REGIME if any(c.cause == REGIME for c in ran) else BUDGET
        return ClaimResult(claim, NOT_JUDGED, checks, note, cause)
    verdicts = [c.verdict for c in judged]
    if FAILS in verdicts:
        return ClaimResult(claim, FAILS, checks, note, METHOD)
    if all(v == HOLDS for v in verdicts):
        return ClaimResult(claim, HOLDS, checks)
    return ClaimResult(claim, PARTIAL if HOLDS in verdicts else UNRESOLVED, checks, note, OVERLAP)
