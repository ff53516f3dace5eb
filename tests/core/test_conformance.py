"""The shared tests every plug-in gets (issue 34, item 5), parametrized from the registries (tests/conformance.py):
a method, dataset, partition, client transform or aggregator file added under fl/ is picked up with no test edited.

- every method, and every aggregator (with FedAvg's clients): resumed equals uninterrupted, bit for bit;
- every data plug-in: one round, and the same clients built twice from the same seed (what resume and every process
  rely on); a dataset that reads files refuses an empty data.root in one line naming it;
- all of them on 1 process (in the test's) and on 2 (slow: one start-up per group of runs, tests/every_method.py).

Elsewhere from the same lists: every method trains a round under 16-mixed and bf16-mixed
(tests/core/test_precision.py), every method that declares a functional step trains K clients at once as one at a
time (tests/core/test_parallel_clients.py), every aggregator's chunked computation (tests/core/test_aggregation.py),
every method's docs page and index row (tests/repo/test_docs.py)."""
from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable

import lightning.fabric.plugins.precision as fabric_precision
import pytest

from fl.config import load_config
from fl.data import build_data
from fl.run.train import main
from fl.testing import check_plugin, close_state, same_state
from tests import conformance, process_pairs
from tests.data.test_data_plugins import data_hash
from tests.helpers import (
    ROOT,
    assert_same_rows,
    load_ckpt,
    read_metrics,
    run_cli,
    tiny,
)
from tests.jumpy_loss_scale import precision_class


# every method, and every aggregator with FedAvg's clients: fl.testing's check, as an outside plug-in's author runs it
# (contract, then resumed = uninterrupted bit for bit); 1 vs 2 processes in groups below, one start-up a group
@pytest.mark.parametrize("method", conformance.METHODS)
def test_every_method_resumed_equals_uninterrupted(out, method):
    check_plugin("method", method, out, overrides=[*conformance.FASTER.get(method, ()), *conformance.SMALL],
                 processes=False)


@pytest.mark.parametrize("aggregator", conformance.AGGREGATORS)
def test_every_aggregator_resumed_equals_uninterrupted(out, aggregator):
    check_plugin("aggregator", aggregator, out, overrides=[*conformance.aggregator_args(aggregator)[1:],
                                                           "data.num_clients=8", "data.embedded.samples_per_class=16"],
                 processes=False)


@pytest.mark.parametrize("model", conformance.MODELS)
def test_every_model_resumed_equals_uninterrupted(out, model):
    check_plugin("model", model, out, overrides=list(conformance.SMALL), processes=False)


@pytest.mark.parametrize("evaluator", conformance.EVALUATORS)
def test_every_evaluator_resumed_equals_uninterrupted(out, evaluator):
    check_plugin("evaluator", evaluator, out, overrides=[*conformance.EVALUATOR_SETTINGS.get(evaluator, ()),
                                                         *conformance.SMALL], processes=False)


DATA_PLUGINS = ([("dataset", n) for n in conformance.DATASETS] + [("partition", n) for n in conformance.PARTITIONS]
                + [("client transform", n) for n in conformance.CLIENT_TRANSFORMS])


@pytest.mark.parametrize("kind, name", DATA_PLUGINS, ids=lambda v: v.replace(" ", "_"))
def test_every_data_plugin_runs_a_round_and_builds_the_same_clients_twice(out, kind, name):
    args = conformance.data_args(kind, name, str(out))
    if isinstance(args, str):  # no generated configuration takes it: a dataset on disk, refused in one line
        assert kind == "dataset", f"{kind} {name!r} runs in none of the small configurations: {args}"
        assert main(tiny(out, f"data.name={name}", optional=conformance.SMALL)) == 2
        assert "\n" not in args and str(out / "data") in args, args
        assert not (out / "outputs").exists()
        return
    cfg = load_config(tiny(out, *args, optional=conformance.SMALL))
    assert data_hash(build_data(cfg)) == data_hash(build_data(cfg))
    assert main(tiny(out, *args, "trainer.rounds=1", "logger.run_name=run", optional=conformance.SMALL)) == 0
    row = read_metrics(out / "outputs" / "run")[0]
    assert math.isfinite(row["train/loss"]) and 0.0 <= row["test/acc_mean_clients"] <= 1.0


# ---- 1 vs 2 processes ------------------------------------------------------------------------------------------------
TWO = ("trainer.rounds=2", "data.num_clients=4", "trainer.participation=0.75", "fabric.cpu_threads=1",
       "data.embedded.samples_per_class=16")  # SMALL's 4 clients, 3 a round: 2 on one process, 1 on the other


