"""What the command line prints without running: usage, lists, a method's hyperparameters, the resolved config;
and the messages of a stopped run."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from fl.core import METHODS
from fl.run.train import main
from tests.helpers import ROOT, run_cli, tiny


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_runs_nothing(flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([flag]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m fl.train")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args", [["--list", "methods"], ["--list=methods"]])
def test_list_methods_gives_one_line_per_registered_method(args, capsys):
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(METHODS)
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)  # every one says what it is


@pytest.mark.parametrize("kind", ["configs", "datasets", "models", "evaluators", "aggregators"])
def test_list_other_kinds(kind, capsys):
    assert main(["--list", kind]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(len(line.split(maxsplit=1)) == 2 for line in lines)


def test_list_of_an_unknown_kind_is_one_line_exit_2(capsys):
    assert main(["--list", "method"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "methods" in err


def test_method_help_shows_hyperparameters_with_ranges_and_help(capsys):
    assert main(["method.name=fedprox", "--help"]) == 0
    out = capsys.readouterr().out
    assert "method.mu=" in out and ">= 0" in out and "proximal" in out.lower()


def test_method_help_shows_what_its_runs_need(capsys):
    assert main(["method.name=fedpals", "--help"]) == 0
    assert "\nneeds: data.target.distribution=partition (or other values of these keys)\n" in capsys.readouterr().out
    assert main(["method.name=fedprox", "--help"]) == 0
    assert "needs:" not in capsys.readouterr().out


def test_method_help_of_a_config_shows_its_values(capsys):
    assert main(["conf=fedacd_cifar10_dir01", "method.lam=2", "--help"]) == 0
    assert "method.lam=2.0  (float, default 1.0)" in capsys.readouterr().out


def test_dataset_help_shows_its_own_settings_with_the_configs_values(capsys):
    assert main(["conf=pfedfda_emnist", "data.name=emnist", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data.name=emnist: ") and "method.name=" not in out
    assert "data.variant='byclass'  (Optional[str], default None)  [one of byclass," in out
    assert "data.download=" in out and "data.num_clients" not in out  # its own settings, not every dataset's keys
    assert main(["data.name=embedded", "method.name=fedprox", "--help"]) == 0
    out = capsys.readouterr().out
    assert "method.mu=" in out and "data.embedded.samples_per_class=300  (int)  [>= 4]" in out


def test_help_of_an_unknown_dataset_names_the_choices(capsys):
    assert main(["data.name=cifar11", "--help"]) == 2
    assert "data.name='cifar11' is not valid; did you mean 'cifar10'?" in capsys.readouterr().err


def test_print_config_prints_the_resolved_config(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--print-config", "trainer.rounds=7"]) == 0
    cfg = OmegaConf.create(capsys.readouterr().out)
    assert cfg.trainer.rounds == 7 and cfg.method.name == "fedavg"
    assert not (tmp_path / "outputs").exists()


def test_a_key_with_a_leading_dot_is_named(capsys):
    assert main([".trainer.rounds=2"]) == 2
    err = capsys.readouterr().err
    assert "'.trainer.rounds=2'" in err and "?" not in err


@pytest.mark.slow
def test_console_scripts_are_declared_and_run():
    text = (ROOT / "pyproject.toml").read_text()
    for name, target in (("fl-train", "fl.train:entry"), ("fl-sweep", "fl.sweep.runner:main"),
                         ("fl-report", "fl.report.cli:main")):
        assert f'{name} = "{target}"' in text
    for module in ("fl.train", "fl.sweep", "fl.report", "fl.data.show"):
        res = run_cli(["--help"], cwd=ROOT, script=("-m", module))
        assert res.returncode == 0 and res.stdout.lower().lstrip().startswith(("usage", "`python")), module


@pytest.mark.slow
def test_a_nan_under_two_processes_is_reported_once(tmp_path):
    args = [*tiny(tmp_path, "method.name=test_nan_at_round_2", "trainer.rounds=4", "fabric.cpu_threads=1"),
            "fabric.strategy=ddp", "fabric.devices=2"]
    res = run_cli(args, cwd=tmp_path, script=(str(ROOT / "tests" / "nan_at_round.py"),))
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.count("non-finite") == 1, res.stderr[-2000:]


def test_evaluator_help_shows_its_settings_values_and_metric_directions(capsys):
    assert main(["trainer.evaluators=[adaptability,global_acc]", "evaluators.adaptability.every=3", "--help"]) == 0
    out = capsys.readouterr().out
    assert "evaluators.adaptability.every=3  (int, default 5)  [>= 1]" in out
    assert "test/adaptability  (lower is better)" in out and "test/acc_global_balanced  (higher is better)" in out
    assert "evaluator global_acc:" in out and "settings: none of its own" in out
    assert main(["trainer.evaluators=[nope]", "--help"]) == 2
    assert "trainer.evaluators='nope' is not valid" in capsys.readouterr().err
