"""fl.report on run directories with known metrics: table values, grouping, plots, HTML, W&B reading."""
import base64
import json
import re
import statistics
from pathlib import Path

import pytest
import yaml

from fl.core import METHODS, load_plugins
from fl.report.cli import write_report
from fl.report.groups import group_runs
from fl.report.plots import file_stem
from fl.report.runs import ReportError, load_local
from fl.report.summary import summarize_history
from fl.report.tables import table_rows
from fl.report.wandb_access import load_wandb
from tests.helpers import run_cli

LAST_K = 2
load_plugins()  # the methods' registrations hold their headline metrics


def fake_run(root: Path, name: str, method: dict, seed: int, acc: list[float], data: dict | None = None,
             extra: dict | None = None, summary: dict | None = None) -> Path:
    """A run directory like fl.train's: config.yaml, metrics.jsonl (evaluations every other round) and
    summary.json computed from it by fl.report.summary, with `summary`'s keys added (finished_at, diverged)."""
    run = root / name
    run.mkdir(parents=True)
    config = {"seed": seed, "method": method, "trainer": {"rounds": 2 * len(acc), "last_k": LAST_K},
              "data": {"name": "embedded", "partition": {"name": "dirichlet", "alpha": 0.5, "seed": None,
                                                         **(data or {})}},
              "logger": {"output_dir": str(root)}}
    (run / "config.yaml").write_text("# partition fingerprint: abc\n" + yaml.safe_dump(config))
    history = []
    for i, a in enumerate(acc):
        history.append({"round": 2 * i, "train/loss": 1.0 / (i + 1)})
        row = {"round": 2 * i + 1, "train/loss": 1.0 / (i + 1.5), "test/acc_mean_clients": a,
               "client/0/acc": a - 0.1, "client/1/acc": a + 0.1}
        row.update({k: (v(i) if callable(v) else v) for k, v in (extra or {}).items()})
        history.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    written = summarize_history(history, LAST_K)
    written.update({"method": method["name"], "seed": seed, "headline": METHODS[method["name"]].headline,
                    **(summary or {})})
    (run / "summary.json").write_text(json.dumps(written))
    return run


ACC = {  # method -> seed -> accuracy at each evaluation
    "fedavg": {0: [0.2, 0.4, 0.5], 1: [0.3, 0.5, 0.6], 2: [0.1, 0.5, 0.7]},
    "fedprox": {0: [0.2, 0.6, 0.8], 1: [0.2, 0.4, 0.6]},
}


@pytest.fixture
def runs_dir(tmp_path):
    for method, seeds in ACC.items():
        for seed, acc in seeds.items():
            fake_run(tmp_path / "runs", f"{method}-s{seed}", {"name": method}, seed, acc)
    return tmp_path / "runs"


def cell(text: str, method: str) -> list[str]:
    line = next(line for line in text.splitlines() if f"| {method} |" in line)
    return [c.strip() for c in line.strip("|").split("|")]


def test_table_values_are_mean_and_sample_std_over_seeds(runs_dir, tmp_path):
    runs, notes = load_local([runs_dir])
    assert len(runs) == 5 and notes == []
    paths = write_report(runs, tmp_path / "report")
    md = paths["markdown"].read_text()
    # fedavg finals 0.5, 0.6, 0.7 -> 0.6 ± 0.1; last 2 means 0.45, 0.55, 0.6 -> 0.5333 ± 0.0764 (in %)
    lastk = [statistics.mean(a[-LAST_K:]) for a in ACC["fedavg"].values()]
    expected_last = f"{100 * statistics.mean(lastk):.1f} ± {100 * statistics.stdev(lastk):.1f}"
    head = cell(md, "setting")
    row = cell(md, "fedavg")
    assert row[head.index("seeds")] == "3"
    assert row[head.index("test/acc_mean_clients final")] == "60.0 ± 10.0"
    assert row[head.index(f"test/acc_mean_clients last {LAST_K}")] == expected_last == "53.3 ± 7.6"
    assert row[head.index("headline (final)")] == "test/acc_mean_clients: 60.0 ± 10.0"
    row = cell(md, "fedprox")  # finals 0.8, 0.6 -> 0.7 ± 0.1414: the better method, in bold
    assert row[head.index("test/acc_mean_clients final")] == "**70.0 ± 14.1**"
    tex = paths["latex"].read_text()
    assert "fedavg & 3 & test/acc\\_mean\\_clients: $60.0 \\pm 10.0$" in tex
    assert "$53.3 \\pm 7.6$" in tex and "$\\mathbf{70.0 \\pm 14.1}$" in tex
    assert "\\begin{tabular}" in tex and "\\bottomrule" in tex


