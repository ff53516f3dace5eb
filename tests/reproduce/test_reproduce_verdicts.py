"""Every claim of the five papers judged on hand-made results (fl/reproduce/claims.py): it HOLDS where its cells say
so in every column (or row) it names, FAILS where one says otherwise, UNRESOLVED where the seed spreads overlap, a
column it names that was not run is not counted in its n, and a paper's tie is judged as a tie. (The regime and the
budget check are tests/reproduce/test_reproduce_causes.py's: here every column is in regime, and the same at twice
the budget.)"""
import copy
from pathlib import Path

import pytest

from fl.report.runs import Run
from fl.reproduce.cells import Cell, CellKey, make_cell
from fl.reproduce.claim_cells import cells_of, instances, paper_mean, stated_ties
from fl.reproduce.claims import FAILS, HOLDS, METHOD, OVERLAP, PARTIAL, UNRESOLVED, evaluate, exists_at
from fl.reproduce.render import Report, _claim_md, summary_lines
from fl.reproduce.spec import available_papers, load_paper, parse_paper


def cell(*values) -> Cell:
    """A cell of one value per seed (0, 1, ...), in the paper's units."""
    return make_cell([Run(f"r{i}", f"/r{i}", {"seed": i, "method.name": "m"}, {"final": {"acc": v}})
                      for i, v in enumerate(values)], "acc", "final", None, 1.0)


def claim_cases():
    for name in available_papers():
        paper = load_paper(name)
        for claim in paper.claims:
            for scale in claim.scales:
                yield pytest.param(name, claim.id, scale, id=f"{name}-{claim.id}-{scale}")


def made(paper, claim, scale, outcome: str) -> dict:
    """Results for every cell the claim reads that exists at `scale`, made so that each check's verdict is
    `outcome` (HOLDS, FAILS or UNRESOLVED)."""
    results = {}
    for (_, p), keys in zip(instances(claim), cells_of(claim)):
        table = paper.table(keys[0].table)
        sign = -1.0 if table.lower_is_better else 1.0
        column = keys[0].column
        rows = [CellKey(table.id, column, r.method) for r in table.rows]
        if claim.rule == "better":
            gap = sign * (2 * p.get("margin", 0.0) + 1.0)
            a, b = (0.0, 0.0) if outcome == UNRESOLVED else (gap, 0.0) if outcome == HOLDS else (0.0, gap)
            spread = 10 * abs(gap) if outcome == UNRESOLVED else 1e-3 * abs(gap)
            values = {keys[0]: cell(a, a + spread), keys[1]: cell(b, b + spread)}
        elif claim.rule == "rank":
            best = sign * 100.0
            target = {HOLDS: best, FAILS: -best, UNRESOLVED: 0.0}[outcome]
            values = {k: cell(0.0, 0.01 if outcome != UNRESOLVED else 300.0) for k in rows}
            values[keys[0]] = cell(target, target + (0.01 if outcome != UNRESOLVED else 300.0))
            if outcome == HOLDS:  # the paper's ties: equal to the target, judged as ties
                values.update({CellKey(table.id, column, m): values[keys[0]] for m in stated_ties(claim, column)})
        elif claim.rule == "spearman":
            numbers = {k: paper_mean(table, column, k.row) for k in rows}
            numbers = {k: v for k, v in numbers.items() if v is not None}
            flip = {HOLDS: (1.0, 1.0), FAILS: (-1.0, -1.0), UNRESOLVED: (10.0, -1.0)}[outcome]  # seed 1 disagrees
            values = {k: cell(flip[0] * v, flip[1] * v) for k, v in numbers.items()}
        else:
            number, tol = paper_mean(table, column, keys[0].row), p["tolerance"]
            centre, spread = {HOLDS: (number, 0.1 * tol), FAILS: (number + 10 * tol, 0.1 * tol),
                              UNRESOLVED: (number, 2 * tol)}[outcome]
            values = {keys[0]: cell(centre - spread, centre + spread)}
        results.update({k: v for k, v in values.items() if exists_at(paper, k, scale)})
    return results


def judge(paper, claim, results, scale):
    """The claim's verdict with every run the same at twice the twin's budget."""
    return evaluate(paper, claim, results, scale, doubled=results)


@pytest.mark.parametrize("name, claim_id, scale", list(claim_cases()))
def test_every_claim_holds_fails_is_partial_and_unresolved_on_hand_made_results(name, claim_id, scale):
    paper = copy.deepcopy(load_paper(name))
    for table in paper.tables:  # made() sets the cells' values, not the reference baselines' calibration
        table.baselines = []
    claim = next(c for c in paper.claims if c.id == claim_id)
    checks = list(zip(instances(claim), cells_of(claim)))
    runnable = [i for i, (_, keys) in enumerate(checks) if all(
        exists_at(paper, k, scale) for k in (keys if claim.rule in ("better", "within") else keys[:1]))]
    if not runnable:
        assert judge(paper, claim, made(paper, claim, scale, HOLDS), scale).verdict is None
        return
    for outcome in (HOLDS, FAILS, UNRESOLVED):
        result = judge(paper, claim, made(paper, claim, scale, outcome), scale)
        assert result.verdict == outcome, (outcome, [(c.label, c.verdict, c.detail) for c in result.checks])
        assert result.cause == {HOLDS: None, FAILS: METHOD, UNRESOLVED: OVERLAP}[outcome]
    if len(runnable) > 1:  # one column (or row) it names not run: not counted, HOLDS in n - 1 of n - 1
        results = made(paper, claim, scale, HOLDS)
        (_, _), keys = checks[runnable[0]]
        whole_column = claim.rule in ("rank", "spearman")  # they read every row of it
        results = {k: v for k, v in results.items() if not (
            k.table == keys[0].table and k.column == keys[0].column and (whole_column or k in keys))}
        result = judge(paper, claim, results, scale)
        n = len(runnable)
        assert result.verdict == HOLDS and result.label == f"HOLDS in {n - 1} of {n - 1}", result.label


