"""The papers' numbers as data (fl/reproduce/papers/*.yaml): every file parses, every cell resolves to sweep points
whose configs fl.config accepts (fl.sweep's loader, load_config), every number at paper scale has a sweep that
regenerates it, and the tables' sweeps run the runs of the comparison sweeps they stand for."""
import functools
import json
from pathlib import Path

import pytest

from fl.config import load_config
from fl.reproduce.plan import build_plan
from fl.reproduce.spec import SCALES, available_papers, load_paper
from fl.reproduce.timing import paper_scale, parse_duration
from fl.sweep import runner
from fl.sweep.runner import plan_points
from fl.sweep.spec import expand, load_sweep
from tests.helpers import ROOT

PAPERS = available_papers()
OUT = Path("/plan-only")  # build_plan names run folders under it and writes nothing


@functools.cache
def plan(name: str, scale: str = "twin", every_cell: bool = False, baselines_only: bool = False):
    """A paper's plan at seed 0, built once per pytest process; the run configs it loads are kept for the next plan
    (a budget's runs are the every-cell plan's: loading each once is most of what these tests cost)."""
    paper = load_paper(name)
    with pytest.MonkeyPatch.context() as patch:  # plan_points only reads the config it loads
        patch.setattr(runner, "load_config", lambda argv: loaded(tuple(argv)))
        return build_plan(paper, paper.tables, scale, [0], OUT, [], every_cell=every_cell,
                          baselines_only=baselines_only)


@functools.cache
def loaded(argv: tuple[str, ...]):
    return load_config(list(argv))


def test_the_five_seed_papers_are_here():
    assert PAPERS == ["fedacd", "feddrm", "fedmosaic", "fedpals", "pfedfda"]


@pytest.mark.parametrize("name", PAPERS)
def test_every_paper_parses_with_numbers_and_claims(name):
    paper = load_paper(name)
    assert paper.tables and paper.claims
    for table in paper.tables:
        numbers = [v for r in table.rows for v in r.paper.values()]
        if table.id != "fig2":  # pFedFDA's Fig. 2 prints no numbers
            assert numbers, f"{name}/{table.id} has no paper numbers"
        for r in table.rows:  # a number of a column the table does not have is refused when parsing
            assert set(r.paper) <= {c.id for c in table.columns}


@pytest.mark.parametrize("name, scale", [(p, s) for p in PAPERS for s in SCALES])
def test_every_cell_resolves_to_sweep_points_whose_configs_load(name, scale):
    """build_plan loads every sweep (fl.sweep's loader) and every run config (fl.config's load_config) of every cell,
    the twin cells outside the time budget included (--every-cell), and raises on any that does not; every number of
    a column with a sweep at that scale has runs that regenerate it. At twin scale the same test checks the plans
    built from that one (the plans are the slow part: every run config loaded; one test builds a paper's once):
    the budget's and --baselines'."""
    paper = load_paper(name)
    planned_cells = plan(name, scale, every_cell=True)
    for table in paper.tables:
        for column in table.columns:
            for row in table.rows:
                key = (table.id, column.id, row.method)
                planned = any(tuple(k) == key for k in planned_cells.cells)
                assert planned or any(tuple(k) == key and why for k, why in planned_cells.not_run.items()), key
                skipped = scale == "twin" and row.method in column.twin_skip  # a data error measured on the twin
                if column.refs[scale] and row.paper.get(column.paper_column) and not skipped:
                    assert planned, f"{key}: the paper's number has no {scale} sweep that regenerates it"
    assert all(job.config for job in planned_cells.jobs)
    if scale == "twin":  # the twins run with one intra-op thread each, --parallel of them at once
        assert all("fabric.cpu_threads=1" in job.extra for job in planned_cells.jobs)
        the_twin_budget_runs_a_subset_and_names_what_it_leaves(paper, planned_cells, plan(name))
        baselines_plans_exactly_the_reference_baseline_cells_of_the_budget(paper, plan(name),
                                                                             plan(name, baselines_only=True))


def the_twin_budget_runs_a_subset_and_names_what_it_leaves(paper, every, budget):
    assert budget.cells and set(budget.cells) <= set(every.cells)
    for key in set(every.cells) - set(budget.cells):
        assert "outside the 40-minute twin budget" in budget.not_run[key]
        assert not paper.table(key.table).column(key.column).in_budget(key.row)