def test_plots_and_self_contained_html(runs_dir, tmp_path):
    runs, _ = load_local([runs_dir])
    paths = write_report(runs, tmp_path / "report")
    pngs = sorted((tmp_path / "report" / "plots").glob("*.png"))
    assert {p.name for p in pngs} == {file_stem("embedded/dirichlet", "test/acc_mean_clients") + ".png",
                                      file_stem("embedded/dirichlet", "client_distribution", "acc") + ".png"}
    page = paths["html"].read_text()  # no traces: the runs log no lambda / beta / V / ESS
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert sorted(base64.b64decode(i) for i in images) == sorted(p.read_bytes() for p in pngs)
    assert not re.search(r'src="(?!data:)', page)  # nothing loaded from elsewhere
    assert "60.0 ± 10.0" in page


def test_trace_plots_where_runs_log_lambda_beta_ess_v(tmp_path):
    extra = {"client/0/lambda": lambda i: 0.1 * i, "client/1/lambda": 0.5, "client/0/beta": 0.3,
             "server/ess": lambda i: 10.0 + i, "client/1/V": 2.0}
    for seed in (0, 1):
        fake_run(tmp_path / "runs", f"x-s{seed}", {"name": "fedavg"}, seed, [0.1, 0.2], extra=extra)
    runs, _ = load_local([tmp_path / "runs"])
    write_report(runs, tmp_path / "report")
    names = {p.name for p in (tmp_path / "report" / "plots").glob("*.png")}
    setting = "embedded/dirichlet"
    expected = [file_stem(setting, "server/ess")] + [file_stem(f"{setting} / fedavg", "client", name)
                                                     for name in ("lambda", "beta", "V")]
    assert {stem + ".png" for stem in expected} <= names


def test_settings_sharing_a_long_prefix_get_one_image_each(tmp_path):
    """Settings whose labels agree on their first 80+ characters: N settings, N files, N different images (of
    each kind: the metric's curve and the clients' accuracies)."""
    long = "a_partition_option_whose_name_alone_is_longer_than_most_file_names_on_a_laptop_screen"
    for i in range(3):
        fake_run(tmp_path / "runs", f"r{i}", {"name": "fedavg"}, 0, [0.1 * (i + 1), 0.2 * (i + 1)],
                 data={long: i})
    runs, _ = load_local([tmp_path / "runs"])
    write_report(runs, tmp_path / "report")
    assert len({r.setting for r in runs}) == 3 and len(runs[0].setting) > 80
    pngs = list((tmp_path / "report" / "plots").glob("*.png"))
    assert len(pngs) == 6 and len({p.read_bytes() for p in pngs}) == 6


