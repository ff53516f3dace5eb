"""fl.report's presentation: accuracies in percent with each column's best in bold (by the metric's goal), setting
labels that show only what differs, a sweep's metric against its swept value with the chosen point marked, the
clients' final accuracies per method, and an HTML table sized for a laptop screen."""
import json

import pytest

from fl.report.cli import main, write_report
from fl.report.groups import group_runs
from fl.report.plots import file_stem, final_client_values, sweep_points
from fl.report.runs import load_local
from fl.report.tables import fmt_stat
from tests.report.test_report import cell, fake_run


def test_accuracies_in_percent_other_metrics_as_logged():
    assert fmt_stat((0.915, None, 1), "test/acc_mean_clients") == "91.5"
    assert fmt_stat((0.915, 0.0123, 3), "test/target_f1") == "91.5 ± 1.2"
    assert fmt_stat((0.5, 0.01, 2), "test/kl_PQ") == "0.5000 ± 0.0100"  # not an accuracy: as logged
    assert fmt_stat((0.5, None, 1), "train/loss", bold=True) == "**0.5000**"
    assert fmt_stat((0.915, 0.01, 2), "val/target_acc", latex=True, bold=True) == "$\\mathbf{91.5 \\pm 1.0}$"


def test_best_per_column_in_bold_by_the_metrics_goal(tmp_path):
    """Accuracy: the highest mean is bold; KL (lower is better): the lowest; in Markdown, LaTeX and HTML."""
    for seed in (0, 1):
        fake_run(tmp_path / "runs", f"avg-s{seed}", {"name": "fedavg"}, seed, [0.3, 0.9],
                 extra={"test/kl_PQ": 0.2})
        fake_run(tmp_path / "runs", f"prox-s{seed}", {"name": "fedprox"}, seed, [0.3, 0.5],
                 extra={"test/kl_PQ": 0.1})
    runs, _ = load_local([tmp_path / "runs"])
    paths = write_report(runs, tmp_path / "report", ["test/acc_mean_clients", "test/kl_PQ"], plots=False)
    md = paths["markdown"].read_text()
    head = cell(md, "setting")
    acc, kl = head.index("test/acc_mean_clients final"), head.index("test/kl_PQ final")
    assert cell(md, "fedavg")[acc] == "**90.0 ± 0.0**" and cell(md, "fedprox")[acc] == "50.0 ± 0.0"
    assert cell(md, "fedavg")[kl] == "0.2000 ± 0.0000" and cell(md, "fedprox")[kl] == "**0.1000 ± 0.0000**"
    assert "$\\mathbf{90.0 \\pm 0.0}$" in paths["latex"].read_text()
    page = paths["html"].read_text()
    assert "<b>90.0 ± 0.0</b>" in page and "<b>0.1000 ± 0.0000</b>" in page and "<b>50.0" not in page


def test_equal_columns_and_different_settings_are_not_ranked(tmp_path):
    """A column whose values all look the same has no bold; methods are compared within their setting only."""
    for alpha, accs in ((0.1, (0.5, 0.6)), (1.0, (0.8, 0.7))):
        for method, acc in zip(("fedavg", "fedprox"), accs):
            fake_run(tmp_path / "runs", f"{method}-{alpha}", {"name": method}, 0, [acc, acc],
                     data={"alpha": alpha}, extra={"test/kl_PQ": 0.3})
    runs, _ = load_local([tmp_path / "runs"])
    md = write_report(runs, tmp_path / "report", ["test/acc_mean_clients", "test/kl_PQ"],
                      plots=False)["markdown"].read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if "| partition" in line]
    head = cell(md, "setting")
    acc, kl = head.index("test/acc_mean_clients final"), head.index("test/kl_PQ final")
    assert {(r[0], r[1]): r[acc] for r in rows} == {
        ("partition.alpha=0.1", "fedavg"): "50.0", ("partition.alpha=0.1", "fedprox"): "**60.0**",
        ("partition.alpha=1.0", "fedavg"): "**80.0**", ("partition.alpha=1.0", "fedprox"): "70.0"}
    assert all(r[kl] == "0.3000" for r in rows)


def test_setting_labels_show_only_what_differs(tmp_path):
    root = tmp_path / "runs"
    for alpha in (0.1, 1.0):
        fake_run(root, f"avg-{alpha}", {"name": "fedavg"}, 0, [0.3, 0.5], data={"alpha": alpha})
    runs, _ = load_local([root])
    assert sorted(s for s, _ in group_runs(runs)) == ["partition.alpha=0.1", "partition.alpha=1.0"]
    caption = write_report(runs, tmp_path / "report", plots=False)["markdown"].read_text()
    assert "All runs: embedded/dirichlet" in caption
    # the partition differs too: it names the setting again, and alpha only where settings differ in it
    fake_run(root, "avg-classes", {"name": "fedavg"}, 0, [0.3, 0.5], data={"name": "classes"})
    runs, _ = load_local([root])
    assert sorted(s for s, _ in group_runs(runs)) == ["embedded/classes partition.alpha=0.5",
                                                       "embedded/dirichlet partition.alpha=0.1",
                                                       "embedded/dirichlet partition.alpha=1.0"]
    # nothing differs: the dataset/partition still names the one setting
    runs, _ = load_local([root / "avg-0.1"])
    assert [s for s, _ in group_runs(runs)] == ["embedded/dirichlet"]


