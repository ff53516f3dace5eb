"""Callbacks (fl/core/callbacks.py): early stopping on a metric history the test chooses (by hand and in runs, with
resume), a user callback named by import path called in order with the right rounds, and bad entries refused in one
line."""
import json
from pathlib import Path

import pytest

from fl.config import ConfigError, load_config
from fl.core import EarlyStopping
from fl.core.callbacks import CallbackError
from fl.core.context import RoundContext
from fl.core.loop import sample_clients
from fl.run.train import main
from tests import recording_callbacks
from tests.helpers import (
    assert_same_rows,
    global_params,
    interrupted_and_resumed,
    load_ckpt,
    read_metrics,
    run_tiny,
    tiny,
    without_timing,
)
from tests.process_pairs import on_one_and_two_processes


def stop_round(callback: EarlyStopping, history: dict[int, float]) -> int | None:
    """Feed `history` (round -> value, the evaluation rounds) to the callback; the round after which it stops."""
    for rnd, value in history.items():
        ctx = RoundContext(rnd, None, None, None)
        callback.on_evaluate(ctx, {"val/acc": value})
        if ctx.stop_reason is not None:
            return rnd
    return None


@pytest.mark.parametrize("mode, min_delta, patience, history, expected", [
    # equal is no improvement; a new best resets the count
    ("max", 0.0, 3, {0: 0.1, 1: 0.3, 2: 0.3, 3: 0.29, 4: 0.35, 5: 0.34, 6: 0.34, 7: 0.33, 8: 0.9}, 7),
    # 0.35 beats 0.3 by less than min_delta: not an improvement
    ("max", 0.06, 3, {0: 0.1, 1: 0.3, 2: 0.3, 3: 0.29, 4: 0.35, 5: 0.9}, 4),
    ("min", 0.0, 2, {0: 2.0, 1: 1.5, 2: 1.6, 3: 1.4, 4: 1.4, 5: 1.45, 6: 0.1}, 5),
    # counted in evaluations, whatever their rounds: evaluations at rounds 1, 3, 5, ...
    ("max", 0.0, 2, {1: 0.5, 3: 0.4, 5: 0.6, 7: 0.6, 9: 0.55, 11: 0.9}, 9),
    # a non-finite value never improves, not even the first
    ("max", 0.0, 2, {0: float("nan"), 1: 0.2, 2: float("inf"), 3: float("nan")}, 3),
    ("max", 0.0, 2, {0: 0.1, 1: 0.2, 2: 0.3}, None),
])
def test_early_stopping_stops_after_the_evaluation_that_exhausts_patience(mode, min_delta, patience, history,
                                                                           expected):
    assert stop_round(EarlyStopping("val/acc", patience, mode, min_delta), history) == expected


def test_early_stopping_state_round_trips_and_a_missing_metric_is_named():
    a = EarlyStopping("val/acc", 3)
    stop_round(a, {0: 0.5, 1: 0.4})
    b = EarlyStopping("val/acc", 3)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == {"best": 0.5, "best_round": 0, "wait": 1}
    assert stop_round(b, {2: 0.4, 3: 0.4}) == 3
    with pytest.raises(CallbackError, match=r"trainer.early_stop.metric='val/ac' .* close: val/acc"):
        EarlyStopping("val/ac", 3).on_evaluate(RoundContext(0, None, None, None), {"val/acc": 1.0})


# ---- in runs ---------------------------------------------------------------------------------------------------------
SCRIPTED = [0.5, 0.4, 0.3, 0.45, 0.55, 0.9]  # patience 3: the best stays 0.5 for rounds 1-3: the run stops after 3
EARLY_STOP = ("trainer.rounds=6", "callbacks=[{class: tests.recording_callbacks.ScriptedMetric, values: "
              f"[{', '.join(map(str, SCRIPTED))}]}}]", "trainer.early_stop.metric=test/scripted",
              "trainer.early_stop.patience=3")


def test_a_run_stops_after_the_round_that_exhausts_patience(out, capsys):
    run = run_tiny(out, *EARLY_STOP, name="es")
    err = capsys.readouterr().err
    assert [r["round"] for r in read_metrics(run)] == [0, 1, 2, 3]
    assert [r["test/scripted"] for r in read_metrics(run)] == SCRIPTED[:4]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"]["round"] == 3 and summary["final"]["test/scripted"] == 0.45
    ckpt = load_ckpt(run)
    assert ckpt["round"] == 3 and ckpt["stopped"] == summary["stopped"]
    assert ckpt["callbacks"] == [{}, {"best": 0.5, "best_round": 0, "wait": 3}]
    line = next(x for x in err.splitlines() if x.startswith("stopped after"))
    assert line.startswith("stopped after round 3 of 0..5: early stop: test/scripted did not improve for 3 ")


