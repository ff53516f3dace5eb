"""The global model's metric names (test/acc_global_micro, test/acc_global_balanced, test/acc_global_client_dist and
their val/ twins), and runs made before the rename read under them: by fl.report, from W&B, by fl.sweep, and on
resume."""
import json
import re
from pathlib import Path

import pytest
import torch

from fl.config import load_config
from fl.report.aliases import RENAMED, current_names
from fl.report.groups import group_runs
from fl.report.runs import load_local, load_sweeps
from fl.report.tables import table_rows
from fl.report.wandb_access import load_wandb
from fl.run.train import main
from fl.sweep.runner import Job, _metric_value
from fl.sweep.spec import load_sweep
from tests.helpers import load_ckpt, orchestrator, read_metrics, run_tiny, tiny
from tests.report.test_report import FakeApi, FakeWandbRun, fake_run

ROOT = Path(__file__).resolve().parents[2]
OLD = re.compile(r"\b(?:test|val)/(?:acc_global|global_acc|global_acc_client_dist)\b")
NEW = ("test/acc_global_micro", "test/acc_global_balanced", "test/acc_global_client_dist")


def rising(start: float):
    return lambda i: start + i / 10  # the i-th evaluation's value


def old_and_new_fedacd_runs(root: Path) -> tuple[Path, Path]:
    """Two FedACD runs of one setting: seed 0 as fl.train writes it now, seed 1 as it wrote it before the rename."""
    new = {"test/acc_global_micro": rising(0.50), "test/acc_global_balanced": rising(0.40),
           "test/acc_global_client_dist": rising(0.30), "val/acc_global_balanced": rising(0.6)}
    old = {"test/acc_global": rising(0.52), "test/global_acc": rising(0.44),
           "test/global_acc_client_dist": rising(0.36), "val/global_acc": rising(0.7)}
    return (fake_run(root, "acd-s0", {"name": "fedacd"}, 0, [0.5, 0.6, 0.7], extra=new),
            fake_run(root, "acd-s1", {"name": "fedacd"}, 1, [0.5, 0.6, 0.8], extra=old,
                     summary={"headline": "test/global_acc"}))


def has_old_name(value) -> bool:
    if isinstance(value, dict):
        return any(k in RENAMED or has_old_name(v) for k, v in value.items())
    return isinstance(value, str) and value in RENAMED


def test_an_old_runs_metrics_land_in_the_new_runs_columns(tmp_path):
    new_dir, old_dir = old_and_new_fedacd_runs(tmp_path / "runs")
    raw = json.loads((old_dir / "summary.json").read_text())
    assert "test/global_acc" in raw["final"] and "test/global_acc" in raw["at_best"]["val/global_acc"]  # as written

    runs, _ = load_local([tmp_path / "runs"])
    old = next(r for r in runs if r.name == "acd-s1")
    assert not has_old_name(old.summary) and not any(has_old_name(row) for row in old.history)
    assert old.headline == "test/acc_global_balanced"
    assert old.summary["final"]["test/acc_global_micro"] == raw["final"]["test/acc_global"]
    assert old.summary["final"]["test/acc_global_client_dist"] == raw["final"]["test/global_acc_client_dist"]
    at = old.summary["at_best"]["val/acc_global_balanced"]
    assert at["round"] == 5 and at["test/acc_global_balanced"] == raw["at_best"]["val/global_acc"]["test/global_acc"]
    assert old.series("test/acc_global_balanced") == [(1, 0.44), (3, pytest.approx(0.54)), (5, pytest.approx(0.64))]

    (row,) = table_rows(group_runs(runs), list(NEW))  # one setting, one method: one row of two seeds
    assert row["headline"] == "test/acc_global_balanced" and sorted(row["seeds"]) == [0, 1]
    for key, (new_final, old_final) in zip(NEW, ((0.70, 0.72), (0.60, 0.64), (0.50, 0.56))):
        mean, _, n = row["cells"][key]["final"]
        assert n == 2 and mean == pytest.approx((new_final + old_final) / 2)
    assert not any(has_old_name(k) for k in row["cells"])

    # the same two runs read back from W&B: one row of two seeds, the same cells
    remote = load_wandb("ent/proj", api=FakeApi([FakeWandbRun(new_dir), FakeWandbRun(old_dir)]))
    assert not any(has_old_name(r.summary) or any(has_old_name(h) for h in r.history) for r in remote)
    assert table_rows(group_runs(remote), list(NEW))[0]["cells"] == row["cells"]


