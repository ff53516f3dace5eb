"""What fl.report marks beside its numbers: a seed run more than once counts once (its newest run, the others named
in a footnote), and runs whose summary.json says they diverged are a row of their own, never averaged with healthy
seeds nor ranked; in Markdown, LaTeX, HTML, the model-selection table and the CLI's output alike."""
import json
import os
import statistics
from datetime import datetime, timezone

import pytest

from fl.report.cli import main, write_report
from fl.report.groups import group_runs
from fl.report.runs import load_local
from fl.report.tables import model_selection, model_selection_table, table_rows
from tests.report.test_report import cell, fake_run

ACC = "test/acc_mean_clients"
EARLY, LATE = "2025-03-01T10:00:00.000Z", "2025-03-02T10:00:00.000Z"


def set_mtime(run_dir, when: str) -> None:
    t = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    os.utime(run_dir / "summary.json", (t, t))


@pytest.fixture
def repeated(tmp_path):
    """fedavg seed 0 twice (the older run: final 0.5, the newer: 0.7) and seed 1 (0.6). The newer seed-0 run sorts
    first by name and has the older file time, so neither the name nor the mtime may decide."""
    root = tmp_path / "runs"
    old = fake_run(root, "fedavg-s0", {"name": "fedavg"}, 0, [0.3, 0.5], summary={"finished_at": EARLY})
    new = fake_run(root, "a-rerun", {"name": "fedavg"}, 0, [0.3, 0.7], summary={"finished_at": LATE})
    fake_run(root, "fedavg-s1", {"name": "fedavg"}, 1, [0.3, 0.6], summary={"finished_at": EARLY})
    set_mtime(old, LATE)
    set_mtime(new, EARLY)
    return root


def test_a_seed_run_twice_counts_once_by_its_newest_run(repeated, tmp_path):
    runs, _ = load_local([repeated])
    assert len(runs) == 3
    groups = group_runs(runs)
    (kept,) = [r for r in groups[("embedded/dirichlet", "fedavg")] if r.seed == 0]
    assert len(groups[("embedded/dirichlet", "fedavg")]) == 2
    assert kept.name == "a-rerun" and [r.name for r in kept.replaces] == ["fedavg-s0"]
    (row,) = table_rows(groups, [ACC])
    mean, std, n = row["cells"][ACC]["final"]
    assert n == 2 and mean == pytest.approx(0.65) and std == pytest.approx(statistics.stdev([0.7, 0.6]))

    paths = write_report(runs, tmp_path / "report", plots=False)
    md = paths["markdown"].read_text()
    head = cell(md, "setting")
    assert cell(md, "fedavg")[head.index("seeds")] == "2‡"
    assert cell(md, "fedavg")[head.index(f"{ACC} final")] == "65.0 ± 7.1"
    note = next(line for line in md.splitlines() if line.startswith("‡ "))
    assert "seed 0: kept a-rerun (finished 2025-03-02 10:00:00 UTC), left out fedavg-s0 (2025-03-01" in note
    assert "summary.json's finished_at" in note
    tex = paths["latex"].read_text()
    assert "fedavg & 2$^{\\ddagger}$ &" in tex and "$\\ddagger$~a seed run more than once" in tex
    assert "left out fedavg-s0" in tex
    page = paths["html"].read_text()
    assert "<td class=''>2‡</td>" in page and "<p class='foot'>‡ a seed run more than once" in page


def test_without_a_recorded_finish_time_the_newest_file_counts(tmp_path):
    root = tmp_path / "runs"
    old = fake_run(root, "b", {"name": "fedavg"}, 0, [0.3, 0.5])
    new = fake_run(root, "a", {"name": "fedavg"}, 0, [0.3, 0.7])
    set_mtime(old, EARLY)
    set_mtime(new, LATE)
    (row,) = table_rows(group_runs(load_local([root])[0]), [ACC])
    assert row["cells"][ACC]["final"] == (pytest.approx(0.7), None, 1)
    assert row["repeats"][0]["kept"] == "a" and row["repeats"][0]["from"] == "summary.json's modification time"


def test_other_seeds_partition_seeds_or_settings_are_not_repeats(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "s0", {"name": "fedavg"}, 0, [0.3, 0.5])
    fake_run(root, "s0-p7", {"name": "fedavg"}, 0, [0.3, 0.6], data={"seed": 7})
    fake_run(root, "s0-mu", {"name": "fedprox", "mu": 0.1}, 0, [0.3, 0.6])
    fake_run(root, "s0-alpha", {"name": "fedavg"}, 0, [0.3, 0.6], data={"alpha": 0.1})
    groups = group_runs(load_local([root])[0])
    assert sum(len(g) for g in groups.values()) == 4 and not any(r.replaces for g in groups.values() for r in g)


