"""The command line ends its process without the interpreter's teardown (fl/run/process_exit.py), once what the run
leaves is closed: W&B torn down with the exit code, a ddp run's process group destroyed after every process got
there, logging and the streams flushed, the exit code kept."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from fl.report.wandb_access import transaction_log_history, transaction_log_records
from fl.run import process_exit
from tests.helpers import ROOT, load_ckpt, read_metrics, run_cli, tiny


class Ended(Exception):
    """os._exit, recorded instead of ending the test's process."""


def recorded_exit(monkeypatch, barrier_fails: bool = False) -> list[tuple]:
    calls: list[tuple] = []

    def barrier():
        calls.append(("barrier",))
        if barrier_fails:
            raise RuntimeError("Connection closed by peer")

    def exit_now(code):
        calls.append(("os._exit", code))
        raise Ended

    class Stream:
        def __init__(self, name):
            self.name = name

        def flush(self):
            calls.append(("flush", self.name))

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(
        teardown=lambda exit_code: calls.append(("wandb.teardown", exit_code))))
    monkeypatch.setitem(sys.modules, "torch.distributed", SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, barrier=barrier,
        destroy_process_group=lambda: calls.append(("destroy_process_group",))))
    monkeypatch.setattr(process_exit.logging, "shutdown", lambda: calls.append(("logging.shutdown",)))
    monkeypatch.setattr(sys, "stdout", Stream("stdout"))
    monkeypatch.setattr(sys, "stderr", Stream("stderr"))
    monkeypatch.setattr(process_exit.os, "_exit", exit_now)
    return calls


@pytest.mark.parametrize("barrier_fails", [False, True])
def test_the_process_ends_with_its_code_after_closing_what_the_run_left(monkeypatch, barrier_fails):
    calls = recorded_exit(monkeypatch, barrier_fails)
    with pytest.raises(Ended):
        process_exit.end_process(3)
    assert calls == [("wandb.teardown", 3), ("barrier",), ("destroy_process_group",), ("logging.shutdown",),
                     ("flush", "stdout"), ("flush", "stderr"), ("os._exit", 3)]


def test_without_wandb_or_a_process_group_it_only_flushes_and_exits(monkeypatch):
    calls = recorded_exit(monkeypatch)
    monkeypatch.delitem(sys.modules, "wandb")
    monkeypatch.setitem(sys.modules, "torch.distributed", SimpleNamespace(is_available=lambda: True,
                                                                          is_initialized=lambda: False))
    with pytest.raises(Ended):
        process_exit.end_process(0)
    assert calls == [("logging.shutdown",), ("flush", "stdout"), ("flush", "stderr"), ("os._exit", 0)]


@pytest.mark.slow
def test_a_run_that_fails_ends_its_offline_wandb_run_with_its_exit_code(out):
    """A NaN at round 2 (exit 1) through the command line's ending: W&B has rounds 0 and 1, and the run's exit
    record carries the exit code (the interpreter's exit used to write it; os._exit does not)."""
    env = {"WANDB_MODE": None, "WANDB_API_KEY": None, "WANDB_DIR": str(out / "wandb-home")}
    args = [a for a in tiny(out, "method.name=test_nan_at_round_2", "trainer.rounds=4", "fabric.cpu_threads=1",
                            "logger.run_name=nan") if not a.startswith("logger.wandb.mode")]
    res = run_cli([*args, "logger.wandb.mode=offline"], cwd=out, env=env, script=(str(ROOT / "tests" /
                                                                                       "nan_at_round.py"),))
    assert res.returncode == 1 and "non-finite" in res.stderr, res.stderr[-2000:]
    run_dir = out / "outputs" / "nan"
    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert [row["round"] for row in transaction_log_history(log)] == [0, 1] == [r["round"] for r in read_metrics(
        run_dir)]
    exits = [r.exit.exit_code for r in transaction_log_records(log) if r.WhichOneof("record_type") == "exit"]
    assert exits == [1]


@pytest.mark.slow
def test_two_processes_end_together_with_every_file_written(out):
    args = tiny(out, "fabric.cpu_threads=1", "trainer.rounds=2", "fabric.strategy=ddp", "fabric.devices=2",
                "logger.run_name=two")
    res = run_cli(args, cwd=out)
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = out / "outputs" / "two"
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1] and load_ckpt(run_dir)["round"] == 1
    assert (run_dir / "summary.json").is_file()