def paper_doc(**claim) -> dict:
    """Columns c1, c2 with a twin sweep (exist at twin scale), c3 without one; rows A > B > C > D in the paper, and
    A ties B in c3."""
    columns = [{"id": c, "real": None, "twin": [{"sweep": "x.yaml"}]} for c in ("c1", "c2")]
    columns.append({"id": "c3", "real": [{"sweep": "x.yaml"}], "twin": None})
    rows = [{"method": m, "arm": m.lower(), "paper": {"c1": [v, 0.1], "c2": [v, 0.1], "c3": [c3, 0.1]}}
            for m, v, c3 in (("A", 90.0, 90.0), ("B", 80.0, 90.0), ("C", 70.0, 70.0), ("D", 60.0, 60.0))]
    table = {"id": "t", "caption": "c", "source": "s", "metric": "acc", "columns": columns, "rows": rows}
    return {"paper": "p", "title": "P", "source": "s", "tables": [table],
            "claims": [{"id": "x", "text": "x", "source": "s", **claim}]}


def k(column, row):
    return CellKey("t", column, row)


def test_n_counts_the_judged_checks_that_ran():
    p = parse_paper(paper_doc(rule="better", table="t", a="A", b="B", columns=["c1", "c2", "c3"]), Path("p.yaml"))
    apart = {k(c, r): cell(v, v + 0.1) for c in ("c1", "c2") for r, v in (("A", 9), ("B", 1))}
    result = judge(p, p.claims[0], apart, "twin")
    assert result.verdict == HOLDS and result.named == 2 and result.label == "HOLDS in 2 of 2"
    assert "paper scale only: c3" in _claim_md(result)[-1]  # c3 has no twin: named, not counted
    only_c1 = {key: c for key, c in apart.items() if key.column == "c1"}
    result = judge(p, p.claims[0], only_c1, "twin")  # c2 exists at twin scale but was not run (say, the budget)
    assert result.verdict == HOLDS and result.label == "HOLDS in 1 of 1"
    assert "  - not run at this scale (outside the twin's time budget; --every-cell runs it): c2" in _claim_md(result)
    overlapping = {**only_c1, k("c2", "A"): cell(1, 9), k("c2", "B"): cell(2, 8)}
    result = judge(p, p.claims[0], overlapping, "twin")
    assert (result.verdict, result.label, result.cause) == (PARTIAL, "HOLDS in 1 of 2", OVERLAP)
    failing = {**only_c1, k("c2", "A"): cell(1, 1.1), k("c2", "B"): cell(9, 9.1)}
    result = judge(p, p.claims[0], failing, "twin")
    assert (result.verdict, result.label, result.cause) == (FAILS, "FAILS in 1 of 2", METHOD)
    unresolved = {k("c1", "A"): cell(1, 9), k("c1", "B"): cell(2, 8)}
    result = judge(p, p.claims[0], unresolved, "twin")
    assert (result.verdict, result.label) == (UNRESOLVED, UNRESOLVED)  # no k of n: nothing held or failed
    report = Report(p, "twin", [0, 1], [], [judge(p, p.claims[0], overlapping, "twin")], [])
    assert "0 claims hold, 1 hold in part (HOLDS in k of n), 0 fail (cause: method)" in summary_lines(report)[0]


def test_a_paper_tie_is_judged_as_a_tie():
    """A ties B in c3 (90 each): overlapping B does not keep A from rank 1, B certainly above A does."""
    tied = parse_paper(paper_doc(rule="rank", table="t", row="A", rank=1, column="c3", ties={"c3": ["B"]}),
                       Path("p.yaml"))
    untied = parse_paper(paper_doc(rule="rank", table="t", row="A", rank=1, column="c3"), Path("p.yaml"))
    cells = {k("c3", "A"): cell(8, 9), k("c3", "B"): cell(8.5, 9.5), k("c3", "C"): cell(1, 2), k("c3", "D"): cell(1, 2)}
    result = evaluate(tied, tied.claims[0], cells, "paper")
    assert result.verdict == HOLDS and "tied with it in the paper" in result.checks[0].detail
    assert evaluate(untied, untied.claims[0], cells, "paper").verdict == UNRESOLVED
    equal = {**cells, k("c3", "B"): cell(8, 9)}  # the same numbers as A's, as in the paper
    assert evaluate(tied, tied.claims[0], equal, "paper").verdict == HOLDS
    above = {**cells, k("c3", "B"): cell(20, 21)}
    assert evaluate(tied, tied.claims[0], above, "paper").verdict == FAILS