def test_model_selection_uses_each_seeds_newest_run(tmp_path):
    """An older run of (ess_frac=0.25, seed 0) had the best validation value; the newer one of that seed does not,
    so seed 0 selects ess_frac=0.5."""
    root = tmp_path / "runs"
    for frac, seed, v, when in ((0.25, 0, 0.95, EARLY), (0.25, 0, 0.6, LATE), (0.5, 0, 0.8, LATE),
                                (0.25, 1, 0.9, LATE), (0.5, 1, 0.7, LATE)):
        fake_run(root, f"pals-{frac}-s{seed}-{when[:10]}", {"name": "fedpals", "ess_frac": frac}, seed, [0.3, 0.6],
                 extra={"val/target_acc": lambda i, v=v: v - 0.1 * (1 - i),
                        "test/target_acc": lambda i, v=v: v / 2 + 0.01 * i}, summary={"finished_at": when})
    (row,) = model_selection(group_runs(load_local([root])[0]))
    assert row["chosen"] == ["fedpals ess_frac=0.5", "fedpals ess_frac=0.25"]
    assert row["cells"]["test/target_acc"][0] == pytest.approx((0.8 / 2 + 0.01 + 0.9 / 2 + 0.01) / 2)
    text = model_selection_table([row])
    assert "| 2‡ |" in text and "left out pals-0.25-s0-2025-03-01" in text


DIVERGED = {"round": 3, "client": 2, "method": "fedprox", "reason": "train/loss grew 1e5-fold since round 0"}


@pytest.fixture
def with_diverged(tmp_path):
    """fedprox seeds 0 and 1 healthy (finals 0.5, 0.7), seed 2 diverged with the highest accuracy of all (0.9);
    fedavg seeds 0 and 1 (0.6)."""
    root = tmp_path / "runs"
    for seed, final in ((0, 0.5), (1, 0.7)):
        fake_run(root, f"prox-s{seed}", {"name": "fedprox"}, seed, [0.3, final])
        fake_run(root, f"avg-s{seed}", {"name": "fedavg"}, seed, [0.3, 0.6])
    fake_run(root, "prox-s2", {"name": "fedprox"}, 2, [0.3, 0.9], summary={"diverged": DIVERGED})
    return root


def test_diverged_runs_are_a_marked_row_never_averaged_nor_ranked(with_diverged, tmp_path):
    runs, _ = load_local([with_diverged])
    rows = {r["method"]: r for r in table_rows(group_runs(runs), [ACC])}
    assert rows["fedprox"]["cells"][ACC]["final"][:2] == (pytest.approx(0.6), pytest.approx(statistics.stdev([.5, .7])))
    assert rows["fedprox (diverged)"]["cells"][ACC]["final"] == (pytest.approx(0.9), None, 1)

    paths = write_report(runs, tmp_path / "report", plots=False)
    md = paths["markdown"].read_text()
    head = cell(md, "setting")
    row = cell(md, "fedprox (diverged)")
    assert row[head.index("seeds")] == "1†" and row[head.index(f"{ACC} final")] == "90.0†"
    assert row[head.index("headline (final)")] == f"{ACC}: 90.0†"
    assert cell(md, "fedavg")[head.index(f"{ACC} final")] == "60.0 ± 0.0"  # not bold: 60 = fedprox's healthy 60
    note = next(line for line in md.splitlines() if line.startswith("† "))
    assert ("prox-s2 at round 3 (client 2, fedprox: train/loss grew 1e5-fold since round 0)" in note
            and "not averaged with the healthy seeds" in note)
    tex = paths["latex"].read_text()
    assert "$90.0^{\\dagger}$" in tex and "\\mathbf{90.0" not in tex and "prox-s2 at round 3" in tex
    page = paths["html"].read_text()
    assert "90.0†" in page and "<b>90.0" not in page and "<p class='foot'>† diverged" in page


