"""fl.testing (issue 47 item 3): the checks fl's conformance tests run on every built-in, called on an outside
package's plug-ins as its author would from their own tests: docs/plugins.md's mystudy package passes them, and a
server that keeps state outside state_dict fails the resume check, which is what it is for."""
from __future__ import annotations

import sys

import pytest

from fl.testing import CheckFailed, check_plugin
from tests.core.test_plugins import isolated_registry, study_package  # noqa: F401  (a fixture)

PLUGIN = ["mystudy.fl_plugin"]
QUADRANTS = ["data.name=quadrants", "model.name=flat_mlp", "data.num_clients=4", "trainer.participation=1.0"]


@pytest.fixture
def mystudy(tmp_path, monkeypatch, isolated_registry):  # noqa: F811
    """docs/plugins.md's package, importable as a user's installed package would be; imported afresh by each test
    (the registry is restored after each)."""
    monkeypatch.syspath_prepend(str(study_package(tmp_path, entry_point=False)))
    yield tmp_path / "work"
    for name in [n for n in sys.modules if n == "mystudy" or n.startswith("mystudy.")]:
        del sys.modules[name]


@pytest.mark.parametrize("kind, name, overrides", [
    ("aggregator", "uniform_mean", []),
    ("method", "fedavg_smooth", []),
    ("dataset", "quadrants", QUADRANTS[1:]),
    ("partition", "round_robin", QUADRANTS),
    ("client transform", "darken", []),
    ("model", "flat_mlp", []),
    ("evaluator", "confidence", []),
])
def test_an_outside_packages_plugins_pass_the_checks_without_processes(kind, name, overrides, mystudy):
    check_plugin(kind, name, mystudy, plugins=PLUGIN, overrides=overrides, processes=False)


def test_a_server_keeping_state_outside_state_dict_fails_the_resume_check(tmp_path, monkeypatch, isolated_registry):  # noqa: F811
    (tmp_path / "zz_forgetful.py").write_text(
        "from dataclasses import dataclass\n\n"
        "from fl.config import MethodConfig\n"
        "from fl.core import ClientModule, Server, register_method\n\n\n"
        "@dataclass\nclass Config(MethodConfig):\n    name: str = 'zz_forgetful'\n\n\n"
        "class Forgetful(Server):\n"
        "    steps = 0  # rounds stepped: kept on the object, not in state_dict, so a resumed run starts it at 0\n\n"
        "    def server_step(self, ctx, mean, messages):\n"
        "        self.steps += 1\n"
        "        super().server_step(ctx, self.step_towards(mean, 1.0 / self.steps), messages)\n\n\n"
        "register_method('zz_forgetful', Config, ClientModule, Forgetful)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CheckFailed, match=r"method 'zz_forgetful' fails 1 check\(s\):\n- resume: resumed differs "
                                          r"from uninterrupted at .*state kept outside state_dict"):
        check_plugin("method", "zz_forgetful", tmp_path / "work", plugins=["zz_forgetful"], processes=False)


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind='callback': one of method, aggregator, dataset, partition, client "):
        check_plugin("callback", "cnn", ".")


@pytest.mark.slow
def test_the_process_check_runs_the_plugin_on_one_and_two_processes(mystudy):
    check_plugin("aggregator", "uniform_mean", mystudy, plugins=PLUGIN)
    assert (mystudy / "outputs" / "check_two" / "summary.json").is_file()
