"""A seed paper's headline tables and claims as data (fl/reproduce/papers/<paper>.yaml), read and checked.

A table has columns (the paper's settings) and rows (its methods). A column names, for each scale, the sweeps that
regenerate it: `real` (the paper's data) and `twin` (the synthetic twin on embedded data); each entry is a sweep file,
an optional `where` (the sweep points this column uses, e.g. one conf of a grid) and optional `overrides` (key=value
given to every run, e.g. a harder twin setting). A row selects its points in those sweeps (`arm: NAME`, or `points:`
one filter {key: value(s)} or a list of them, any of which selects a point) and holds the paper's numbers per column
as printed ([mean, std]; std null where none is printed). A column may borrow the paper's numbers of another
(`paper_column`): a harder twin of the same setting. A column without a sweep at a scale is not run there;
`twin_note` / `real_note` say why (no config). `twin_budget` (false, or the rows to run) keeps a column's twin
cells out of `--scale twin`'s time budget unless --every-cell; `twin_skip` (row -> why) names twin cells that cannot
run at all (a data error measured on the twin). A table's metric may be replaced for a column or a row. `baselines`
names the table's reference rows (FedAvg and Local where it has them, else the paper's own baseline rows): the
output's `Twin:` line sets their paper values beside the twin's (fl/reproduce/setting.py).

Every mistake is a ReproduceError naming the file and the field.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from fl.reproduce.claim_cells import check_claim
from fl.reproduce.paper import (
    PAPERS_DIR,
    SCALES,
    STATS,
    UNITS,
    Claim,
    Column,
    Paper,
    ReproduceError,
    Row,
    SweepRef,
    Table,
)


def available_papers() -> list[str]:
    return sorted(p.stem for p in PAPERS_DIR.glob("*.yaml"))


def load_paper(name: str) -> Paper:
    """A paper by name (fl/reproduce/papers/<name>.yaml), or a path to a paper file of the same format."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else PAPERS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ReproduceError(f"paper {name!r} is not known; choices: {', '.join(available_papers())} (or a path to "
                             "a paper's .yaml)")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ReproduceError(f"{path}: cannot parse YAML: {str(err).splitlines()[0]}") from None
    return parse_paper(doc, path)


# ---- parsing ---------------------------------------------------------------------------------------------
def _need(d: Any, key: str, kind, where: str):
    value = d.get(key) if isinstance(d, dict) else None
    if not isinstance(value, kind) or (isinstance(value, (str, list, dict)) and not value):
        raise ReproduceError(f"{where}.{key}: expected a non-empty {getattr(kind, '__name__', kind)}")
    return value


def _filter(d: Any, where: str) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict) or not all(isinstance(k, str) for k in d):
        raise ReproduceError(f"{where}: expected a mapping key -> value or list of values")
    return dict(d)


def _refs(value: Any, where: str) -> Optional[list[SweepRef]]:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ReproduceError(f"{where}: expected a list of {{sweep, where, overrides}} or null")
    refs = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        sweep = _need(entry, "sweep", str, at)
        extra = set(entry) - {"sweep", "where", "overrides"}
        if extra:
            raise ReproduceError(f"{at}: unknown field {sorted(extra)[0]!r}; fields: sweep, where, overrides")
        overrides = entry.get("overrides") or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise ReproduceError(f"{at}.overrides: expected a list of key=value")
        refs.append(SweepRef(sweep, _filter(entry.get("where"), f"{at}.where"), tuple(overrides)))
    return refs


def _number_pair(value: Any, where: str) -> tuple[Optional[float], Optional[float]]:
    ok = isinstance(value, list) and len(value) == 2 and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in value)
    if not ok or value[0] is None:
        raise ReproduceError(f"{where}: expected [mean, std] as printed (std null when none is printed)")
    return float(value[0]), None if value[1] is None else float(value[1])


def _column(d: Any, where: str) -> Column:
    cid = _need(d, "id", str, where)
    refs = {scale: _refs(d.get("real" if scale == "paper" else "twin"), f"{where}.{scale}") for scale in SCALES}
    notes = {scale: str(d.get(f"{'real' if scale == 'paper' else 'twin'}_note", "")) for scale in SCALES}
    extra = set(d) - {"id", "label", "real", "twin", "real_note", "twin_note", "paper_column", "metric", "twin_budget",
                      "twin_skip"}
    if extra:
        raise ReproduceError(f"{where}: unknown field {sorted(extra)[0]!r}")
    budget = d.get("twin_budget", True)
    if not isinstance(budget, bool) and not (isinstance(budget, list) and all(isinstance(m, str) for m in budget)):
        raise ReproduceError(f"{where}.twin_budget: expected true, false or a list of the rows run at twin scale")
    skip = _filter(d.get("twin_skip"), f"{where}.twin_skip")
    return Column(cid, str(d.get("label", cid)), refs, notes, str(d.get("paper_column", cid)), d.get("metric"),
                  budget, {k: str(v) for k, v in skip.items()})


