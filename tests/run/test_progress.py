"""The console of a run (fl/run/progress.py) and the round's wall time: the headline metric in the progress
line, time/round_s in metrics.jsonl, rounds numbered from 0 as in the files, and plain flushed lines (one per
evaluation round) when the output is a file, as in a sweep's run logs."""
import contextlib
import io
import json
import re

import pytest
import yaml

from fl.core.evaluation import summarize_clients
from fl.report.aliases import RENAMED
from fl.report.summary import summarize_history
from fl.run.progress import STANDARD_KEYS, RoundProgress, format_summary
from fl.sweep.runner import Job, train_argv
from fl.sweep.spec import parse_sweep
from tests.helpers import TINY, read_metrics, run_cli, run_tiny, tiny

LINE = re.compile(r"^round (\d+) of 0\.\.(\d+): (.*)$")


class FileLike(io.StringIO):
    """A log file: not a terminal; counts the flushes."""

    flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def rows_for(rounds: int, eval_rounds: set[int]) -> list[dict]:
    """Fake metrics as the loop passes them: training keys every round, test/* on evaluation rounds."""
    out = []
    for r in range(rounds):
        row = {"train/loss": 1.0 / (r + 1), "time/round_s": 0.5 + r, "client/0/loss": 0.3}
        if r in eval_rounds:
            row.update({"test/acc_mean_clients": 0.1 * r, "test/acc_global_micro": 0.05 * r,
                        "test/target_acc": 0.2 + r / 100, "client/0/acc": 0.1})
        out.append(row)
    return out


def test_the_progress_line_leads_with_the_methods_headline_metric():
    stream = FileLike()
    progress = RoundProgress(2, 0, headline="test/target_acc", stream=stream)
    for r, row in enumerate(rows_for(2, {1})):
        progress.update(r, row)
    progress.close()
    (line,) = stream.getvalue().splitlines()
    text = LINE.match(line).group(3)
    assert text.startswith("target_acc=0.2100 ")  # the headline first, then the usual keys
    assert "acc_mean_clients=0.1000" in text and "acc_global_micro=0.0500" in text and "loss=0.5000" in text
    # no headline given (or a method without one): the mean client accuracy leads
    stream = FileLike()
    progress = RoundProgress(2, 0, stream=stream)
    for r, row in enumerate(rows_for(2, {1})):
        progress.update(r, row)
    assert LINE.match(stream.getvalue().strip()).group(3).startswith("acc_mean_clients=0.1000 ")


def test_on_a_file_progress_is_one_flushed_line_per_evaluation_round_with_its_time():
    stream = FileLike()
    progress = RoundProgress(6, 0, stream=stream)
    for r, row in enumerate(rows_for(6, {1, 3, 5})):
        progress.update(r, row)
        if r in (1, 3, 5):  # a line reaches the file as soon as the round ends: `tail -f` follows the run
            assert stream.getvalue().count("\n") == (r + 1) // 2 and stream.flushes == (r + 1) // 2
    progress.close()
    lines = [LINE.match(s) for s in stream.getvalue().splitlines()]
    assert [(int(m.group(1)), int(m.group(2))) for m in lines] == [(1, 5), (3, 5), (5, 5)]  # 0-based, as the files
    assert [m.group(3).endswith(f"round_s={0.5 + r:.2f}") for m, r in zip(lines, (1, 3, 5))] == [True] * 3
    assert "\r" not in stream.getvalue()  # no bar redrawn in place


def test_on_a_terminal_the_bar_shows_the_round_index_and_headline():
    stream = Terminal()
    progress = RoundProgress(4, 0, headline="test/target_acc", stream=stream)
    for r, row in enumerate(rows_for(2, {1})):
        progress.update(r, row)
    progress.close()
    assert "round=1 target_acc=0.2100" in stream.getvalue() and "2/4" in stream.getvalue()


@pytest.fixture(scope="module")
def progress_run(tmp_path_factory):
    """A tiny run with its progress on, rounds 0..3 evaluated on 1 and 3; its run dir, stdout and stderr."""
    out = tmp_path_factory.mktemp("progress")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        run_dir = run_tiny(out, "logger.progress=true", "trainer.rounds=4", "trainer.eval_every=2",
                           "evaluators.adaptability.every=2", name="p")
    return run_dir, stdout.getvalue(), stderr.getvalue()


