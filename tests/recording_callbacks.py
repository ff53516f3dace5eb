"""Callbacks a test config names by import path (`callbacks: [{class: tests.recording_callbacks.Recorder}]`): one
records every call it gets, two write a metric whose history the test chooses (one higher-is-better, one lower)."""
from fl.core import Callback
from fl.core.metric_directions import HIGHER, LOWER

CALLS: list[tuple] = []  # (name, hook, round, what the hook got): filled by in-process runs, cleared by the test


class Recorder(Callback):
    def __init__(self, name: str):
        self.name = name

    def on_round_start(self, ctx, selected):
        CALLS.append((self.name, "round_start", ctx.round, list(selected), type(ctx).__name__))

    def on_evaluate(self, ctx, metrics):
        CALLS.append((self.name, "evaluate", ctx.round, "test/acc_mean_clients" in metrics, type(ctx).__name__))

    def on_round_end(self, ctx, metrics):
        CALLS.append((self.name, "round_end", ctx.round, "train/loss" in metrics, type(ctx).__name__))

    def on_checkpoint(self, ctx, path):
        CALLS.append((self.name, "checkpoint", ctx.round, path.is_file(), type(ctx).__name__))


class ScriptedMetric(Callback):
    """Puts values[round] into each evaluation's metrics as `key`."""

    metric_directions = {"test/scripted": HIGHER}

    def __init__(self, values: list, key: str = "test/scripted"):
        self.values, self.key = values, key

    def on_evaluate(self, ctx, metrics):
        metrics[self.key] = float(self.values[ctx.round])


class ScriptedRisk(Callback):
    """A user's lower-is-better metric, test/risk (values[round] at each evaluation), declared so where it is
    logged."""

    metric_directions = {"test/risk": LOWER}

    def __init__(self, values: list):
        self.values = values

    def on_evaluate(self, ctx, metrics):
        metrics["test/risk"] = float(self.values[ctx.round])
