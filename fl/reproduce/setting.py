"""The `Twin:` line an output starts with: each column that ran, its twin beside the paper's setting (data,
clients, model and width, rounds x local work), both read from resolved configs (fl.config.load_config through
fl.sweep's planner: the runs' own, and the column's paper-scale sweep point), and its calibration: each table's
reference baselines (`baselines:` in the paper file: FedAvg and Local where the table has them, else the paper's own
baseline rows), the paper's value beside the output's own measured mean ± std. At --scale paper the line is `Runs:`
and names the runs' setting only: it is the paper's."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from fl.config import ConfigError
from fl.reproduce.cells import Cell, CellKey
from fl.reproduce.claim_cells import paper_mean
from fl.reproduce.compare import ColumnView
from fl.reproduce.paper import Column, Paper, ReproduceError, Table
from fl.reproduce.plan import Plan, cell_points
from fl.reproduce.regime import outside
from fl.sweep.runner import plan_points

NOWHERE = Path("/nonexistent-fl-reproduce")  # plan_points names run folders; nothing is written there


def describe(config: dict) -> str:
    """One run's setting in words, from its flattened resolved config."""
    get = config.get
    data = get("data.name")
    if data in ("embedded", "embedded_domains"):
        domains = get("data.embedded.num_domains")
        data = (f"generated {get('data.embedded.num_classes')}-class images ({get('data.embedded.samples_per_class')} "
                f"per class" + (f", {domains} domains" if domains else "") + ")")
    partition = get("data.partition.name")
    if partition == "dirichlet":
        partition = f"Dir({get('data.partition.alpha')})"
    elif get("data.partition.classes_per_client") and (partition == "classes" or get(
            "data.partition.within_domain") == "classes"):
        partition += f", {get('data.partition.classes_per_client')} classes each"
    clients = f"{get('data.num_clients')} clients" + (f" ({partition})" if partition else "")
    width = get("model.width")
    model = f"{get('model.name')}" + (f" width {width}" if width else "")
    local = (f"{get('trainer.local_steps')} local steps" if get("trainer.local_steps")
             else f"{get('trainer.local_epochs')} local epochs")
    return f"{data}, {clients}, {model}, {get('trainer.rounds')} rounds x {local}"


def paper_config(table: Table, column: Column, row, cache: dict) -> Optional[dict]:
    """The resolved config of the column's paper-scale sweep point for `row` (a variant column's base column's), or
    None when the paper's setting has no config."""
    base = column if column.refs["paper"] is not None else table.column(column.paper_column)
    found = cell_points(table, base.id, row, "paper", cache) if base.refs["paper"] is not None else []
    if not found:
        return None
    ref, index, point = found[0]
    try:
        return plan_points(cache[ref.sweep][0], [point], NOWHERE, [0], list(ref.overrides), indices=[index])[0].config
    except ConfigError as err:
        raise ReproduceError(f"{ref.sweep}: {err}") from None


def _calibration(table: Table, column: Column, results: dict[CellKey, Cell], word: str) -> list[str]:
    d = table.digits
    out = []
    for method in table.baselines:
        paper = paper_mean(table, column.id, method)
        cell = results.get(CellKey(table.id, column.id, method))
        if paper is None:
            continue
        if cell is None or not cell.n:
            out.append(f"{table.id} {method}: paper {paper:.{d}f}, {word} not run")
            continue
        spread = f" ± {cell.std:.{d}f}" if cell.std is not None else ""
        far = outside(table, paper, cell.mean)
        far = f", outside the paper's regime: {far}" if far else ""
        out.append(f"{table.id} {method}: paper {paper:.{d}f}, {word} {cell.mean:.{d}f}{spread} "
                   f"({cell.mean - paper:+.{d}f}{far})")
    return out


def setting_lines(paper: Paper, plan: Plan, views: list[ColumnView], results: dict[CellKey, Cell]) -> list[str]:
    """The `Twin:` (or `Runs:`) line and one line per column that ran."""
    twin = plan.scale == "twin"
    word = "twin" if twin else "ours"
    columns: dict[str, list[ColumnView]] = {}
    for view in views:
        if any(ln.ours is not None and ln.ours.n for ln in view.lines):
            columns.setdefault(view.column.id, []).append(view)
    if not columns:
        return [f"{'Twin' if twin else 'Runs'}: no cell ran at this scale."]
    head = ("Twin: each column's twin beside the paper's setting (both from resolved configs: the runs' own and the "
            "column's paper-scale sweep point), and its calibration on the reference baselines: the paper's value, "
            "the twin's mean ± std over its seeds and the difference, in the table's units." if twin else
            "Runs: each column's setting (from the runs' resolved configs) and the reference baselines: the paper's "
            "value, ours (mean ± std over the seeds) and the difference, in the table's units.")
    lines, cache = [head], {}
    for views_of in columns.values():
        view = views_of[0]
        table, column = view.table, view.column
        keys = [k for k in plan.cells if k.table == table.id and k.column == column.id]
        order = {m: i for i, m in enumerate([*table.baselines, *(r.method for r in table.rows)])}
        key = min(keys, key=lambda k: order[k.row])
        ours = describe(plan.cells[key][0].config)
        text = f"- {column.label}: {word}: {ours}"
        if twin:
            theirs = paper_config(table, column, table.row(key.row), cache)
            text += f"; the paper's: {describe(theirs) if theirs else 'no config of it here'}"
        calibration = [c for v in views_of for c in _calibration(v.table, v.column, results, word)]
        lines.append(text + (f". Calibration: {'; '.join(calibration)}." if calibration else
                             ". Calibration: no reference baseline in its tables."))
    return lines
