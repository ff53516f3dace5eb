"""The report's PNG plots (matplotlib, Agg backend): a sweep's metric against its swept value with the chosen
point marked, metric vs round per method with a band of ± one sample std over seeds, the distribution of the
clients' final accuracies per method, and per-client / server traces (lambda_i, beta_i, V_i, ESS) where runs
log them. Accuracies are drawn in percent, as the tables show them, with their bands and error bars clipped to
0-100 %. Rounds get integer ticks; a curve of one point is a marker with an error bar on an axis a round either
side. A setting's title names only what tells it apart from the report's other settings (fl/report/groups.py's
short_settings); its full label is the figure's caption."""
from __future__ import annotations

import hashlib
import math
import random
import re
import statistics
import textwrap
from pathlib import Path
from typing import Any, Optional

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fl.report.groups import short_settings  # noqa: E402
from fl.report.summary import is_percent  # noqa: E402

# per-client traces: client/<i>/<name>; server traces: exact keys. Names are the methods' logged keys.
CLIENT_TRACES = ("lambda", "beta", "V")
SERVER_TRACES = ("server/ess", "server/ess_frac", "server/lambda")
MAX_CLIENT_LINES = 20
FEW_ROUNDS = 12  # up to this many evaluated rounds, each gets its own tick


def file_stem(*parts: str) -> str:
    """A readable file name for a plot of `parts`, unique by a hash of the full text: settings that share a long
    prefix must not overwrite each other's images."""
    text = " / ".join(parts)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', text).strip('_')[:60]}-{digest}"


def seed_band(runs, key: str) -> tuple[list[int], list[float], list[float]]:
    """Rounds where every seed has a finite value of the key (0-based, as the files and the console number them),
    mean and sample std across seeds. A non-finite value (FedPALS' lambda = inf at ESS fraction 1) cannot be drawn:
    its round is left out."""
    per_run = [{t: v for t, v in r.series(key) if math.isfinite(v)} for r in runs]
    rounds = sorted(set.intersection(*(set(s) for s in per_run))) if per_run else []
    means = [statistics.mean(s[t] for s in per_run) for t in rounds]
    stds = [statistics.stdev([s[t] for s in per_run]) if len(per_run) > 1 else 0.0 for t in rounds]
    return rounds, means, stds


def _figure(width: float = 6.4):
    # constrained layout sizes the axes around their titles and labels, so long ones are not clipped
    return plt.subplots(figsize=(width, 4.0), layout="constrained")


def _title(ax, text: str) -> None:
    # constrained layout does not wrap: a title wider than the figure (long setting labels) would be cut off
    ax.set_title(textwrap.fill(text, int(ax.figure.get_figwidth() * 11)), fontsize=9)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _units(key: str) -> tuple[float, str]:
    """Factor and axis label of a metric: accuracies in percent, the rest as logged."""
    return (100.0, f"{key} (%)") if is_percent(key) else (1.0, key)


def _spread(key: str, means: list[float], stds: list[float]) -> tuple[list[float], list[float]]:
    """Lower and upper ends of mean ± std, within the metric's range: an accuracy (shown in %) is in [0, 100]."""
    low, high = [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)]
    if is_percent(key):
        low, high = [max(v, 0.0) for v in low], [min(v, 100.0) for v in high]
    return low, high


def _integer_axis(ax, xs: list) -> None:
    """Integer ticks for rounds (or an integer swept value): each value its own tick when there are few, one
    round either side of a single one (matplotlib's own margin would be ±5 % of the value: 2.85-3.15)."""
    xs = sorted(set(xs))
    if len(xs) <= FEW_ROUNDS:
        ax.set_xticks(xs)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(xs) == 1:
        ax.set_xlim(xs[0] - 1, xs[0] + 1)


def _mean_line(ax, x: list, mean: list[float], low: list[float], high: list[float], label: str) -> None:
    """A mean over seeds with its band; a single point as a marker with an error bar (a band of one point is
    invisible)."""
    if len(x) == 1:
        ax.errorbar(x, mean, yerr=[[mean[0] - low[0]], [high[0] - mean[0]]], marker="o", markersize=6, capsize=4,
                    linestyle="none", label=label)
        return
    line, = ax.plot(x, mean, marker="o" if len(x) < 30 else None, markersize=3, label=label)
    ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)