def test_resume_after_an_interrupt_before_the_stop_is_exact(out, monkeypatch):
    """Ctrl-C at round 2 (the checkpoint of round 1 holds wait = 1; a fresh count would take 0.3 as its first best,
    improve on it and never stop): the resumed run stops after round 3 as the uninterrupted one does, with the same
    rows, model, callback state and summary; resuming a stopped run trains nothing more."""
    full, cut = interrupted_and_resumed(out, monkeypatch, *EARLY_STOP, "trainer.checkpoint_every=10")
    assert read_metrics(cut) == read_metrics(full)
    a, b = load_ckpt(full), load_ckpt(cut)
    assert (a["round"], a["stopped"], a["callbacks"]) == (b["round"], b["stopped"], b["callbacks"])
    ga, gb = global_params(full), global_params(cut)
    assert all(ga[k].equal(gb[k]) for k in ga)

    def summary(run):
        return {k: v for k, v in without_timing(json.loads((run / "summary.json").read_text())).items()
                if k != "run_dir"}

    assert summary(cut) == summary(full) and summary(full)["stopped"]["round"] == 3
    assert main([f"resume={full}"]) == 0
    assert read_metrics(full) == read_metrics(cut) and load_ckpt(full)["round"] == 3


def test_user_callbacks_are_called_in_order_with_the_rounds_and_narrow_contexts(out):
    """Two recorders, in config order, after the server: each training round starts, evaluates, ends, and
    checkpoints every 2 rounds and at the last; the fine-tuning round (2) only evaluates. Every hook gets a
    RoundContext (no module, no loop), a round start the round's sampled clients, a checkpoint a written file."""
    recording_callbacks.CALLS.clear()
    entries = ", ".join(f"{{class: tests.recording_callbacks.Recorder, name: {n}}}" for n in "ab")
    run_tiny(out, f"callbacks=[{entries}]", "finetune.after_round=2", "trainer.last_k=1", name="calls")
    cfg = load_config(tiny(out))
    expected = []
    for rnd in range(3):
        if rnd < 2:
            selected = sample_clients(cfg.seed, rnd, cfg.data.num_clients, cfg.trainer.participation)
            expected += [(n, "round_start", rnd, selected) for n in "ab"]
        expected += [(n, "evaluate", rnd, True) for n in "ab"]
        if rnd < 2:
            expected += [(n, "round_end", rnd, True) for n in "ab"]
        if rnd in (1, 2):  # trainer.checkpoint_every=2, and the last round
            expected += [(n, "checkpoint", rnd, True) for n in "ab"]
    assert [c[:4] for c in recording_callbacks.CALLS] == expected
    assert {c[4] for c in recording_callbacks.CALLS} == {"RoundContext"}


@on_one_and_two_processes("early_stopping", *EARLY_STOP, "data.num_clients=7", "trainer.participation=0.6")
def early_stopping_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-5)
    assert [r["round"] for r in read_metrics(two)] == [0, 1, 2, 3]
    assert load_ckpt(one)["stopped"] == load_ckpt(two)["stopped"] != None  # noqa: E711


