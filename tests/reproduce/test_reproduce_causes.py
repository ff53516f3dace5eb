"""Why a verdict falls short of HOLDS (fl/reproduce/claims.py, fl/reproduce/regime.py): a check on a column outside the
paper's regime, or whose verdict changes at twice the twin's training budget, is NOT JUDGED and not counted; a
failure in regime and stable under the doubled budget is the method's; the plan runs the judged cells' first seed at
twice the rounds."""
import json
from pathlib import Path

import pytest

from fl.report.runs import Run
from fl.reproduce.cells import Cell, CellKey, make_cell
from fl.reproduce.claims import (
    BUDGET,
    FAILS,
    HOLDS,
    METHOD,
    NOT_JUDGED,
    REGIME,
    at_double,
    evaluate,
)
from fl.reproduce.regime import column_regime, outside
from fl.reproduce.render import _claim_md
from fl.reproduce.spec import parse_paper


def cell(*values) -> Cell:
    """A cell of one value per seed (0, 1, ...), in the paper's units."""
    return make_cell([Run(f"r{i}", f"/r{i}", {"seed": i, "method.name": "m"}, {"final": {"acc": v}})
                      for i, v in enumerate(values)], "acc", "final", None, 1.0)


def paper(unit="percent", **claim):
    """Table t (reference baseline B) over columns c1, c2, both with a twin; the paper: A 60, B 50 in each."""
    columns = [{"id": c, "real": None, "twin": [{"sweep": "x.yaml"}]} for c in ("c1", "c2")]
    rows = [{"method": m, "arm": m.lower(), "paper": {"c1": [v, 0.1], "c2": [v, 0.1]}}
            for m, v in (("A", 60.0), ("B", 50.0))]
    table = {"id": "t", "caption": "c", "source": "s", "metric": "acc", "unit": unit, "baselines": ["B"],
             "columns": columns, "rows": rows}
    where = {} if "columns" in claim else {"column": "c1"}
    claims = [{"id": "x", "text": "A beats B", "source": "s", "rule": "better", "table": "t", "a": "A", "b": "B",
               **where, **claim}]
    return parse_paper({"paper": "p", "title": "P", "source": "s", "tables": [table], "claims": claims},
                       Path("p.yaml"))


def k(column, row):
    return CellKey("t", column, row)


@pytest.mark.parametrize("unit, paper_value, ours, far", [
    ("percent", 50.0, 59.9, ""),                      # 9.9 points: inside
    ("percent", 50.0, 61.0, "11.0 points from it"),
    ("fraction", 0.50, 0.39, "11.0 points from it"),  # fractions are points times 100
    ("raw", 4.99, 2.6, ""),                           # a factor 1.9: inside
    ("raw", 4.99, 1.66, "a factor 3.0 from it"),      # FedACD's twin KL against the paper's (issue 46)
    ("raw", 1.0, -1.0, "not of the same sign"),
    ("raw", 0.0, 0.0, ""),
])
def test_the_regime_is_points_for_accuracies_and_a_factor_for_raw_units(unit, paper_value, ours, far):
    assert outside(paper(unit).table("t"), paper_value, ours) == far


def test_a_columns_regime_is_its_reference_baselines():
    t = paper().table("t")
    assert column_regime(t, "c1", {k("c1", "B"): cell(45, 47)}) == (True, "")
    assert column_regime(t, "c1", {k("c1", "B"): cell(30, 32), k("c2", "B"): cell(45, 47)}) == (
        False, "B 31.0 against the paper's 50.0, 19.0 points from it")
    assert column_regime(t, "c1", {k("c1", "A"): cell(30, 32)}) == (None, "")  # no reference baseline ran


def test_the_doubled_budget_moves_each_seed_by_the_first_seeds_change_and_keeps_the_spread():
    one, twice = cell(10.0, 12.0, 14.0), cell(15.0)  # seed 0: 10 -> 15
    moved = at_double(one, twice)
    assert (moved.mean, moved.std, moved.n, moved.seeds) == (17.0, one.std, 3, {0: 15.0, 1: 17.0, 2: 19.0})
    assert at_double(one, None) is None and at_double(one, Cell()) is None


def test_a_check_outside_the_regime_is_not_judged_and_not_counted():
    p = paper(columns=["c1", "c2"])
    results = {k("c1", "A"): cell(58, 60), k("c1", "B"): cell(48, 50),   # B in regime, A above it
               k("c2", "A"): cell(1, 2), k("c2", "B"): cell(20, 22)}     # B 29 points from the paper: A below it
    r = evaluate(p, p.claims[0], results, "twin", results)
    assert (r.verdict, r.label, r.cause) == (HOLDS, "HOLDS in 1 of 1", None)
    assert [c.cause for c in r.checks] == [None, REGIME]
    assert "c2: NOT JUDGED (regime: B 21.0 against the paper's 50.0, 29.0 points from it); as read: FAILS" in "\n".join(
        _claim_md(r))
    only_c2 = {key: c for key, c in results.items() if key.column == "c2"}
    r = evaluate(p, p.claims[0], only_c2, "twin", only_c2)
    assert (r.verdict, r.label, r.cause) == (NOT_JUDGED, "NOT JUDGED (regime)", REGIME)