def test_diverged_runs_are_not_model_selection_candidates(tmp_path):
    root = tmp_path / "runs"
    for frac, seed, v in ((0.25, 0, 0.6), (0.5, 0, 0.8), (0.25, 1, 0.9), (0.5, 1, 0.7)):
        fake_run(root, f"pals-{frac}-s{seed}", {"name": "fedpals", "ess_frac": frac}, seed, [0.3, 0.6],
                 extra={"val/target_acc": lambda i, v=v: v - 0.1 * (1 - i),
                        "test/target_acc": lambda i, v=v: v / 2 + 0.01 * i},
                 summary={"diverged": DIVERGED} if (frac, seed) == (0.25, 0) else None)
    fake_run(root, "pals-1.0-s0", {"name": "fedpals", "ess_frac": 1.0}, 0, [0.3, 0.6],
             extra={"val/target_acc": 0.99, "test/target_acc": 0.5}, summary={"diverged": DIVERGED})
    (row,) = model_selection(group_runs(load_local([root])[0]))
    assert row["chosen"] == ["fedpals ess_frac=0.5", "fedpals ess_frac=0.25"]
    text = model_selection_table([row])
    assert "| 2† |" in text and "runs that diverged are not candidates" in text and "pals-1.0-s0 at round 3" in text


def test_a_diverged_run_left_out_for_its_rerun_is_named_as_diverged(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "first", {"name": "fedavg"}, 0, [0.3, 0.1], summary={"finished_at": EARLY, "diverged": DIVERGED})
    fake_run(root, "rerun", {"name": "fedavg"}, 0, [0.3, 0.6], summary={"finished_at": LATE})
    groups = group_runs(load_local([root])[0])
    assert list(groups) == [("embedded/dirichlet", "fedavg")]
    md = write_report(load_local([root])[0], tmp_path / "report", plots=False)["markdown"].read_text()
    assert "kept rerun (finished 2025-03-02 10:00:00 UTC), left out first (2025-03-01 10:00:00 UTC, diverged at " \
           "round 3)" in md


def test_the_cli_prints_the_footnotes(repeated, capsys):
    fake_run(repeated, "fedavg-s2", {"name": "fedavg"}, 2, [0.3, 0.1], summary={"diverged": DIVERGED})
    assert main([str(repeated), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "| embedded/dirichlet | fedavg | 2‡ |" in out and "| embedded/dirichlet | fedavg (diverged) | 1† |" in out
    assert "‡ a seed run more than once" in out and "left out fedavg-s0" in out and "fedavg-s2 at round 3" in out
    assert "(4 runs, 1 left out as repeats of a newer run ‡)" in out


def test_summary_json_records_when_it_was_written(tmp_path):
    from fl.run.run_dir import write_summary

    before = datetime.now(timezone.utc)
    write_summary(tmp_path, {"final": {ACC: 0.5}})
    written = json.loads((tmp_path / "summary.json").read_text())
    finished = datetime.fromisoformat(written["finished_at"].replace("Z", "+00:00"))
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= finished <= datetime.now(timezone.utc)
    assert written["final"] == {ACC: 0.5}
    (tmp_path / "config.yaml").write_text("seed: 0\nmethod: {name: fedavg}\n")
    (run,), _ = load_local([tmp_path])
    assert run.finished == finished.timestamp() and run.finished_from == "summary.json's finished_at"


def test_wandb_runs_are_counted_and_marked_the_same_way(tmp_path):
    """From W&B: the newest of identical runs by the run's last log time (summary _timestamp), and the
    "diverged" entry of its summary."""
    from fl.report.wandb_access import load_wandb
    from tests.report.test_report import FakeApi, FakeWandbRun

    root = tmp_path / "runs"
    remote = []
    for name, seed, final, stamp, diverged in (("old", 0, 0.5, 100.0, None), ("new", 0, 0.7, 200.0, None),
                                               ("bad", 1, 0.1, 150.0, DIVERGED)):
        remote.append(FakeWandbRun(fake_run(root, name, {"name": "fedavg"}, seed, [0.3, final])))
        remote[-1].summary.update({"_timestamp": stamp, **({"diverged": diverged} if diverged else {})})
    rows = {r["method"]: r for r in table_rows(group_runs(load_wandb("ent/proj", api=FakeApi(remote))), [ACC])}
    assert rows["fedavg"]["cells"][ACC]["final"] == (pytest.approx(0.7), None, 1)
    assert rows["fedavg"]["repeats"][0]["kept"] == "new" and rows["fedavg"]["repeats"][0]["from"] == \
        "W&B's last log time"
    assert rows["fedavg (diverged)"]["diverged"] == [{"run": "bad", **DIVERGED}]
