"""fl.report on a folder with broken run directories: each one is skipped with one warning naming it and the reason,
and the others are reported; a metrics.jsonl whose last line was cut off by a killed writer keeps its complete
rows; a broken sweep.json loses only its plot; --out at a file is a one-line error (exit 2) before anything is
written."""
import json

import pytest

from fl.report.cli import main
from fl.report.runs import ReportError, load_local, load_sweeps
from tests.report.test_report import cell, fake_run
from tests.report.test_report_polish import sweep_dir

ACC = "test/acc_mean_clients"

# run name -> (how it is broken, the reason its warning gives)
BROKEN = {
    "garbage-summary": (lambda d: (d / "summary.json").write_text('{"final": {'), "summary.json is not readable JSON"),
    "list-summary": (lambda d: (d / "summary.json").write_text("[1, 2]"), "summary.json holds a list"),
    "no-final": (lambda d: (d / "summary.json").write_text('{"best": {}}'), "summary.json has no 'final' metrics"),
    "text-final": (lambda d: (d / "summary.json").write_text('{"final": {"test/acc_mean_clients": "high"}}'),
                   "summary.json's final['test/acc_mean_clients'] is a string, expected a number"),
    "bad-yaml": (lambda d: (d / "config.yaml").write_text("seed: [0\nmethod: {name: fedavg\n"),
                 "config.yaml is not readable YAML"),
    "list-yaml": (lambda d: (d / "config.yaml").write_text("- seed\n- method\n"), "config.yaml holds a list"),
    "no-config": (lambda d: (d / "config.yaml").unlink(), "summary.json but no config.yaml"),
    "damaged-metrics": (lambda d: (d / "metrics.jsonl").write_text('{"round": 0}\n{"rou\n{"round": 1}\n'),
                        "metrics.jsonl line 2 is not JSON"),
    "roundless-metrics": (lambda d: (d / "metrics.jsonl").write_text('{"round": 0}\n[1]\n'),
                          "metrics.jsonl line 2 is not a row with an integer 'round'"),
}


@pytest.fixture
def folder(tmp_path):
    """Two good fedavg runs (finals 0.5, 0.7), one whose metrics.jsonl ends in a cut-off line, and the BROKEN ones."""
    root = tmp_path / "runs"
    fake_run(root, "good-s0", {"name": "fedavg"}, 0, [0.3, 0.5])
    fake_run(root, "good-s1", {"name": "fedavg"}, 1, [0.3, 0.7])
    cut = fake_run(root, "cut-s2", {"name": "fedavg"}, 2, [0.3, 0.4])
    text = (cut / "metrics.jsonl").read_text()
    (cut / "metrics.jsonl").write_text(text + '{"round": 4, "train/loss": 0.3, "test/acc_mean_cli')
    for i, (name, (breaks, _)) in enumerate(BROKEN.items()):
        breaks(fake_run(root, name, {"name": "fedavg"}, 10 + i, [0.9, 0.9]))
    return root


def test_bad_run_directories_are_skipped_with_the_reason_and_the_rest_reported(folder):
    runs, notes = load_local([folder])
    assert sorted(r.name for r in runs) == ["cut-s2", "good-s0", "good-s1"]
    for name, (_, reason) in BROKEN.items():
        (note,) = [n for n in notes if f"/{name}:" in n]
        assert note.startswith(f"skipped {folder / name}: {reason}"), note
    cut = next(r for r in runs if r.name == "cut-s2")
    assert [row["round"] for row in cut.history] == [0, 1, 2, 3]  # the four complete rows
    (note,) = [n for n in notes if "cut-s2" in n]
    metrics = folder / "cut-s2" / "metrics.jsonl"
    assert note == f"{metrics}: line 5 is cut off (a writer killed mid-line?); read the 4 complete rows before it"
    assert len(notes) == len(BROKEN) + 1


def test_the_cli_warns_once_per_bad_run_and_reports_the_rest(folder, tmp_path, capsys):
    assert main([str(folder), "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    warnings = captured.err.splitlines()
    assert len(warnings) == len(BROKEN) + 1 and all(w.startswith("warning: ") for w in warnings)
    assert all(sum(f"/{name}:" in w for w in warnings) == 1 for name in BROKEN)
    md = (tmp_path / "report" / "report.md").read_text()
    head = cell(md, "setting")
    assert cell(md, "fedavg")[head.index("seeds")] == "3"
    assert cell(md, "fedavg")[head.index(f"{ACC} final")] == "53.3 ± 15.3"  # 0.5, 0.7, 0.4: the bad runs' 0.9 not in
    assert (tmp_path / "report" / "report.html").is_file() and (tmp_path / "report" / "plots").is_dir()


def test_only_bad_runs_is_an_error_after_the_warnings(tmp_path, capsys):
    root = tmp_path / "runs"
    (root / "a").mkdir(parents=True)
    (root / "a" / "config.yaml").write_text("seed: 0\n")
    (root / "a" / "summary.json").write_text("not json")
    with pytest.raises(ReportError) as err:
        load_local([root])
    assert err.value.notes == [f"skipped {root / 'a'}: summary.json is not readable JSON (Expecting value: line 1 "
                               "column 1 (char 0))"]
    assert main([str(root), "--out", str(tmp_path / "report")]) == 2
    err_lines = capsys.readouterr().err.splitlines()
    assert len(err_lines) == 2 and err_lines[0].startswith("warning: skipped") and err_lines[1].startswith("error: ")
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("content, reason", [
    ("{", "not readable JSON"), ("[]", "holds a list"), ('{"points": 3}', "'points' is int, expected a list"),
    ('{"points": [{"params": {"method.mu": 1}, "mean": "x"}]}', "points[0].mean is a string"),
    ('{"points": [{"params": {"method.mu": 1}, "mean": 0.5}], "best": {"params": {"lr": 1}}}',
     "'best' has no 'params' object with the swept keys ['method.mu']"),
])
def test_a_broken_sweep_json_loses_its_plot_not_the_report(tmp_path, capsys, content, reason):
    root = sweep_dir(tmp_path / "sweep", mus=(0.01, 0.1))
    (root / "sweep.json").write_text(content)
    sweeps, notes = load_sweeps([root])
    assert sweeps == [] and notes == [f"skipped {root / 'sweep.json'}: {reason}" + notes[0].split(reason, 1)[1]]
    assert main([str(root), "--out", str(tmp_path / "report")]) == 0
    assert capsys.readouterr().err.splitlines() == [f"warning: {notes[0]}"]
    assert "| fedprox mu=0.01 | 2 |" in (tmp_path / "report" / "report.md").read_text()
    assert not list((tmp_path / "report" / "plots").glob("sweep*"))


def test_out_at_a_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    root = sweep_dir(tmp_path / "sweep", mus=(0.01,))
    for out in (tmp_path / "taken", tmp_path / "taken" / "report"):
        (tmp_path / "taken").write_text("keep me")
        assert main([str(root), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: --out {out}: {tmp_path / 'taken'} is a file")
        assert (tmp_path / "taken").read_text() == "keep me"
    assert not (root / "report").exists()


def test_a_valid_sweep_json_still_reads(tmp_path):
    root = sweep_dir(tmp_path / "sweep")
    sweeps, notes = load_sweeps([root, tmp_path])  # tmp_path: no sweep.json, nothing to say
    assert notes == [] and sweeps == [json.loads((root / "sweep.json").read_text())]