def curve_plot(groups: dict, setting: str, key: str, title: Optional[str] = None):
    """The figure of one line per method of `setting`, band = ± std over seeds (clipped to the metric's range);
    `title`: the setting's name in the title (default: its label). None if no run logged `key`."""
    fig, ax = _figure()
    scale, label = _units(key)
    rounds = []
    for (s, method), runs in groups.items():
        if s != setting:
            continue
        x, mean, std = seed_band(runs, key)
        if not x:
            continue
        mean, std = [m * scale for m in mean], [d * scale for d in std]
        _mean_line(ax, x, mean, *_spread(key, mean, std), label=f"{method} (n={len(runs)})")
        rounds += x
    if not rounds:
        plt.close(fig)
        return None
    _integer_axis(ax, rounds)
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    _title(ax, f"{title or setting}: {key} (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def curve_figure(groups: dict, setting: str, key: str, path: Path, title: Optional[str] = None):
    """curve_plot saved as `path`; None if no run logged `key`."""
    fig = curve_plot(groups, setting, key, title)
    return None if fig is None else _save(fig, path)


def client_trace_keys(runs, name: str) -> list[str]:
    pattern = re.compile(rf"^client/(\d+)/{re.escape(name)}$")
    keys = {k for r in runs for row in r.history for k in row if pattern.match(k)}
    return sorted(keys, key=lambda k: int(k.split("/")[1]))


def client_trace_figure(runs, title: str, name: str, path: Path):
    """client/<i>/<name> over rounds, seed-averaged, for up to MAX_CLIENT_LINES clients, and the mean
    over all clients in bold."""
    keys = client_trace_keys(runs, name)
    if not keys:
        return None
    fig, ax = _figure()
    per_round: dict[int, list[float]] = {}
    for i, key in enumerate(keys):
        x, mean, _ = seed_band(runs, key)
        for t, v in zip(x, mean):
            per_round.setdefault(t, []).append(v)
        if i < MAX_CLIENT_LINES:
            ax.plot(x, mean, linewidth=0.8, alpha=0.6, marker="o" if len(x) == 1 else None,
                    label=key.split("/")[1] if len(keys) <= 10 else None)
    xs = sorted(per_round)
    ax.plot(xs, [statistics.mean(per_round[t]) for t in xs], color="black", linewidth=2,
            marker="o" if len(xs) == 1 else None, label="mean")
    if xs:
        _integer_axis(ax, xs)
    shown = f" (first {MAX_CLIENT_LINES} of {len(keys)} clients)" if len(keys) > MAX_CLIENT_LINES else ""
    _title(ax, f"{title}: client/<i>/{name}{shown}, mean over {len(runs)} seed(s)")
    ax.set_xlabel("round")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, title="client" if len(keys) <= 10 else None)
    return _save(fig, path)


def final_client_values(runs, name: str) -> list[float]:
    """Each client's last logged client/<i>/<name>, pooled over the runs (seeds)."""
    return [points[-1][1] for r in runs for key in client_trace_keys([r], name) if (points := r.series(key))]


def client_distribution_figure(groups: dict, setting: str, name: str, path: Path, title: Optional[str] = None):
    """One box per method of `setting` over its clients' final client/<i>/<name>, all seeds pooled, with every
    client drawn as a point on top (a box of ten clients hides how they spread); None if no run logged it."""
    data = {method: values for (s, method), runs in groups.items()
            if s == setting and (values := final_client_values(runs, name))}
    if not data:
        return None
    scale, label = _units(name)
    values = [[v * scale for v in vs] for vs in data.values()]
    fig, ax = _figure(max(5.0, 2.0 + 0.9 * len(data)))
    ax.boxplot(values, showfliers=False)  # the points show the outliers
    jitter = random.Random(0)  # the same picture for the same runs
    for i, vs in enumerate(values, start=1):
        ax.scatter([i + jitter.uniform(-0.15, 0.15) for _ in vs], vs, s=10, alpha=0.6, zorder=3)
    ax.set_xticks(range(1, len(data) + 1), [textwrap.fill(m, 16) for m in data], fontsize=7)
    ax.set_ylabel(f"final client/<i>/{label}")
    _title(ax, f"{title or setting}: clients' final {name} (all clients and seeds)")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def sweep_points(manifest: dict) -> Optional[tuple[str, dict[str, list[tuple[Any, float, float]]], Optional[tuple]]]:
    """A sweep.json's metric against its swept value: the x key (the first swept key whose values are all numbers,
    else the first), one line per combination of the other swept keys as [(x, mean, std over seeds)], and the
    chosen (best) point as (line, x), None when the sweep chose none. None when nothing was swept or scored."""
    points = [p for p in manifest.get("points", []) if p.get("mean") is not None]
    keys = [k for k in (points[0]["params"] if points else {}) if k != "seed"]
    if not keys:
        return None
    numeric = [k for k in keys if all(isinstance(p["params"].get(k), (int, float))
                                      and not isinstance(p["params"].get(k), bool) for p in points)]
    x_key = (numeric or keys)[0]

    def line(params: dict) -> str:
        return " ".join(f"{k}={params.get(k)}" for k in keys if k != x_key)

    lines: dict[str, list[tuple[Any, float, float]]] = {}
    for p in points:
        lines.setdefault(line(p["params"]), []).append((p["params"][x_key], p["mean"], p["std"] or 0.0))
    if x_key in numeric:
        lines = {k: sorted(v, key=lambda t: t[0]) for k, v in lines.items()}
    best = manifest.get("best")
    return x_key, lines, ((line(best["params"]), best["params"][x_key]) if best else None)