def baselines_plans_exactly_the_reference_baseline_cells_of_the_budget(paper, budget, calibration):
    """--baselines (bench/calibrate_twins.py): the budget's cells whose row is a table's reference baseline, with
    the same runs, and no other row's."""
    want = {k: v for k, v in budget.cells.items() if k.row in paper.table(k.table).baselines}
    assert want and {k: [j.run_dir for j in v] for k, v in calibration.cells.items()} == {
        k: [j.run_dir for j in v] for k, v in want.items()}
    assert all(k.row in paper.table(k.table).baselines for k in calibration.not_run)


def resolved(sweep_file: str, where: dict | None = None, seeds=(None,)) -> set[str]:
    sweep = load_sweep(ROOT / sweep_file)
    seeds = [int(s) for s in sweep.params["seed"]["values"]] if "seed" in sweep.params else list(seeds)
    points = [p for p in expand(sweep) if all(p.get(k) == v for k, v in (where or {}).items())]
    return {json.dumps(j.config, sort_keys=True, default=str) for j in plan_points(sweep, points, ROOT, seeds, [])}


@pytest.mark.parametrize("scale", ["real", "synthetic"])
def test_feddrms_tables_sweep_runs_the_comparison_sweeps_runs(scale):
    twin = "_synthetic" if scale == "synthetic" else ""
    parts = [f"sweeps/feddrm_{s}_{scale}.yaml" for s in ("baselines", "ft_baselines", "baselines_configs")]
    assert resolved(f"sweeps/feddrm_tables_{scale}.yaml", {"conf": f"feddrm_cifar10_dir03{twin}"}) == set().union(
        *(resolved(p) for p in parts))


def test_fedacds_tables_sweep_runs_the_comparison_sweeps_runs():
    assert resolved("sweeps/fedacd_tables_synthetic.yaml", {"conf": "fedacd_cifar100_dir01_synthetic"}) == (
        resolved("sweeps/compare_fedacd_synthetic.yaml") | resolved("sweeps/compare_fedacd_generic_synthetic.yaml"))


def test_paper_scale_projections_are_read_from_the_benchmark_table():
    assert parse_duration("23 min (150 rounds)") == (23 * 60, False)
    assert parse_duration("> 3.1 d (800 rounds)") == (3.1 * 86400, True)
    rows = paper_scale()
    assert rows["fedpals_cifar10_c2"][0] == 23 * 60
    assert rows["feddrm_cifar10_dir03"][1].startswith("at least")
    assert rows["fedpals_pacs"][0] is None and "cannot run" in rows["fedpals_pacs"][1]  # no round: no projection
    assert rows["fedpals_iwildcam"][1].startswith("at least")  # from its memory-mapped pool, stopped at the timeout


@pytest.mark.parametrize("name", PAPERS)
def test_every_claim_holds_on_the_papers_own_numbers_and_states_the_ties_it_rests_on(name):
    """A claim the paper's own table contradicts (FedDRM's label shift on Table 1's system accuracy) cannot be a
    claim of the paper; a rank claim names every row the paper prints with exactly its row's number there."""
    from fl.reproduce.claim_cells import cells_of, instances, paper_mean, stated_ties
    paper = load_paper(name)
    for claim in paper.claims:
        for (label, params), keys in zip(instances(claim), cells_of(claim)):
            table = paper.table(keys[0].table)
            sign = -1.0 if table.lower_is_better else 1.0
            where = f"{claim.id} {label}"
            if claim.rule == "better":
                a, b = (paper_mean(table, k.column, k.row) for k in keys)
                if a is not None and b is not None:
                    assert sign * (a - b) > params.get("margin", 0.0), f"{where}: {a} against {b}"
            elif claim.rule == "rank":
                mine = paper_mean(table, keys[0].column, keys[0].row)
                others = {r.method: paper_mean(table, keys[0].column, r.method) for r in table.rows
                          if r.method != keys[0].row}
                others = {m: v for m, v in others.items() if v is not None}
                above = [m for m, v in others.items() if sign * (v - mine) > 0]
                assert 1 + len(above) <= params["rank"], f"{where}: {above} above it in the paper"
                assert sorted(stated_ties(claim, keys[0].column)) == sorted(
                    m for m, v in others.items() if v == mine), where
