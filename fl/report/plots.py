"""The report's PNG plots (matplotlib, Agg backend): metric vs round per method with a band of ± one
sample std over seeds, and per-client / server traces (lambda_i, beta_i, V_i, ESS) where runs log them."""
from __future__ import annotations

import hashlib
import re
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

# per-client traces: client/<i>/<name>; server traces: exact keys. Names are the methods' logged keys.
CLIENT_TRACES = ("lambda", "beta", "V")
SERVER_TRACES = ("server/ess", "server/ess_frac", "server/lambda")
MAX_CLIENT_LINES = 20


def file_stem(*parts: str) -> str:
    """A readable file name for a plot of `parts`, unique by a hash of the full text: settings that share a long
    prefix must not overwrite each other's images."""
    text = " / ".join(parts)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', text).strip('_')[:60]}-{digest}"


def seed_band(runs, key: str) -> tuple[list[int], list[float], list[float]]:
    """Rounds where every seed has the key (1-based for display), mean and sample std across seeds."""
    per_run = [dict(r.series(key)) for r in runs]
    rounds = sorted(set.intersection(*(set(s) for s in per_run))) if per_run else []
    means = [statistics.mean(s[t] for s in per_run) for t in rounds]
    stds = [statistics.stdev([s[t] for s in per_run]) if len(per_run) > 1 else 0.0 for t in rounds]
    return [t + 1 for t in rounds], means, stds


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_figure(groups: dict, setting: str, key: str, path: Path):
    """One line per method of `setting`, band = ± std over seeds; None if no run logged `key`."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = False
    for (s, method), runs in groups.items():
        if s != setting:
            continue
        x, mean, std = seed_band(runs, key)
        if not x:
            continue
        line, = ax.plot(x, mean, marker="o" if len(x) < 30 else None, markersize=3,
                        label=f"{method} (n={len(runs)})")
        ax.fill_between(x, [m - d for m, d in zip(mean, std)], [m + d for m, d in zip(mean, std)],
                        color=line.get_color(), alpha=0.2, linewidth=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("round")
    ax.set_ylabel(key)
    ax.set_title(f"{setting}: {key} (mean ± std over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


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
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    per_round: dict[int, list[float]] = {}
    for i, key in enumerate(keys):
        x, mean, _ = seed_band(runs, key)
        for t, v in zip(x, mean):
            per_round.setdefault(t, []).append(v)
        if i < MAX_CLIENT_LINES:
            ax.plot(x, mean, linewidth=0.8, alpha=0.6, label=key.split("/")[1] if len(keys) <= 10 else None)
    xs = sorted(per_round)
    ax.plot(xs, [statistics.mean(per_round[t]) for t in xs], color="black", linewidth=2, label="mean")
    shown = f" (first {MAX_CLIENT_LINES} of {len(keys)} clients)" if len(keys) > MAX_CLIENT_LINES else ""
    ax.set_title(f"{title}: client/<i>/{name}{shown}, mean over {len(runs)} seed(s)", fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, title="client" if len(keys) <= 10 else None)
    return _save(fig, path)


def all_figures(groups: dict, metrics: list[str], folder: Path) -> list[tuple[str, Path]]:
    """Every plot the report shows: (caption, path)."""
    figures = []
    settings = list(dict.fromkeys(s for s, _ in groups))
    for setting in settings:
        for key in metrics + list(SERVER_TRACES):
            path = curve_figure(groups, setting, key, folder / f"{file_stem(setting, key)}.png")
            if path is not None:
                figures.append((f"{setting}: {key}", path))
    for (setting, method), runs in groups.items():
        for name in CLIENT_TRACES:
            title = f"{setting} / {method}"
            path = client_trace_figure(runs, title, name, folder / f"{file_stem(title, 'client', name)}.png")
            if path is not None:
                figures.append((f"{title}: client/<i>/{name}", path))
    return figures