def test_every_round_logs_its_wall_time(progress_run):
    run_dir, _, _ = progress_run
    rows = read_metrics(run_dir, timing=True)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert all(isinstance(r["time/round_s"], float) and 0 < r["time/round_s"] < 600 for r in rows)
    # its evaluation and its evaluators (rounds 1 and 3) are parts of it (bench/reproduce_budget.py splits by them)
    assert [r["time/eval_s"] > 0 for r in rows] == [False, True, False, True]
    assert all(r["time/eval_s"] + r["time/evaluators_s"] < r["time/round_s"] for r in rows)
    assert rows[1]["time/evaluators_s"] > 0 and rows[3]["time/evaluators_s"] > 0
    # the rows tests compare leave it out: it is the one value that differs between identical runs
    assert not any(k.startswith("time/") for r in read_metrics(run_dir) for k in r)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["time/round_s"] == rows[-1]["time/round_s"]


def test_console_rounds_are_the_files_rounds(progress_run):
    run_dir, stdout, stderr = progress_run
    rows = {r["round"]: r for r in read_metrics(run_dir, timing=True)}
    printed = [m for m in map(LINE.match, stderr.splitlines()) if m]
    assert [int(m.group(1)) for m in printed] == [r for r, row in rows.items() if "test/acc_mean_clients" in row]
    for m in printed:  # the line of round r shows metrics.jsonl's row r
        row, text = rows[int(m.group(1))], m.group(3)
        assert int(m.group(2)) == 3
        assert f"acc_mean_clients={row['test/acc_mean_clients']:.4f}" in text
        assert f"round_s={row['time/round_s']:.2f}" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    table = {line.split()[0]: line.split() for line in stdout.splitlines() if line.startswith(("test/", "train/"))}
    assert "@round" in stdout
    for key, fields in table.items():  # the summary table's best round is summary.json's; a diagnostic has none
        assert (int(fields[3]) if fields[3] != "—" else None) == summary["best_round"].get(key)
    assert table["test/absent_mass"][2:4] == ["—", "—"] and summary["directions"]["test/absent_mass"] is None


def printed_order(text: str) -> list[str]:
    """The summary's metric rows, its "diagnostics" heading and its per-round line, in printed order."""
    return [line.split()[0] if line.startswith(("test/", "train/")) else line.split(" (")[0]
            for line in text.splitlines() if line.startswith(("test/", "train/", "diagnostics", "per round"))]


def test_the_summary_leads_with_the_headline_and_the_standard_accuracies_then_the_diagnostics():
    row = {"test/acc_global_client_dist": 0.7, "test/adaptability": 0.3, "test/acc_mean_clients": 0.8,
           "test/kl_PQ": 1.5, "test/acc_global_balanced": 0.6, "test/acc_global_micro": 0.9, "test/acc_micro": 0.85,
           "train/loss": 0.2, "comm/bytes_up": 3 * 2**20, "comm/bytes_down": 2**20, "time/round_s": 1.5}
    summary = summarize_history([{"round": 0, **row}], last_k=5)
    summary["headline"] = "test/acc_global_balanced"  # FedACD's
    text = format_summary(summary)
    assert printed_order(text) == [
        "test/acc_global_balanced", "test/acc_mean_clients", "test/acc_global_micro", "test/acc_micro", "train/loss",
        "diagnostics", "test/acc_global_client_dist", "test/adaptability", "test/kl_PQ", "per round"]
    assert "per round (mean of the last 1 round): time 1.50 s, comm 3.00 MiB up, 1.00 MiB down" in text
    summary["headline"] = None  # a baseline: the mean client accuracy leads, FedACD's accuracy is a diagnostic
    assert printed_order(format_summary(summary)) == [
        "test/acc_mean_clients", "test/acc_global_micro", "test/acc_micro", "train/loss", "diagnostics",
        "test/acc_global_client_dist", "test/adaptability", "test/kl_PQ", "test/acc_global_balanced", "per round"]