def _row(d: Any, where: str, columns: set[str]) -> Row:
    method = _need(d, "method", str, where)
    if ("arm" in d) == ("points" in d):
        raise ReproduceError(f"{where}: give arm: NAME or points: {{key: value}} (one of the two)")
    given = [{"arm": d["arm"]}] if "arm" in d else d["points"]
    given = given if isinstance(given, list) else [given]
    points = [_filter(f, f"{where}.points") for f in given]
    paper = {}
    for cid, value in _filter(d.get("paper"), f"{where}.paper").items():
        if cid not in columns:
            raise ReproduceError(f"{where}.paper.{cid}: not a column of the table; columns: "
                                 f"{', '.join(sorted(columns))}")
        paper[cid] = _number_pair(value, f"{where}.paper.{cid}")
    extra = set(d) - {"method", "arm", "points", "paper", "note", "metric"}
    if extra:
        raise ReproduceError(f"{where}: unknown field {sorted(extra)[0]!r}")
    return Row(method, points, paper, str(d.get("note", "")), d.get("metric"))


def _table(d: Any, where: str) -> Table:
    tid = _need(d, "id", str, where)
    where = f"{where}({tid})"
    stat = d.get("stat", "final")
    if stat not in STATS:
        raise ReproduceError(f"{where}.stat: {stat!r} is not valid; choices: {', '.join(STATS)}")
    unit = d.get("unit", "percent")
    if unit not in UNITS:
        raise ReproduceError(f"{where}.unit: {unit!r} is not valid; choices: {', '.join(UNITS)}")
    select = d.get("select")
    if stat == "best_val" and not select:
        raise ReproduceError(f"{where}.stat: best_val needs select: val/<metric> (the validation metric whose best "
                             "round is read)")
    columns = [_column(c, f"{where}.columns[{i}]") for i, c in enumerate(_need(d, "columns", list, where))]
    ids = [c.id for c in columns]
    if len(set(ids)) != len(ids):
        raise ReproduceError(f"{where}.columns: an id is used twice")
    for c in columns:
        if c.paper_column not in ids:
            raise ReproduceError(f"{where}.columns({c.id}).paper_column: {c.paper_column!r} is not a column")
    rows = [_row(r, f"{where}.rows[{i}]", set(ids)) for i, r in enumerate(_need(d, "rows", list, where))]
    if len({r.method for r in rows}) != len(rows):
        raise ReproduceError(f"{where}.rows: a method is listed twice")
    for c in columns:
        unknown = [m for m in (c.twin_budget if isinstance(c.twin_budget, list) else []) + list(c.twin_skip)
                   if m not in {r.method for r in rows}]
        if unknown:
            raise ReproduceError(f"{where}.columns({c.id}): twin_budget / twin_skip name {unknown[0]!r}, not a row")
    baselines = d.get("baselines", [])
    if not isinstance(baselines, list) or any(b not in {r.method for r in rows} for b in baselines):
        raise ReproduceError(f"{where}.baselines: expected a list of the table's rows (the reference baselines a twin "
                             f"is calibrated on); rows: {', '.join(r.method for r in rows)}")
    seeds = d.get("paper_seeds")
    return Table(tid, _need(d, "caption", str, where), _need(d, "source", str, where), _need(d, "metric", str, where),
                 stat, unit, bool(d.get("lower_is_better", False)), select, seeds, str(d.get("paper_std", "")),
                 columns, rows, [str(n) for n in d.get("notes", [])], list(baselines))


def _claim(d: Any, where: str) -> Claim:
    cid = _need(d, "id", str, where)
    scales = tuple(d.get("scales", SCALES))
    if not scales or any(s not in SCALES for s in scales):
        raise ReproduceError(f"{where}({cid}).scales: expected a list of {', '.join(SCALES)}")
    params = {k: v for k, v in d.items() if k not in ("id", "text", "rule", "source", "scales", "twin_note")}
    return Claim(cid, _need(d, "text", str, where), _need(d, "rule", str, where), _need(d, "source", str, where),
                 params, scales, str(d.get("twin_note", "")).strip())


def parse_paper(doc: Any, path: Path) -> Paper:
    where = path.name
    if not isinstance(doc, dict):
        raise ReproduceError(f"{where}: expected a mapping with paper, title, tables, claims")
    extra = [k for k in doc if k not in ("paper", "title", "source", "tables", "claims") and not k.startswith("x-")]
    if extra:  # x-<name>: a YAML anchor shared by tables (FedDRM's columns)
        raise ReproduceError(f"{where}: unknown field {extra[0]!r}; fields: paper, title, source, tables, claims")
    tables = [_table(t, f"{where}: tables[{i}]") for i, t in enumerate(_need(doc, "tables", list, where))]
    if len({t.id for t in tables}) != len(tables):
        raise ReproduceError(f"{where}: a table id is used twice")
    claims = [_claim(c, f"{where}: claims[{i}]") for i, c in enumerate(doc.get("claims") or [])]
    if len({c.id for c in claims}) != len(claims):
        raise ReproduceError(f"{where}: a claim id is used twice")
    paper = Paper(_need(doc, "paper", str, where), _need(doc, "title", str, where), _need(doc, "source", str, where),
                  tables, claims, path)
    for claim in claims:
        check_claim(paper, claim)
    return paper