def sweep_plot(manifest: dict):
    """The figure of the sweep's metric (final value, mean ± std over seeds, clipped to the metric's range) against
    the swept value, the chosen point starred; None when sweep_points has nothing to draw."""
    found = sweep_points(manifest)
    if found is None:
        return None
    x_key, lines, chosen = found
    metric = manifest.get("metric") or "metric"
    scale, label = _units(metric)
    xs = list(dict.fromkeys(x for pts in lines.values() for x, _, _ in pts))
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    position = (lambda x: x) if numeric else xs.index  # categorical values (method.name) at 0, 1, ...
    fig, ax = _figure()
    for name, pts in lines.items():  # categories are not joined by lines: there is nothing between them
        means, stds = [m * scale for _, m, _ in pts], [s * scale for _, _, s in pts]
        low, high = _spread(metric, means, stds)
        ax.errorbar([position(x) for x, _, _ in pts], means,
                    yerr=[[m - lo for m, lo in zip(means, low)], [hi - m for m, hi in zip(means, high)]],
                    marker="o", markersize=4 if len(pts) > 1 else 6, capsize=3,
                    linestyle="-" if numeric and len(pts) > 1 else "none", label=name or None)
    if chosen is not None and chosen[0] in lines:
        y = next((m for x, m, _ in lines[chosen[0]] if x == chosen[1]), None)
        if y is not None:
            ax.plot([position(chosen[1])], [y * scale], marker="*", markersize=16, color="red", linestyle="none",
                    zorder=4, label=" ".join(["chosen:", *([chosen[0]] if chosen[0] else []), f"{x_key}={chosen[1]}"]))
    if numeric and min(xs) > 0 and max(xs) / min(xs) >= 100:  # grids like mu in {0.001, ..., 1}
        ax.set_xscale("log")
    elif numeric and all(isinstance(x, int) for x in xs):  # local epochs, rounds, clients: no 2.5 ticks
        _integer_axis(ax, xs)
    elif numeric and len(xs) == 1:
        ax.set_xticks(xs)
        ax.set_xlim(xs[0] - max(abs(xs[0]) / 2, 0.5), xs[0] + max(abs(xs[0]) / 2, 0.5))
    if not numeric:
        ax.set_xticks(range(len(xs)), [textwrap.fill(str(x), 14) for x in xs], fontsize=7)
        ax.set_xlim(-0.5 - (len(xs) == 1), len(xs) - 0.5 + (len(xs) == 1))
    ax.set_xlabel(x_key)
    ax.set_ylabel(label)
    _title(ax, f"sweep {manifest.get('name', '')}: {metric} (final, mean ± std over seeds; "
               f"goal: {manifest.get('goal', '?')})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def sweep_figure(manifest: dict, path: Path):
    """sweep_plot saved as `path`; None when there is nothing to draw."""
    fig = sweep_plot(manifest)
    return None if fig is None else _save(fig, path)


def all_figures(groups: dict, metrics: list[str], folder: Path, sweeps: tuple = ()) -> list[tuple[str, Path]]:
    """Every plot the report shows: (caption, path). `sweeps`: sweep.json manifests (fl.report.tables.load_sweeps)."""
    figures = []
    for manifest in sweeps:
        name, metric = str(manifest.get("name")), str(manifest.get("metric"))
        path = sweep_figure(manifest, folder / f"{file_stem('sweep', name, metric)}.png")
        if path is not None:
            figures.append((f"sweep {name}: {metric} against the swept value", path))
    titles = short_settings(groups)
    for setting, title in titles.items():
        for key in metrics + list(SERVER_TRACES):
            path = curve_figure(groups, setting, key, folder / f"{file_stem(setting, key)}.png", title)
            if path is not None:
                figures.append((f"{setting}: {key}", path))
        path = client_distribution_figure(groups, setting, "acc",
                                          folder / f"{file_stem(setting, 'client_distribution', 'acc')}.png", title)
        if path is not None:
            figures.append((f"{setting}: client/<i>/acc, final, per method", path))
    for (setting, method), runs in groups.items():
        for name in CLIENT_TRACES:
            title = f"{setting} / {method}"
            path = client_trace_figure(runs, f"{titles[setting]} / {method}", name,
                                       folder / f"{file_stem(title, 'client', name)}.png")
            if path is not None:
                figures.append((f"{title}: client/<i>/{name}", path))
    return figures
