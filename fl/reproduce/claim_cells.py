"""Which table cells a claim reads, and the check that a paper file's claim names a known rule, cells that exist and
ties the paper does print (fl/reproduce/spec.py runs it on every claim it reads; fl/reproduce/claims.py judges them).

A claim over several columns (`columns:`) or rows (`rows:`) is one check per column or row; otherwise one check.
`a` / `b` (rule better) name a row, or a cell {table, column, row} whose missing fields are the claim's own.
`ties` (rule rank) maps a column to the rows the paper prints with exactly the target's number there: the claim
stands in the paper only as a tie with them, and is judged so (fl/reproduce/claims.py, rank)."""
from __future__ import annotations

from fl.reproduce.cells import CellKey
from fl.reproduce.paper import Claim, Paper, ReproduceError, Table

RULES = ("better", "rank", "spearman", "within")
CELL_FIELDS = ("table", "column", "row")
NEEDS = {"better": ("a", "b"), "rank": ("row", "rank"), "spearman": (), "within": ("row", "tolerance")}
FIELDS = {"better": {"margin"}, "rank": {"ties"}, "spearman": set(), "within": set()}
WHERE = {"table", "column", "columns", "row", "rows"}


def instances(claim: Claim) -> list[tuple[str, dict]]:
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
            for _, p in instances(claim)]


def read_by(claim: Claim, table: Table, keys: list[CellKey]) -> list[CellKey]:
    """The cells one check of the claim reads: its own (`keys`, from cells_of), or for rank and spearman every row of
    the column."""
    if claim.rule in ("rank", "spearman"):
        return [CellKey(table.id, keys[0].column, r.method) for r in table.rows]
    return keys


def judged_cells(paper: Paper, scale: str) -> set[CellKey]:
    """Every cell a claim checked at `scale` reads."""
    return {k for claim in paper.claims if scale in claim.scales for keys in cells_of(claim)
            for k in read_by(claim, paper.table(keys[0].table), keys)}


def paper_mean(table: Table, column: str, row: str):
    """The paper's mean of a cell (a variant column reads its paper_column's), or None where none is printed."""
    value = table.row(row).paper.get(table.column(column).paper_column)
    return None if value is None else value[0]


def check_claim(paper: Paper, claim: Claim) -> None:
    """ReproduceError naming the claim and field when its rule is unknown, a field is not the rule's, a cell it names
    does not exist or a tie it states is not one in the paper."""
    where = f"{paper.path.name}: claims({claim.id})"
    if claim.rule not in RULES:
        raise ReproduceError(f"{where}.rule: {claim.rule!r} is not valid; choices: {', '.join(RULES)}")
    allowed = WHERE | set(NEEDS[claim.rule]) | FIELDS[claim.rule]
    extra = sorted(set(claim.params) - allowed)
    if extra:
        why = (": the threshold is Spearman's critical value for the rows that ran (fl/reproduce/spearman.py)"
               if extra[0] == "min_rho" else "")
        raise ReproduceError(f"{where}: field {extra[0]!r} is not one of rule {claim.rule}'s "
                             f"({', '.join(sorted(allowed))}){why}")
    for key, kind in (("margin", (int, float)), ("tolerance", (int, float)), ("rank", int)):
        if key in claim.params and (not isinstance(claim.params[key], kind) or isinstance(claim.params[key], bool)):
            raise ReproduceError(f"{where}.{key}: expected a number")
    missing = [k for k in NEEDS[claim.rule] if k not in claim.params]
    if missing:
        raise ReproduceError(f"{where}: rule {claim.rule} needs {', '.join(NEEDS[claim.rule])}; {missing[0]} is "
                             "missing")
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
    if "ties" in claim.params:
        _check_ties(paper, claim, where)


def _check_ties(paper: Paper, claim: Claim, where: str) -> None:
    ties = claim.params["ties"]
    columns = {keys[0].column for keys in cells_of(claim)}
    if not isinstance(ties, dict) or not all(isinstance(v, list) for v in ties.values()):
        raise ReproduceError(f"{where}.ties: expected a mapping column -> the rows tied with {claim.params['row']!r}")
    table = paper.table(claim.params["table"])
    target = claim.params["row"]
    for column, rows in ties.items():
        if column not in columns:
            raise ReproduceError(f"{where}.ties: {column!r} is not a column the claim is checked on")
        for row in rows:
            if row not in {r.method for r in table.rows}:
                raise ReproduceError(f"{where}.ties.{column}: row {row!r} is not a row of {table.id}")
            mine, theirs = paper_mean(table, column, target), paper_mean(table, column, row)
            if mine is None or mine != theirs:
                raise ReproduceError(f"{where}.ties.{column}: {row} is not tied with {target} in the paper "
                                     f"({theirs} against {mine})")


def stated_ties(claim: Claim, column: str) -> list[str]:
    return list((claim.params.get("ties") or {}).get(column, []))