# ---- bad entries -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry, words", [
    ("[{class: tests.no_such_module.Cb}]", "callbacks[0]: class='tests.no_such_module.Cb': cannot import"),
    ("[{class: tests.recording_callbacks.Nope}]", "tests.recording_callbacks has no Nope"),
    ("[{class: tests.recording_callbacks.Recorder, name: a, colour: red}]",
     "class='tests.recording_callbacks.Recorder' does not take"),
    ("[{class: tests.recording_callbacks.Recorder}]", "missing a required argument: 'name'"),
    ("[{class: fl.core.Server}]", "is not a subclass of fl.core.Callback"),
    # issue 47: named the missing patience (now 5 by default, as trainer.early_stop's), not the bad mode
    ("[{class: fl.core.callbacks.EarlyStopping, metric: test/acc_mean_clients, mode: sideways}]",
     "mode='sideways' is not valid"),
    ("[{name: a}]", "each entry is {class: pkg.module.Class"),
    ("[{class: Recorder}]", "is not an import path"),
])
def test_a_bad_callback_entry_is_one_line_exit_2_naming_it(out, capsys, entry, words):
    assert main(tiny(out, f"callbacks={entry}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and err.startswith("error: callbacks[0]")
    assert not (out / "outputs").exists()


def test_early_stop_settings_are_checked():
    with pytest.raises(ConfigError, match=r"trainer.early_stop.metric='val/acc_mean_clients' needs validation"):
        load_config(["trainer.early_stop.metric=val/acc_mean_clients"])
    assert load_config(["trainer.early_stop.metric=val/acc_mean_clients", "data.val_fraction=0.1"])
    for bad, key in [("trainer.early_stop.patience=0", "trainer.early_stop.patience"),
                     ("trainer.early_stop.mode=maximum", "trainer.early_stop.mode"),
                     ("trainer.early_stop.min_delta=-1", "trainer.early_stop.min_delta")]:
        with pytest.raises(ConfigError, match=key):
            load_config([bad])


def test_an_early_stop_metric_the_run_lacks_is_one_line_exit_2_before_a_run_directory(out, capsys):
    """Refused while the config is checked, from the metrics the method and its evaluators declare; it used to be
    found at the first evaluation, after training, in a run directory already made."""
    for metric, words in (("test/acc_mean_client", "did you mean 'test/acc_mean_clients'?"),
                          ("val/nope", "needs validation splits")):
        assert main(tiny(out, f"trainer.early_stop.metric={metric}")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert main(tiny(out, "trainer.early_stop.metric=val/nope", "data.val_fraction=0.2")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: trainer.early_stop.metric='val/nope' is not a metric this run logs") and \
        "val/acc_mean_clients" in err and err.count("\n") == 1
    assert not (out / "outputs").exists()


def test_early_stopping_follows_the_metrics_declared_direction():
    """mode left out: the direction the metric's logger declares (a user's lower-is-better metric stops on its
    minimum); a mode against it, or a diagnostic, is refused."""
    risk = "callbacks=[{class: tests.recording_callbacks.ScriptedRisk, values: [1.0]}]"
    assert load_config([risk, "trainer.early_stop.metric=test/risk"]).trainer.early_stop.mode == "min"
    assert load_config(["trainer.early_stop.metric=test/acc_std_clients"]).trainer.early_stop.mode == "min"
    assert load_config(["trainer.early_stop.metric=test/acc_mean_clients"]).trainer.early_stop.mode == "max"
    with pytest.raises(ConfigError, match=r"trainer.early_stop.mode='max' is against test/risk, whose logger declares "
                                          r"lower is better \(mode min\); leave mode out"):
        load_config([risk, "trainer.early_stop.metric=test/risk", "trainer.early_stop.mode=max"])
    with pytest.raises(ConfigError, match="test/absent_mass' is a diagnostic, declared neither"):
        load_config(["trainer.early_stop.metric=test/absent_mass"])


@pytest.mark.parametrize("arguments, words", [
    ("metric: test/acc_mean_clients, patience: -1", "patience=-1: the evaluations without improvement"),
    ("metric: test/acc_mean_clients, patience: 3, mode: sideways", "mode='sideways' is not valid; choices: max"),
    ("metric: test/acc_mean_clients, patience: 3, min_delta: -0.5", "min_delta=-0.5"),
    ("metric: test/nope, patience: 3", "callbacks[0].metric='test/nope' is not a metric this run logs"),
    ("metric: test/acc_mean_clients, patience: 3, mode: min", "callbacks[0].mode='min' is against"),
])
def test_early_stopping_given_as_a_callback_is_checked_before_any_work(out, capsys, arguments, words):
    entry = f"callbacks=[{{class: fl.core.EarlyStopping, {arguments}}}]"
    assert main(tiny(out, entry)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: callbacks[0]") and words in err and err.count("\n") == 1, err
    assert not (out / "outputs").exists()
    cfg = load_config([entry.replace(", mode: min", "").replace("test/nope", "test/acc_std_clients")
                       .replace("-1", "2").replace(", mode: sideways", "").replace("-0.5", "0.1")])
    assert cfg.callbacks[0].mode == ("min" if "nope" in arguments else "max")  # filled from the metric