def test_variants_settings_and_headline(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        for mu in (0.01, 0.1):
            fake_run(root, f"prox-{mu}-s{seed}", {"name": "fedprox", "mu": mu}, seed, [0.3, 0.4 + mu])
        for alpha in (0.1, 1.0):
            fake_run(root, f"avg-{alpha}-s{seed}", {"name": "fedavg"}, seed, [0.3, 0.5],
                     data={"alpha": alpha})
        fake_run(root, f"pals-s{seed}", {"name": "fedpals", "ess_frac": 0.5}, seed, [0.3, 0.6],
                 extra={"test/target_acc": lambda i, seed=seed: 0.5 + 0.1 * i + 0.01 * seed,
                        "val/target_acc": lambda i: 0.9 - 0.1 * i})
    groups = group_runs(load_local([root])[0])
    keys = set(groups)
    # the setting labels show what differs between settings; every run is on embedded/dirichlet
    assert ("partition.alpha=0.5", "fedprox mu=0.01") in keys
    assert ("partition.alpha=0.5", "fedprox mu=0.1") in keys
    assert ("partition.alpha=0.1", "fedavg") in keys
    assert ("partition.alpha=0.5", "fedpals") in keys  # its one ess_frac is not a variant
    assert all(len(g) == 2 for g in groups.values())
    rows = {(r["setting"], r["method"]): r for r in table_rows(groups, ["test/acc_mean_clients"])}
    pals = rows[("partition.alpha=0.5", "fedpals")]
    assert pals["headline"] == "test/target_acc"
    mean, std, n = pals["cells"]["test/target_acc"]["final"]
    assert n == 2 and mean == pytest.approx(0.605) and std == pytest.approx(statistics.stdev([0.6, 0.61]))
    # model selection on the target validation set picks the first evaluation (val is highest there)
    assert pals["cells"]["test/target_acc"]["best_val"][0] == pytest.approx(0.505)
    # a baseline on FedPALS' setting is read on the setting's headline too
    assert rows[("partition.alpha=0.5", "fedprox mu=0.1")]["headline"] == "test/target_acc"


def test_fine_tuned_runs_are_a_method_row_in_the_same_setting(tmp_path):
    """FedDRM's FedAvg-FT beside FedAvg: finetune.after_round labels the method, not a new setting column."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        fake_run(root, f"avg-s{seed}", {"name": "fedavg"}, seed, [0.3, 0.5])
        ft = fake_run(root, f"avg-ft-s{seed}", {"name": "fedavg"}, seed, [0.3, 0.7])
        config = yaml.safe_load((ft / "config.yaml").read_text())
        (ft / "config.yaml").write_text(yaml.safe_dump({**config, "finetune": {"after_round": 3, "lr": None}}))
    groups = group_runs(load_local([root])[0])
    assert set(groups) == {("embedded/dirichlet", "fedavg"), ("embedded/dirichlet", "fedavg +finetune after 3")}
    rows = {r["method"]: r for r in table_rows(groups, ["test/acc_mean_clients"])}
    assert rows["fedavg +finetune after 3"]["cells"]["test/acc_mean_clients"]["final"][0] == pytest.approx(0.7)


@pytest.mark.slow
def test_unfinished_runs_are_skipped_with_a_note_and_cli_writes_into_the_sweep_dir(runs_dir):
    (runs_dir / "dead-s9").mkdir()
    (runs_dir / "dead-s9" / "config.yaml").write_text("seed: 9\n")
    res = run_cli([str(runs_dir)], cwd=runs_dir.parent, script=("-m", "fl.report"))
    assert res.returncode == 0, res.stderr
    assert "| embedded/dirichlet | fedavg | 3 |" in res.stdout
    report = (runs_dir / "report" / "report.md").read_text()
    assert "skipped" in report and "dead-s9" in report
    assert (runs_dir / "report" / "report.html").is_file() and (runs_dir / "report" / "report.tex").is_file()
    res = run_cli([str(runs_dir / "nothing")], cwd=runs_dir.parent, script=("-m", "fl.report"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1


class FakeWandbRun:
    def __init__(self, run_dir: Path, state="finished"):
        self.name, self.state, self.url = run_dir.name, state, f"https://wandb.ai/x/{run_dir.name}"
        self.config = yaml.safe_load((run_dir / "config.yaml").read_text())
        self.rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        # fl.train writes the headline metric into the W&B summary
        self.summary = {"headline": json.loads((run_dir / "summary.json").read_text())["headline"]}

    def scan_history(self):
        for row in self.rows:  # W&B splits a round over several log calls; the report merges them
            step = row["round"]
            scalars = {k: v for k, v in row.items() if k != "round"}
            half = dict(list(scalars.items())[: len(scalars) // 2])
            yield {"trainer/global_step": step, "_step": 2 * step, **half}
            yield {"trainer/global_step": step, "_step": 2 * step + 1, "media": {"_type": "image-file"},
                   **{k: v for k, v in scalars.items() if k not in half}}


class FakeApi:
    def __init__(self, runs):
        self._runs = runs

    def runs(self, path, filters=None):
        assert path == "ent/proj"
        return self._runs


def test_wandb_runs_give_the_same_table_as_the_run_directories(runs_dir, tmp_path):
    local, _ = load_local([runs_dir])
    dirs = sorted(p for p in runs_dir.iterdir() if p.is_dir())
    remote = load_wandb("ent/proj", api=FakeApi([FakeWandbRun(d) for d in dirs] + [FakeWandbRun(dirs[0], "crashed")]))
    assert len(remote) == len(local)

    def table(runs):
        rows = table_rows(group_runs(runs), ["test/acc_mean_clients"])
        return [(r["setting"], r["method"], r["cells"]) for r in rows]

    assert table(remote) == table(local)


@pytest.mark.slow
def test_wandb_offline_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ReportError, match="--wandb needs W&B online"):
        load_wandb("ent/proj")
    with pytest.raises(ReportError, match="expected ENTITY/PROJECT"):
        load_wandb("proj")
    res = run_cli(["--wandb", "ent/proj"], cwd=tmp_path, script=("-m", "fl.report"), env={"WANDB_MODE": "offline"})
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--wandb needs W&B online" in res.stderr


@pytest.mark.slow  # W&B's offline logger starts its wandb-core service process
def test_wandb_dashboard_offline_summaries_table_and_plots(tmp_path, monkeypatch):
    """The W&B logger (offline): the run table's best/<key> and last<K>/<key> equal summary.json's values,
    <key> itself stays a plain last value (what a sweep's metric reads), per-client metrics become a table
    at evaluation rounds and the round plots become images at the last round."""
    pytest.importorskip("wandb")
    from omegaconf import OmegaConf

    from fl.config import load_config
    from fl.run.loggers import wandb_logger_cls

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = load_config(["trainer.rounds=4", f"trainer.last_k={LAST_K}", "logger.wandb.mode=offline",
                       "trainer.eval_every=2"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"train/loss": 1.0},
            {"train/loss": 0.9, "test/acc_mean_clients": 0.5, "client/0/acc": 0.4, "client/1/acc": 0.6},
            {"train/loss": 0.8}, {"train/loss": 0.7, "test/acc_mean_clients": 0.3, "client/0/acc": 0.2,
                                  "client/1/acc": 0.4, "client/0/lambda": 0.5, "client/1/lambda": 0.7}]
    logger = wandb_logger_cls()(cfg, run_dir, name="t", save_dir=str(run_dir), project="p", mode="offline",
                                config=OmegaConf.to_container(cfg))
    with (run_dir / "metrics.jsonl").open("w") as f:  # the JSONL logger writes each row before W&B sees it
        for step, row in enumerate(rows):
            f.write(json.dumps({"round": step, **row}) + "\n")
            f.flush()
            logger.log_metrics(row, step=step)
    summary = logger.experiment.summary
    expected = summarize_history([{"round": i, **r} for i, r in enumerate(rows)], LAST_K)
    assert summary["test/acc_mean_clients"] == 0.3  # a plain number: sweeps read it
    assert summary["best/test/acc_mean_clients"] == expected["best"]["test/acc_mean_clients"] == 0.5
    last_k = expected[f"mean_last_{LAST_K}"]["test/acc_mean_clients"]
    assert summary[f"last{LAST_K}/test/acc_mean_clients"] == pytest.approx(last_k) == 0.4
    files = Path(logger.experiment.dir)
    logger.experiment.finish()
    tables = sorted((files / "media" / "table" / "clients").glob("metrics_*.table.json"))
    assert len(tables) == 2
    last = max((json.loads(t.read_text()) for t in tables), key=lambda t: t["data"][0][0])
    assert last["columns"] == ["round", "client", "acc", "lambda"]
    assert last["data"] == [[3, 0, 0.2, 0.5], [3, 1, 0.4, 0.7]]
    images = {p.name.split("_")[0] for p in (files / "media" / "images" / "plots").glob("*.png")}
    assert {"test", "client"} <= images  # test_acc_mean_clients curve and the client/<i>/lambda trace


def test_model_selection_picks_each_seeds_best_validated_variant_and_reports_its_test_metric(tmp_path):
    """FedPALS' protocol: lambda chosen per seed on the target validation set; the table reports the test
    accuracy at the selected variant's best validation round, mean ± std over seeds."""
    from fl.report.tables import model_selection, model_selection_table

    val = {(0.25, 0): 0.6, (0.25, 1): 0.9, (0.5, 0): 0.8, (0.5, 1): 0.7}  # best val of each (ess_frac, seed)
    for (frac, seed), v in val.items():
        fake_run(tmp_path / "runs", f"pals-{frac}-s{seed}", {"name": "fedpals", "ess_frac": frac}, seed, [0.3, 0.6],
                 extra={"val/target_acc": lambda i, v=v: v - 0.1 * (1 - i),  # best at the last evaluation
                        "test/target_acc": lambda i, v=v: v / 2 + 0.01 * i})
    runs, _ = load_local([tmp_path / "runs"])
    rows = model_selection(group_runs(runs))
    assert len(rows) == 1 and rows[0]["method"] == "fedpals"
    assert rows[0]["chosen"] == ["fedpals ess_frac=0.5", "fedpals ess_frac=0.25"]  # seeds 0 and 1
    mean, std, n = rows[0]["cells"]["test/target_acc"]
    expected = [0.8 / 2 + 0.01, 0.9 / 2 + 0.01]
    assert n == 2 and mean == pytest.approx(sum(expected) / 2)
    assert std == pytest.approx(abs(expected[0] - expected[1]) / 2 ** 0.5)
    text = model_selection_table(rows)
    assert "ess_frac=0.5 (1x), fedpals ess_frac=0.25 (1x)" in text
    assert "## Model selection" in write_report(runs, tmp_path / "report", plots=False)["markdown"].read_text()


def test_a_sweeps_validation_metric_gets_its_own_model_selection_table(tmp_path):
    """Sweeps select on val/*: the report picks each seed's variant by its best val/acc_mean_clients and shows
    test/acc_mean_clients at that round."""
    for mu, seed, v in ((0.0, 0, 0.5), (1.0, 0, 0.7), (0.0, 1, 0.8), (1.0, 1, 0.6)):
        fake_run(tmp_path / "runs", f"prox-{mu}-s{seed}", {"name": "fedprox", "mu": mu}, seed, [0.3, 0.6],
                 extra={"val/acc_mean_clients": lambda i, v=v: v - 0.1 * (1 - i),
                        "test/acc_mean_clients": lambda i, v=v: v / 2 + 0.01 * i})
    runs, _ = load_local([tmp_path / "runs"])
    text = write_report(runs, tmp_path / "report", plots=False,
                        extra_metrics=["val/acc_mean_clients"])["markdown"].read_text()
    assert "## Model selection on val/acc_mean_clients" in text
    expected = (0.7 / 2 + 0.01 + 0.8 / 2 + 0.01) / 2
    assert f"{100 * expected:.1f}" in text.split("## Model selection on val/acc_mean_clients")[1]