def same_run(bitwise: bool):
    """A plug-in's run on 1 and 2 processes: the same metrics within float32 reduction order (bit for bit for the
    aggregators that keep every upload) and the same server state (a method's own, such as FedMosaic's pseudo-labels,
    where it keeps no global model)."""
    def check(one, two) -> None:
        sa, sb = (load_ckpt(d)["server"] for d in (one, two))
        if bitwise:
            assert read_metrics(one) == read_metrics(two)
            assert same_state(sa, sb) == []
        else:
            assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-5)
            assert close_state(sa, sb, atol=1e-5) == []
    return check


def every_run(out) -> dict[str, tuple[Callable[[tuple, str], list[str]], Callable]]:
    """name -> (its arguments given a side's extra ones and a run name, the check of its 1- and 2-process run
    directories): every method, every aggregator (every upload gathered in client order: bitwise), every data
    plug-in with a generated configuration, in TWO's federation; and the runs other tests declare
    (tests/process_pairs.py) in their own."""
    plugin_runs = {f"method_{m}": (conformance.method_args(m), False) for m in conformance.METHODS}
    plugin_runs.update({f"aggregator_{a}": (conformance.aggregator_args(a), True) for a in conformance.AGGREGATORS})
    for kind, name in DATA_PLUGINS:
        args = conformance.data_args(kind, name, str(out))
        if not isinstance(args, str):
            plugin_runs[f"{kind.replace(' ', '_')}_{name}"] = (args, False)
    runs = {name: (functools.partial(lambda a, extra, run: tiny(out, *a, *extra, f"logger.run_name={run}",
                                                                optional=TWO), args), same_run(bitwise))
            for name, (args, bitwise) in plugin_runs.items()}
    for name, (args, check) in process_pairs.declared().items():
        runs[f"pair_{name}"] = (functools.partial(lambda a, extra, run: tiny(out, "fabric.cpu_threads=1", *a, *extra,
                                                                             f"logger.run_name={run}"), args), check)
    return runs


GROUPS = 2


def run_here(listed: dict[str, list[str]], monkeypatch) -> list[str]:
    """The 1-process side in this process, each run isolated as a warm worker isolates one (fl/sweep/warm_worker.py),
    a 16-mixed run with tests/every_method.py's scaler: the runs that did not exit 0."""
    from fl.sweep.warm_worker import isolated

    plain = fabric_precision.MixedPrecision
    failed = []
    for name, args in listed.items():
        monkeypatch.setattr(fabric_precision, "MixedPrecision", precision_class(args, plain))
        with isolated():
            code = main(args)
        if code != 0:
            failed.append(f"{name} exited {code}")
    return failed


@pytest.mark.slow
@pytest.mark.parametrize("group", range(GROUPS))
def test_every_plugin_and_declared_run_on_one_and_two_processes(out, group, monkeypatch):
    """A share of every_run's runs, each on 1 process (in this one) and on 2 (Fabric ddp, gloo; the runs in one
    process pair, one start-up a side, tests/every_method.py), each checked by its own check."""
    runs = dict(sorted(every_run(out).items())[group::GROUPS])
    assert run_here({name: arguments((), f"one_{name}") for name, (arguments, _) in runs.items()}, monkeypatch) == []
    two = ("fabric.strategy=ddp", "fabric.devices=2")
    listed = [arguments(two, f"two_{name}") for name, (arguments, _) in runs.items()]
    (out / "two.json").write_text(json.dumps(listed))
    res = run_cli([str(out / "two.json")], cwd=out, script=(str(ROOT / "tests" / "every_method.py"),), timeout=560)
    exited = re.findall(r"run (\S+) exited (-?\d+)", res.stdout)  # every process's (their lines may interleave)
    failed = [f"{run} exited {code}" for run, code in exited if code != "0"]
    missing = {f"two_{name}" for name in runs} - {run for run, code in exited if code == "0"}
    assert res.returncode == 0 and not failed and not missing, (failed, missing, res.stderr[-3000:])
    differ = []
    for name, (_, check) in runs.items():
        try:
            check(out / "outputs" / f"one_{name}", out / "outputs" / f"two_{name}")
        except AssertionError as err:
            differ.append(f"{name}: {(str(err).splitlines() or [type(err).__name__])[0][:200]}")
    assert differ == []


def test_every_module_that_declares_a_run_on_one_and_two_processes_is_listed():
    line = "from tests.process_pairs import " + "on_one_and_two_processes"  # not this file's own line
    declaring = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "tests").rglob("test_*.py")
                 if line in p.read_text()}
    assert declaring == set(process_pairs.MODULES)
