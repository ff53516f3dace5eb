"""Runs that tests elsewhere compare on 1 process and on 2 (Fabric ddp, gloo), gathered so that they share the process
pairs of the conformance groups (tests/core/test_conformance.py): every such run costs a run, not three process
start-ups. A test module declares one beside what it checks:

    @on_one_and_two_processes("scaffold", "method.name=scaffold", "trainer.rounds=4", "data.num_clients=7")
    def scaffold_same_on_one_and_two_processes(one: Path, two: Path) -> None:
        assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-5)

The run is the tiny one (one intra-op thread) with those arguments; the function asserts on its two run directories.
The module is listed in MODULES (a test checks that every declaring module is)."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

MODULES = (
    "tests.core.test_callbacks",
    "tests.core.test_loop",
    "tests.core.test_parallel_clients",
    "tests.core.test_plugin_outputs",
    "tests.core.test_precision",
    "tests.core.test_shared_evaluation",
    "tests.core.test_state_store",
    "tests.methods.test_baselines_confree",
    "tests.methods.test_baselines_fedas",
    "tests.methods.test_fedacd",
    "tests.methods.test_fedmosaic",
    "tests.methods.test_personal_models",
    "tests.methods.test_pfedfda",
    "tests.methods.test_scaffold",
    "tests.methods.test_split_models",
    "tests.metrics.test_adaptability_sampling",
    "tests.metrics.test_system_metrics",
)

Check = Callable[[Path, Path], None]
PAIRS: dict[str, tuple[tuple[str, ...], Check]] = {}


def on_one_and_two_processes(name: str, *args: str) -> Callable[[Check], Check]:
    """Register the tiny run with `args` under `name`, checked on its 1- and 2-process run directories by the function
    it decorates."""
    def register(check: Check) -> Check:
        if name in PAIRS and PAIRS[name][1] is not check:
            raise ValueError(f"two runs on 1 and 2 processes are named {name!r}")
        PAIRS[name] = (tuple(args), check)
        return check
    return register


def declared() -> dict[str, tuple[tuple[str, ...], Check]]:
    """Every declared run: MODULES imported."""
    for module in MODULES:
        importlib.import_module(module)
    return dict(PAIRS)