def test_an_old_sweeps_metric_reads_under_its_new_name(tmp_path):
    _, old_dir = old_and_new_fedacd_runs(tmp_path / "sweep")
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(
        {"name": "acd", "metric": "val/global_acc", "goal": "maximize", "points": []}))
    (manifest,), _ = load_sweeps([tmp_path / "sweep"])
    assert manifest["metric"] == "val/acc_global_balanced"
    # fl.sweep run again over a run that finished before the rename: its value, not "no finished run"
    job = Job("p000", {}, 1, old_dir)
    raw = json.loads((old_dir / "summary.json").read_text())["final"]
    assert _metric_value(job, "val/acc_global_balanced") == raw["val/global_acc"]
    assert _metric_value(job, "test/acc_global_micro") == raw["test/acc_global"]


def test_a_row_with_both_names_keeps_todays():
    assert current_names({"round": 1, "test/acc_global": 0.1, "test/acc_global_micro": 0.2, "val/global_acc": 0.3}) \
        == {"round": 1, "test/acc_global_micro": 0.2, "val/acc_global_balanced": 0.3}


def test_a_run_logs_the_new_names_under_test_and_val_and_the_sweeps_name_them(tmp_path):
    torch.set_num_threads(1)
    orch = orchestrator(load_config(tiny(tmp_path, "data.val_fraction=0.2")), tmp_path / "run")
    orch.train_client(0, 0)
    keys = orch.evaluate(orch.context(0)).keys()
    assert {*NEW, *(k.replace("test/", "val/") for k in NEW)} <= keys and not keys & RENAMED.keys()
    named = [load_sweep(p).metric for p in sorted((ROOT / "sweeps").glob("*.yaml"))]
    assert "val/acc_global_balanced" in named
    assert all(m in keys for m in named if "global" in m), named  # each sweep's global-model metric is logged


def test_nothing_outside_the_alias_map_names_an_old_metric():
    """The code, configs, sweeps, bench scripts and notebook use today's names; the README and docs/ name the old
    ones only in the paragraph that says how old runs are read (docs/metrics.md)."""
    files = [p for d in ("fl", "conf", "sweeps", "bench", "notebooks") for p in (ROOT / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".yaml", ".md", ".ipynb", ".sh")]
    found = [str(p.relative_to(ROOT)) for p in files if p.name != "aliases.py" and OLD.search(p.read_text())]
    assert not found
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    paragraphs = [p for doc in docs for p in doc.read_text().split("\n\n")]
    naming = [p for p in paragraphs if OLD.search(p)]
    assert len(naming) == 1 and "fl/report/aliases.py" in naming[0]


def test_a_run_resumed_from_before_the_rename_goes_on_under_the_new_names(out):
    """A run checkpointed with the old names, resumed to the end, equals the same run made now: metrics.jsonl and
    summary.json hold only the new names, each over all rounds."""
    torch.set_num_threads(1)
    now = run_tiny(out, "trainer.rounds=4", "trainer.checkpoint_every=1", name="now")
    old = run_tiny(out, "trainer.rounds=2", "trainer.checkpoint_every=1", name="old")
    back = {new: old_name for old_name, new in RENAMED.items()}
    ckpt = load_ckpt(old)
    ckpt["history"] = [{back.get(k, k): v for k, v in row.items()} for row in ckpt["history"]]
    assert any("test/global_acc" in row for row in ckpt["history"])
    torch.save(ckpt, old / "checkpoints" / "last.ckpt")
    (old / "checkpoints" / "previous.ckpt").unlink(missing_ok=True)
    assert main([f"resume={old}", "trainer.rounds=4"]) == 0
    assert read_metrics(old) == read_metrics(now)
    def untimed(values: dict) -> dict:  # wall times differ between any two runs
        return {k: v for k, v in values.items() if not k.startswith("time/")}

    resumed, made_now = (json.loads((d / "summary.json").read_text()) for d in (old, now))
    for kind in ("final", "best", "best_round", f"mean_last_{made_now['last_k']}"):
        assert untimed(resumed[kind]) == untimed(made_now[kind]), kind
    assert not has_old_name(resumed)
