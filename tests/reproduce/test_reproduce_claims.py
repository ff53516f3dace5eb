"""fl.reproduce's claim rules on hand-made cells: each rule HOLDS, FAILS and is UNRESOLVED exactly where its definition
(fl/reproduce/claims.py) says, and a claim over several columns combines its checks."""
from pathlib import Path

import pytest

from fl.report.runs import Run
from fl.reproduce.cells import Cell, CellKey, make_cell
from fl.reproduce.claims import FAILS, HOLDS, UNRESOLVED, better, evaluate, rank, spearman, within
from fl.reproduce.paper import ReproduceError
from fl.reproduce.spearman import spearman_rho
from fl.reproduce.spec import load_paper, parse_paper


def cell(*values) -> Cell:
    """A cell of one value per seed (0, 1, ...), in the paper's units."""
    return make_cell([Run(f"r{i}", f"/r{i}", {"seed": i, "method.name": "m"}, {"final": {"acc": v}})
                      for i, v in enumerate(values)], "acc", "final", None, 1.0)


def paper_doc(**claim) -> dict:
    columns = [{"id": c, "real": None, "twin": None} for c in ("c1", "c2")]
    rows = [{"method": m, "arm": m.lower(), "paper": {"c1": [v, 0.1], "c2": [v, 0.1]}}
            for m, v in (("A", 90.0), ("B", 80.0), ("C", 70.0), ("D", 60.0))]
    table = {"id": "t", "caption": "c", "source": "s", "metric": "acc", "columns": columns, "rows": rows}
    loss = {**table, "id": "loss", "lower_is_better": True}
    return {"paper": "p", "title": "P", "source": "s", "tables": [table, loss],
            "claims": [{"id": "x", "text": "x", "source": "s", **claim}] if claim else []}


def table(lower=False):
    return parse_paper(paper_doc(), Path("p.yaml")).table("loss" if lower else "t")


def test_cells_are_mean_and_sample_std_over_seeds():
    c = cell(0.80, 0.84, 0.88)
    assert (c.mean, c.n) == (pytest.approx(0.84), 3) and c.std == pytest.approx(0.04)
    assert cell(0.5).std is None


@pytest.mark.parametrize("a, b, margin, verdict", [
    ((10, 12, 14), (5, 6, 7), 0, HOLDS),          # 12 ± 2 against 6 ± 1: [10, 14] lies above [5, 7]
    ((5, 6, 7), (10, 12, 14), 0, FAILS),          # below
    ((10, 12, 14), (9, 10, 11), 0, UNRESOLVED),   # [10, 14] and [9, 11] overlap
    ((10, 12, 14), (5, 6, 7), 2.9, HOLDS),        # nearest ends 3 apart: clears a margin of 2.9
    ((10, 12, 14), (5, 6, 7), 3.0, UNRESOLVED),   # ... not 3: the gap 6 ± 3 straddles it
    ((10, 12, 14), (5, 6, 7), 9.0, FAILS),        # even the farthest ends (9 apart) fall short of 9
    ((1, 1, 1), (1, 1, 1), 0, FAILS),             # equal points: A is not better
])
def test_better_compares_mean_plus_minus_std_intervals(a, b, margin, verdict):
    assert better(cell(*a), cell(*b), table(), margin)[0] == verdict


def test_better_reads_lower_as_better_on_a_loss_table_and_needs_two_seeds():
    assert better(cell(0.2, 0.2), cell(0.5, 0.5), table(lower=True))[0] == HOLDS
    assert better(cell(0.2, 0.2), cell(0.5, 0.5), table())[0] == FAILS
    verdict, text = better(cell(0.9), cell(0.1, 0.1), table())
    assert verdict == UNRESOLVED and "1 seed: no spread" in text


def test_rank_holds_fails_or_is_unresolved_by_the_spreads():
    t = table()
    apart = {"A": cell(9, 10, 11), "B": cell(5, 6, 7), "C": cell(1, 2, 3)}
    assert rank("A", apart, t, 1)[0] == HOLDS
    assert rank("B", apart, t, 1)[0] == FAILS          # A is certainly above it
    assert rank("B", apart, t, 2)[0] == HOLDS
    close = {"A": cell(9, 10, 11), "B": cell(8, 9.5, 11), "C": cell(1, 2, 3)}
    verdict, text = rank("A", close, t, 1)
    assert verdict == UNRESOLVED and "ranks 1 of 3 by mean; by the seed spreads 1 to 2" in text and "B" in text