def sweep_dir(root, mus=(0.001, 0.01, 0.1, 1.0), best_mu=0.01):
    """A sweep directory like fl.sweep's: one fedprox run per mu and seed, and sweep.json."""
    points = []
    for i, mu in enumerate(mus):
        values = [0.5 + (0.2 if mu == best_mu else 0.0) + 0.01 * seed for seed in (0, 1)]
        runs = [fake_run(root, f"p{i:03d}-s{seed}", {"name": "fedprox", "mu": mu}, seed, [0.3, v],
                         extra={"val/acc_mean_clients": v}) for seed, v in enumerate(values)]
        points.append({"point": f"p{i:03d}", "params": {"method.mu": mu}, "values": values,
                       "mean": sum(values) / 2, "std": 0.00707, "runs": [str(r) for r in runs]})
    best = max(points, key=lambda p: p["mean"])
    (root / "sweep.json").write_text(json.dumps({"name": "mu_sweep", "metric": "val/acc_mean_clients",
                                                 "goal": "maximize", "points": points, "best": best}))
    return root


def test_sweep_plot_of_the_metric_against_the_swept_value_marks_the_chosen_point(tmp_path):
    root = sweep_dir(tmp_path / "sweep")
    manifest = json.loads((root / "sweep.json").read_text())
    x_key, lines, chosen = sweep_points(manifest)
    assert x_key == "method.mu" and chosen == ("", 0.01)
    assert [x for x, _, _ in lines[""]] == [0.001, 0.01, 0.1, 1.0]
    assert lines[""][1][1] == pytest.approx(0.705)
    assert main([str(root), "--out", str(tmp_path / "report")]) == 0
    plot = tmp_path / "report" / "plots" / f"{file_stem('sweep', 'mu_sweep', 'val/acc_mean_clients')}.png"
    assert plot.is_file()
    assert f"plots/{plot.name}" in (tmp_path / "report" / "report.md").read_text()


def test_sweep_points_with_two_swept_keys_and_a_categorical_one():
    """One line per value of the other swept key; a sweep over method.name has categories on the x axis."""
    points = [{"params": {"method.name": m, "method.mu": mu}, "mean": v, "std": 0.0, "values": [v]}
              for m, mu, v in (("fedprox", 0.1, 0.4), ("fedprox", 0.01, 0.5), ("scaffold", 0.1, 0.7),
                               ("scaffold", 0.01, 0.6))]
    manifest = {"metric": "val/acc", "goal": "maximize", "points": points, "best": points[2]}
    x_key, lines, chosen = sweep_points(manifest)
    assert x_key == "method.mu" and chosen == ("method.name=scaffold", 0.1)
    assert lines["method.name=fedprox"] == [(0.01, 0.5, 0.0), (0.1, 0.4, 0.0)]  # sorted by the swept value
    only_names = [{**p, "params": {"method.name": p["params"]["method.name"]}} for p in points[::2]]
    x_key, lines, chosen = sweep_points({**manifest, "points": only_names, "best": only_names[1]})
    assert x_key == "method.name" and chosen == ("", "scaffold") and [x for x, _, _ in lines[""]] == ["fedprox",
                                                                                                      "scaffold"]
    assert sweep_points({"points": [], "best": None}) is None


def test_client_accuracy_distribution_per_setting(tmp_path):
    """The clients' last client/<i>/acc, pooled over seeds, one box per method; one image per setting."""
    for alpha in (0.1, 1.0):
        for seed, final in ((0, 0.5), (1, 0.7)):
            fake_run(tmp_path / "runs", f"avg-{alpha}-s{seed}", {"name": "fedavg"}, seed, [0.2, final],
                     data={"alpha": alpha})
    runs, _ = load_local([tmp_path / "runs"])
    groups = group_runs(runs)
    runs_of = next(rs for (s, _), rs in groups.items() if s == "partition.alpha=0.1")
    assert sorted(final_client_values(runs_of, "acc")) == pytest.approx([0.4, 0.6, 0.6, 0.8])  # final ∓ 0.1
    write_report(runs, tmp_path / "report")
    plots = tmp_path / "report" / "plots"
    images = [plots / f"{file_stem(s, 'client_distribution', 'acc')}.png" for s in ("partition.alpha=0.1",
                                                                                  "partition.alpha=1.0")]
    assert all(p.is_file() for p in images) and images[0].read_bytes() != images[1].read_bytes()


def test_html_table_fits_a_laptop_screen(tmp_path):
    """Wide tables scroll inside their own box, long labels and metric names may wrap, the type is compact."""
    long = "an_option_with_a_long_name_that_would_widen_the_setting_column"
    for i in range(2):
        fake_run(tmp_path / "runs", f"r{i}", {"name": "fedavg"}, 0, [0.1, 0.2 + i], data={long: i})
    runs, _ = load_local([tmp_path / "runs"])
    page = write_report(runs, tmp_path / "report", plots=False)["html"].read_text()
    assert "<div class='scroll'><table>" in page and ".scroll{overflow-x:auto" in page
    assert "td.l{text-align:left;white-space:normal" in page and "font-size:12px" in page
    assert "<th>test/<wbr>acc_<wbr>mean_<wbr>clients final</th>" in page