def test_a_verdict_that_changes_at_twice_the_budget_is_budget_limited_and_a_stable_failure_is_the_methods():
    p = paper(column="c1")
    behind = {k("c1", "A"): cell(40, 41, 42), k("c1", "B"): cell(48, 49, 50)}  # A fails to beat B
    caught_up = {k("c1", "A"): cell(55.0), k("c1", "B"): cell(49.0)}           # seed 0 at twice the rounds: A ahead
    r = evaluate(p, p.claims[0], behind, "twin", caught_up)
    assert (r.verdict, r.cause) == (NOT_JUDGED, BUDGET) and r.checks[0].budget == "limited"
    assert "NOT JUDGED (budget: HOLDS at twice the budget: 56.0 ± 1.0 (n=3) vs 50.0 ± 1.0 (n=3)" in _claim_md(r)[2]
    still_behind = {k("c1", "A"): cell(41.0), k("c1", "B"): cell(49.5)}
    r = evaluate(p, p.claims[0], behind, "twin", still_behind)
    assert (r.verdict, r.label, r.cause) == (FAILS, FAILS, METHOD) and r.checks[0].budget == "stable"
    assert _claim_md(r)[2].endswith("the same at twice the twin's budget")
    r = evaluate(p, p.claims[0], behind, "twin", {k("c1", "B"): cell(49.5)})  # A's run at twice the budget failed
    assert (r.verdict, r.cause, r.checks[0].budget) == (NOT_JUDGED, BUDGET, "missing")
    assert "not run at twice the twin's budget: A" in r.checks[0].doubled_detail
    r = evaluate(p, p.claims[0], behind, "paper")  # the paper's own budget: no check
    assert (r.verdict, r.cause, r.checks[0].budget) == (FAILS, METHOD, None)


def test_the_plan_runs_the_judged_cells_first_seed_at_twice_the_rounds(tmp_path):
    from fl.config import load_config
    from fl.reproduce.cli import make_plan, parse_args
    from fl.reproduce.spec import load_paper
    from tests.reproduce.test_reproduce_cli import tiny_paper

    file = tiny_paper(tmp_path)

    def plan(*options):
        return make_plan(load_paper(file), parse_args([file, "--seeds", "3", "--out", str(tmp_path / "o"), *options]))
    twin = plan()
    rounds = load_config(["conf=quickstart"]).trainer.rounds
    assert set(twin.doubled) == {CellKey("t1", "quick", "FedAvg"), CellKey("t1", "quick", "FedProx")}
    for key, (job,) in twin.doubled.items():
        own = next(j for j in twin.cells[key] if j.seed == 0)
        assert (job.seed, job.config["trainer.rounds"], own.config["trainer.rounds"]) == (0, 2 * rounds, rounds)
        assert {**job.config, "trainer.rounds": rounds} == own.config  # nothing else differs
        assert job.run_dir.parent != own.run_dir.parent and job in twin.jobs
    assert plan("--scale", "paper").doubled == {} and plan("--baselines").doubled == {}


def test_the_output_names_each_cause_counts_them_and_links_no_file(tmp_path, capsys):
    from fl.reproduce.cli import main
    from tests.reproduce.test_reproduce_cli import fake_finished_runs, tiny_paper

    file = tiny_paper(tmp_path)
    # FedProx ahead of FedAvg at the twin's budget, behind it at twice the rounds: budget-limited
    fake_finished_runs(tmp_path, file, {"fedavg": [0.55, 0.56, 0.57], "fedprox": [0.60, 0.61, 0.62]},
                       doubled={"fedavg": 0.70, "fedprox": 0.62})
    assert main([file, "--seeds", "3", "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "tiny" / "twin" / "reproduce.md").read_text()
    assert "**NOT JUDGED (budget)** `prox_above`" in md and "**NOT JUDGED (budget)** `prox_first`" in md
    assert "cause: budget: not judged: the verdict changes at twice the twin's training budget" in md
    assert "NOT JUDGED (budget: FAILS at twice the budget: 63.0 ± 1.0 (n=3) vs 71.0 ± 1.0 (n=3)" in md
    assert ("2 not judged (cause: budget), 1 not checked at this scale" in md.split("## t1")[0])  # before the tables
    assert "## t1: accuracy (on the generated twins of its data)" in md and "### Quickstart, generated twin" in md
    assert "](" not in md and "runs/ folder the command writes beside reproduce.md" in md
    doc = json.loads((tmp_path / "o" / "tiny" / "twin" / "reproduce.json").read_text())
    judged = {c["id"]: (c["verdict"], c["cause"], [ch["budget"] for ch in c["checks"]]) for c in doc["claims"]}
    assert judged == {"prox_above": (NOT_JUDGED, BUDGET, ["limited"]), "prox_first": (NOT_JUDGED, BUDGET, ["limited"]),
                      "near": (None, None, [])}
    assert {(c["row"], round(c["mean"], 6)) for c in doc["cells_x2"]} == {("FedAvg", 70.0), ("FedProx", 62.0)}