def test_the_last_column_is_labelled_with_how_many_values_it_averages():
    """trainer.last_k=5 over a 3-round run averages 3 evaluations: the column says `last 3` (it said `last 5`); rows
    that average different counts (evaluations every other round, the loss every round) get a k column."""
    rows = [{"round": r, "test/acc_mean_clients": 0.1 * r, "train/loss": 1.0 / (r + 1), "time/round_s": 1.0 + r}
            for r in range(3)]
    text = format_summary(summarize_history(rows, last_k=5))
    head = text.splitlines()[0].split()
    assert head[-2:] == ["last", "3"] and "(mean of the last 3 rounds)" in text
    loss = next(line for line in text.splitlines() if line.startswith("train/loss")).split()
    assert float(loss[-1]) == pytest.approx(round((1 + 1 / 2 + 1 / 3) / 3, 4))
    sparse = [{k: v for k, v in row.items() if row["round"] != 1 or not k.startswith("test/")} for row in rows]
    text = format_summary(summarize_history(sparse, last_k=5))
    assert text.splitlines()[0].split()[-3:] == ["last", "k", "k"]
    counts = {line.split()[0]: line.split()[-1] for line in text.splitlines() if line.startswith(("test/", "train/"))}
    assert counts == {"test/acc_mean_clients": "2", "train/loss": "3"}


def test_every_accuracy_of_the_client_evaluation_is_a_standard_one():
    import torch

    keys = summarize_clients(torch.tensor([3.0, 4.0]), torch.tensor([5.0, 5.0]), [10, 20]).keys()
    extra = {"test/acc_original_clients", "test/acc_new_clients", "test/acc_global_micro"}  # evaluate_clients'
    assert set(STANDARD_KEYS) >= {*keys, *extra}


def test_a_runs_summary_uses_the_new_names_and_prints_the_diagnostics_below(progress_run):
    run_dir, stdout, _ = progress_run
    final = json.loads((run_dir / "summary.json").read_text())["final"]
    assert {"test/acc_global_micro", "test/acc_global_balanced", "test/acc_global_client_dist"} <= final.keys()
    assert not final.keys() & RENAMED.keys()
    order = printed_order(stdout)
    split = order.index("diagnostics")
    assert order[0] == "test/acc_mean_clients" and "test/acc_global_micro" in order[:split]
    assert {"test/acc_global_balanced", "test/acc_global_client_dist", "test/adaptability"} <= set(order[split:])
    assert order[-1] == "per round"


def test_a_sweep_leaves_its_runs_progress_on(tmp_path):
    sweep = parse_sweep({"program": "fl.train", "command": ["python", "-m", "fl.train", "${args_no_hyphens}"],
                         "method": "grid", "parameters": {"optim.lr": {"values": [0.1]}}})
    job = Job("p000-x", {"optim.lr": 0.1}, 0, tmp_path / "p000-x-s0")
    assert not any(a.startswith("logger.progress") for a in train_argv(sweep, job, []))
    (job.run_dir / "checkpoints").mkdir(parents=True)
    (job.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")  # resumed: the same
    assert not any(a.startswith("logger.progress") for a in train_argv(sweep, job, []))


@pytest.mark.slow
def test_a_sweep_runs_log_has_one_line_per_evaluation_round(tmp_path):
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(yaml.safe_dump({"program": "fl.train", "method": "grid",
                                          "command": ["python", "-m", "fl.train", "${args_no_hyphens}"],
                                          "metric": {"name": "test/acc_mean_clients", "goal": "maximize"},
                                          "parameters": {"optim.lr": {"values": [0.05]}}}))
    args = [a for a in tiny(tmp_path, "trainer.rounds=4", "trainer.eval_every=2", "evaluators.adaptability.every=2")
            if a not in ("logger.progress=false",) and not a.startswith("logger.output_dir")]
    assert "logger.progress=false" in TINY and "logger.progress=false" not in args
    res = run_cli([str(sweep_file), "--seeds", "0", "--out", str(tmp_path / "sweeps"), *args], cwd=tmp_path,
                  script=("-m", "fl.sweep"))
    assert res.returncode == 0, res.stderr + res.stdout
    logs = tmp_path / "sweeps" / "tiny" / "logs"
    assert str(logs) in res.stdout  # the sweep says where to follow its runs
    (log,) = logs.glob("*.log")
    lines = [m for m in map(LINE.match, log.read_text().splitlines()) if m]
    assert [(int(m.group(1)), int(m.group(2))) for m in lines] == [(1, 3), (3, 3)]
    assert all("acc_mean_clients=" in m.group(3) and "round_s=" in m.group(3) for m in lines)


def test_a_runs_progress_leads_with_its_methods_headline(out, capsys):
    import torch

    torch.set_num_threads(1)
    # FedACD's headline: the global model's balanced accuracy
    run_tiny(out, "method.name=fedacd", "trainer.rounds=2", "logger.progress=true", name="acd")
    lines = [m.group(3) for m in map(LINE.match, capsys.readouterr().err.splitlines()) if m]
    assert lines and all(text.startswith("acc_global_balanced=") for text in lines)