def test_spearman_rho_and_its_verdict_per_seed():
    assert spearman_rho([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman_rho([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)   # ties share their mean rank
    paper = {"A": 90.0, "B": 80.0, "C": 70.0, "D": 60.0}
    same = {m: cell(v, v + 1) for m, v in paper.items()}
    verdict, text = spearman(same, paper)
    assert verdict == HOLDS and "one-sided p = 0.042" in text and "needs >= 1.000" in text  # 4 rows: 1/24
    reversed_ = {m: cell(-v, -v + 1) for m, v in paper.items()}
    assert spearman(reversed_, paper)[0] == FAILS
    # the means agree with the paper, seed 1's ranking does not: the seeds disagree
    mixed = {"A": cell(90, 50), "B": cell(80, 81), "C": cell(70, 71), "D": cell(60, 61)}
    verdict, text = spearman(mixed, paper)
    assert verdict == UNRESOLVED and "the seeds disagree" in text
    assert spearman({m: cell(v) for m, v in paper.items()}, paper)[0] == UNRESOLVED  # one seed
    # 3 rows: even a perfect agreement has p = 1/6, never significant at 5%
    three = {m: same[m] for m in ("A", "B", "C")}
    verdict, text = spearman(three, paper)
    assert verdict == UNRESOLVED and "no ranking of 3 rows is significant" in text


def test_within_the_papers_number():
    assert within(cell(63, 64, 65), 63.85, 2.0)[0] == HOLDS
    assert within(cell(50, 51, 52), 63.85, 2.0)[0] == FAILS
    assert within(cell(60, 62, 64), 63.85, 2.0)[0] == UNRESOLVED


def paper_with(**claim):
    return parse_paper(paper_doc(**claim), Path("p.yaml"))


def test_a_claim_over_columns_fails_when_one_column_fails_and_skips_columns_not_run():
    p = paper_with(rule="better", table="t", a="A", b="B", columns=["c1", "c2"])
    k = lambda c, r: CellKey("t", c, r)  # noqa: E731
    results = {k("c1", "A"): cell(9, 10, 11), k("c1", "B"): cell(1, 2, 3),
               k("c2", "A"): cell(1, 2, 3), k("c2", "B"): cell(9, 10, 11)}
    r = evaluate(p, p.claims[0], results, "twin", results)
    assert r.verdict == FAILS and [c.verdict for c in r.checks] == [HOLDS, FAILS]
    only_c1 = {key: v for key, v in results.items() if key.column == "c1"}
    r = evaluate(p, p.claims[0], only_c1, "twin", only_c1)
    assert r.verdict == HOLDS and r.checks[1].verdict is None and r.checks[1].detail == "t/c2/A, t/c2/B"
    assert evaluate(p, p.claims[0], {}, "twin").verdict is None


def test_a_spearman_claim_is_judged_from_its_columns_cells_and_skips_a_column_not_run():
    """A spearman claim names a column, no row: its check reads every row's cell of that column."""
    p = paper_with(rule="spearman", table="t", columns=["c1", "c2"])
    k = lambda r: CellKey("t", "c1", r)  # noqa: E731
    agreeing = {k("A"): cell(9, 10), k("B"): cell(7, 8), k("C"): cell(5, 6), k("D"): cell(3, 4)}
    r = evaluate(p, p.claims[0], agreeing, "twin", agreeing)
    assert r.verdict == HOLDS and r.checks[0].detail.startswith("rho = 1.00 over 4 rows")
    assert r.checks[1].verdict is None and r.checks[1].detail == "t/c2"
    reversed_ = {k("A"): cell(3, 4), k("B"): cell(5, 6), k("C"): cell(7, 8), k("D"): cell(9, 10)}
    assert evaluate(p, p.claims[0], reversed_, "twin", reversed_).verdict == FAILS
    one_seed = {key: cell(c.mean) for key, c in agreeing.items()}
    assert evaluate(p, p.claims[0], one_seed, "twin", one_seed).verdict == UNRESOLVED


def test_a_twin_note_is_shown_beside_a_twin_verdict_that_does_not_hold_and_scales_are_respected():
    p = paper_with(rule="better", table="t", a="A", b="B", column="c1", twin_note="measured: the twin is mild")
    k = lambda r: CellKey("t", "c1", r)  # noqa: E731
    failing = {k("A"): cell(1, 2, 3), k("B"): cell(9, 10, 11)}
    assert evaluate(p, p.claims[0], failing, "twin", failing).note == "measured: the twin is mild"
    assert evaluate(p, p.claims[0], failing, "paper").note == ""
    q = paper_with(rule="within", table="t", row="A", column="c1", tolerance=1.0, scales=["paper"])
    r = evaluate(q, q.claims[0], {k("A"): cell(89, 90, 91)}, "twin")
    assert r.verdict is None and "--scale paper only" in r.note


@pytest.mark.parametrize("claim, message", [
    ({"rule": "bigger", "table": "t", "a": "A", "b": "B", "column": "c1"}, "rule: 'bigger' is not valid"),
    ({"rule": "better", "table": "t", "a": "A", "column": "c1"}, "b is missing"),
    ({"rule": "better", "table": "t", "a": "Z", "b": "B", "column": "c1"}, "row 'Z' is not a row of t"),
    ({"rule": "rank", "table": "t", "row": "A", "rank": 1, "column": "c9"}, "column 'c9' is not a column of t"),
    ({"rule": "spearman", "table": "nope", "column": "c1"}, "table 'nope' is not one of"),
    ({"rule": "spearman", "table": "t", "min_rho": 0.5, "column": "c1"}, "'min_rho' is not one of rule spearman's"),
    ({"rule": "better", "table": "t", "a": "A", "b": "B", "column": "c1", "rank": 2}, "'rank' is not one of rule"),
    ({"rule": "rank", "table": "t", "row": "A", "rank": 1, "column": "c1", "ties": {"c1": ["B"]}},
     "B is not tied with A in the paper"),
    ({"rule": "rank", "table": "t", "row": "A", "rank": 1, "column": "c1", "ties": {"c2": ["B"]}},
     "'c2' is not a column the claim is checked on"),
    ({"rule": "better", "table": "t", "a": "A", "b": {"table": "loss", "row": "B"}, "column": "c1"},
     "a and b must be cells of one table"),
])
def test_malformed_claims_name_the_field(claim, message):
    with pytest.raises(ReproduceError, match=message):
        paper_with(**claim)


def _set(doc: dict, path: str, value) -> dict:
    """doc with the value at a dotted path (a number indexes a list) set; DELETE removes the key."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    at = doc
    for part in parents:
        at = at[part]
    if value is DELETE:
        del at[last]
    else:
        at[last] = value
    return doc


DELETE = object()
ROW0 = {"method": "A", "arm": "a", "paper": {"c1": [90.0, 0.1]}}


@pytest.mark.parametrize("path, value, message", [
    ("tables.0.stat", "median", r"tables\[0\]\(t\)\.stat: 'median' is not valid; choices"),
    ("tables.0.unit", "furlongs", r"\.unit: 'furlongs' is not valid; choices"),
    ("tables.0.stat", "best_val", "best_val needs select: val/<metric>"),
    ("tables.0.caption", DELETE, r"tables\[0\]\(t\)\.caption: expected a non-empty str"),
    ("tables.0.columns.1.id", "c1", r"\.columns: an id is used twice"),
    ("tables.0.columns.1.paper_column", "zz", r"columns\(c2\)\.paper_column: 'zz' is not a column"),
    ("tables.0.columns.1.colour", "red", r"columns\[1\]: unknown field 'colour'"),
    ("tables.0.columns.1.twin_budget", 3, "twin_budget: expected true, false or a list of the rows"),
    ("tables.0.columns.1.twin_budget", ["Z"], r"columns\(c2\): twin_budget / twin_skip name 'Z', not a row"),
    ("tables.0.columns.1.twin", "sweeps/x.yaml", r"columns\[1\]\.twin: expected a list of \{sweep, where, overrides"),
    ("tables.0.columns.1.twin", [{"sweep": "s.yaml", "conf": "x"}], "twin\\[0\\]: unknown field 'conf'; fields: sweep"),
    ("tables.0.columns.1.twin", [{"sweep": "s.yaml", "overrides": ["seed"]}], "overrides: expected a list of key="),
    ("tables.0.columns.1.twin", [{"sweep": "s.yaml", "where": ["x"]}], r"\.where: expected a mapping key -> value"),
    ("tables.0.columns.1.real", [{"where": {}}], r"\.paper\[0\]\.sweep: expected a non-empty str"),
    ("tables.0.rows.0", {**ROW0, "points": {"x": 1}}, r"rows\[0\]: give arm: NAME or points"),
    ("tables.0.rows.0", {**ROW0, "paper": {"c9": [1.0, 0.1]}}, r"rows\[0\]\.paper\.c9: not a column of the table"),
    ("tables.0.rows.0", {**ROW0, "paper": {"c1": [None, 0.1]}}, r"paper\.c1: expected \[mean, std\] as printed"),
    ("tables.0.rows.0", {**ROW0, "colour": "red"}, r"rows\[0\]: unknown field 'colour'"),
    ("tables.0.rows.1.method", "A", r"\.rows: a method is listed twice"),
    ("tables.0.baselines", ["Z"], r"\.baselines: expected a list of the table's rows .*rows: A, B, C, D"),
    ("tables.1.id", "t", "a table id is used twice"),
    ("extra", 1, "unknown field 'extra'; fields: paper, title, source, tables, claims"),
    ("title", "", "p.yaml.title: expected a non-empty str"),
])
def test_malformed_tables_name_the_field(path, value, message):
    """A paper file's mistakes stop it in one line naming where (fl/reproduce/spec.py), before anything runs."""
    with pytest.raises(ReproduceError, match=message) as err:
        parse_paper(_set(paper_doc(), path, value), Path("p.yaml"))
    assert "\n" not in str(err.value)


def test_malformed_papers_and_claim_lists_name_the_problem(tmp_path):
    doc = paper_doc(rule="better", table="t", a="A", b="B", column="c1")
    for broken, message in ((["a list"], "expected a mapping with paper, title, tables, claims"),
                            ({**doc, "claims": doc["claims"] * 2}, "a claim id is used twice"),
                            ({**doc, "claims": [{**doc["claims"][0], "scales": ["huge"]}]},
                             r"claims\[0\]\(x\)\.scales: expected a list of")):
        with pytest.raises(ReproduceError, match=message):
            parse_paper(broken, Path("p.yaml"))
    with pytest.raises(ReproduceError, match="paper 'nope' is not known; choices: fedacd, feddrm"):
        load_paper("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("paper: [unclosed\n")
    with pytest.raises(ReproduceError, match=f"{bad}: cannot parse YAML: "):
        load_paper(str(bad))


def test_a_variant_column_equal_to_its_base_seed_for_seed_says_so():
    """A harder-twin column (paper_column = another column) whose every cell equals the base column's, seed for seed,
    is flagged under its table: its overrides changed nothing (FedDRM's level=high on 8 clients was the default)."""
    from fl.reproduce.compare import column_view
    doc = paper_doc()
    doc["tables"][0]["columns"].append({"id": "c1_hard", "paper_column": "c1", "real": None, "twin": None})
    t = parse_paper(doc, Path("p.yaml")).table("t")
    k = lambda c, r: CellKey("t", c, r)  # noqa: E731
    base = {k("c1", m): cell(v, v + 1) for m, v in (("A", 9), ("B", 7), ("C", 5))}
    same = {**base, **{k("c1_hard", key.row): c for key, c in base.items()}}
    view = column_view(t, t.column("c1_hard"), same, {})
    assert view.same_as == "c1" and "changed no run's result" in view.notes[-1]
    other = {**same, k("c1_hard", "A"): cell(9, 11)}
    assert column_view(t, t.column("c1_hard"), other, {}).same_as is None
    assert column_view(t, t.column("c1"), same, {}).same_as is None  # a base column is nobody's variant
