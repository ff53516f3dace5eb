"""fl.report's plots of short runs and sweeps, read off the matplotlib objects: integer round ticks, one round either
side of a single point (drawn as a marker with its error bar), bands and error bars clipped to an accuracy's
0-100 %, and titles that name only what tells a setting apart."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402

from fl.report.groups import group_runs, short_settings  # noqa: E402
from fl.report.plots import all_figures, curve_plot, sweep_plot  # noqa: E402
from fl.report.runs import load_local  # noqa: E402
from fl.report.tables import mean_std  # noqa: E402
from tests.report.test_report import fake_run  # noqa: E402

ACC = "test/acc_mean_clients"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def groups_of(tmp_path, *runs):
    for name, seed, acc, kw in runs:
        fake_run(tmp_path / "runs", name, {"name": "fedavg"}, seed, acc, **kw)
    return group_runs(load_local([tmp_path / "runs"])[0])


def y_extent(ax) -> tuple[float, float]:
    """The lowest and highest y of every band (PolyCollection) and error bar (LineCollection) on `ax`."""
    ys = [np.asarray(p.vertices)[:, 1] for c in ax.collections if isinstance(c, PolyCollection) for p in c.get_paths()]
    ys += [np.asarray(s)[:, 1] for c in ax.collections if isinstance(c, LineCollection) for s in c.get_segments()]
    ys = np.concatenate(ys)
    return float(ys.min()), float(ys.max())


def test_a_one_evaluation_curve_is_a_marker_on_integer_rounds(tmp_path):
    """fake_run evaluates at odd rounds: one accuracy is one point at round 1; seeds 0.0 and 0.3 there give a mean
    of 15 % with a std of 21 %, whose bar must stop at 0 %."""
    groups = groups_of(tmp_path, ("s0", 0, [0.0], {}), ("s1", 1, [0.3], {}))
    ax = curve_plot(groups, "embedded/dirichlet", ACC).axes[0]
    assert ax.get_xlim() == (0.0, 2.0) and list(ax.get_xticks()) == [1]
    (bar,) = ax.containers  # an error bar, its marker the point
    line = bar.lines[0]
    assert line.get_marker() == "o" and line.get_markersize() >= 6 and list(line.get_ydata()) == [pytest.approx(15.0)]
    low, high = y_extent(ax)
    assert low == 0.0 and high == pytest.approx(15.0 + 100 * np.std([0.0, 0.3], ddof=1))


def test_round_ticks_are_integers_and_bands_stay_within_0_and_100_percent(tmp_path):
    groups = groups_of(tmp_path, ("s0", 0, [0.0, 0.2, 0.95, 1.0, 1.0], {}), ("s1", 1, [0.4, 0.5, 0.6, 0.6, 0.8], {}))
    ax = curve_plot(groups, "embedded/dirichlet", ACC).axes[0]
    assert list(ax.get_xticks()) == [1, 3, 5, 7, 9]  # the evaluated rounds
    low, high = y_extent(ax)
    assert low == 0.0 and high == 100.0
    many = groups_of(tmp_path / "long", ("s0", 0, [0.5] * 40, {}))
    ax = curve_plot(many, "embedded/dirichlet", ACC).axes[0]
    ax.figure.canvas.draw()
    ticks = ax.get_xticks()
    assert len(ticks) > 2 and all(t == int(t) for t in ticks)


def test_a_loss_band_is_not_clipped(tmp_path):
    groups = groups_of(tmp_path, ("s0", 0, [0.5, 0.5], {"extra": {"test/kl_PQ": -0.2}}),
                       ("s1", 1, [0.5, 0.5], {"extra": {"test/kl_PQ": 0.2}}))
    low, _ = y_extent(curve_plot(groups, "embedded/dirichlet", "test/kl_PQ").axes[0])
    assert low == pytest.approx(-np.std([-0.2, 0.2], ddof=1))  # not an accuracy: drawn as logged


def test_a_curve_leaves_out_the_rounds_a_seed_logged_as_infinite(tmp_path):
    """FedPALS logs lambda = inf at ESS fraction 1: three seeds of it drew no band but crashed statistics.stdev."""
    lam = lambda i: float("inf") if i == 0 else 2.0 * i  # noqa: E731
    groups = groups_of(tmp_path, *[(f"s{s}", s, [0.5, 0.5, 0.5], {"extra": {"server/lambda": lam}}) for s in range(3)])
    line = curve_plot(groups, "embedded/dirichlet", "server/lambda").axes[0].lines[0]
    assert list(line.get_xdata()) == [3, 5] and list(line.get_ydata()) == [2.0, 4.0]
    always = groups_of(tmp_path / "inf", *[(f"s{s}", s, [0.5], {"extra": {"server/lambda": float("inf")}})
                                           for s in range(2)])
    assert curve_plot(always, "embedded/dirichlet", "server/lambda") is None
    assert mean_std([float("inf")] * 3) == (float("inf"), None, 3)  # the table cell: no spread to give
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5), 2)


def sweep(points, best=0):
    points = [{"params": params, "mean": mean, "std": std, "values": []} for params, mean, std in points]
    return {"name": "s", "metric": "val/acc_mean_clients", "goal": "maximize", "points": points, "best": points[best]}


def test_sweep_error_bars_are_clipped_and_integer_values_get_integer_ticks():
    fig = sweep_plot(sweep([({"trainer.local_epochs": e}, m, 0.2) for e, m in ((1, 0.05), (2, 0.5), (4, 0.9))]))
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1, 2, 4]
    low, high = y_extent(ax)
    assert low == 0.0 and high == 100.0


def test_a_one_point_sweep_is_a_marker_on_a_readable_axis():
    ax = sweep_plot(sweep([({"method.mu": 0.01}, 0.5, 0.1)])).axes[0]
    assert list(ax.get_xticks()) == [0.01]
    lo, hi = ax.get_xlim()
    assert lo < 0.01 - 0.4 and hi > 0.01 + 0.4
    line = ax.containers[0].lines[0]
    assert line.get_marker() == "o" and line.get_markersize() >= 6 and line.get_linestyle() == "None"
    ax = sweep_plot(sweep([({"trainer.rounds": 3}, 0.5, 0.1)])).axes[0]
    assert ax.get_xlim() == (2.0, 4.0) and list(ax.get_xticks()) == [3]


def test_titles_name_only_what_tells_a_setting_apart(tmp_path):
    """Settings that differ in partition.alpha and, along with it, in target.distribution (unset in one): the label
    names both, the titles only alpha; the figure's caption keeps the full label."""
    groups_of(tmp_path, ("a", 0, [0.3, 0.5], {"data": {"alpha": 0.1}}), ("b", 0, [0.3, 0.5], {"data": {"alpha": 1.0}}))
    for name, dist in (("a", None), ("b", "partition")):
        path = tmp_path / "runs" / name / "config.yaml"
        config = yaml.safe_load(path.read_text())
        config["data"]["target"] = {"distribution": dist}
        path.write_text(yaml.safe_dump(config))
    groups = group_runs(load_local([tmp_path / "runs"])[0])
    labels = sorted(s for s, _ in groups)
    assert labels == ["partition.alpha=0.1 target.distribution=None",
                      "partition.alpha=1.0 target.distribution=partition"]
    assert short_settings(groups) == {labels[0]: "partition.alpha=0.1", labels[1]: "partition.alpha=1.0"}
    ax = curve_plot(groups, labels[0], ACC, short_settings(groups)[labels[0]]).axes[0]
    assert ax.get_title() == "partition.alpha=0.1: test/acc_mean_clients (mean ± std over seeds)"
    figures = all_figures(groups, [ACC], tmp_path / "plots")
    assert f"{labels[0]}: {ACC}" in [caption for caption, _ in figures]


def test_short_titles_keep_every_key_a_grid_needs(tmp_path):
    runs = [(f"r{a}-{lr}", 0, [0.3, 0.5], {"data": {"alpha": a, "lr_note": lr}}) for a in (0.1, 1.0) for lr in (1, 2)]
    groups = groups_of(tmp_path, *runs)
    titles = short_settings(groups)
    assert sorted(titles.values()) == ["partition.alpha=0.1 partition.lr_note=1", "partition.alpha=0.1 "
                                       "partition.lr_note=2", "partition.alpha=1.0 partition.lr_note=1",
                                       "partition.alpha=1.0 partition.lr_note=2"]
    one = groups_of(tmp_path / "one", ("x", 0, [0.3, 0.5], {}))
    assert short_settings(one) == {"embedded/dirichlet": "embedded/dirichlet"}
