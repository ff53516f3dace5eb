"""What an evaluator returns is checked where the loop receives it (issue 47 item 1): a dict of declared metric names
-> finite numbers, else the run stops at that evaluation with one line naming the evaluator, its file, the round and
the metric; an exception inside it is reported as its own."""
from __future__ import annotations

import math

import pytest
import torch

from fl.core.evaluator_check import EvaluatorFault, as_number, checked_metrics
from fl.core.metric_directions import HIGHER
from fl.run.train import main
from tests.core.test_plugin_outputs import isolated_registry  # noqa: F401  (a fixture)
from tests.helpers import read_metrics, tiny

# what a faulty evaluator returns from round 1 on -> what the error line says
RESULTS = {
    "nan": ("{'test/zz_score': float('nan')}", "returned nan for 'test/zz_score' (round 1)"),
    "inf": ("{'test/zz_score': torch.tensor(float('inf'))}", "returned inf for 'test/zz_score' (round 1)"),
    "undeclared": ("{'test/zz_other': 0.5}", "returned 'test/zz_other' (round 1), which its metric_directions does "
                                             "not declare"),
    "string": ("{'test/zz_score': 'high'}", "returned str for 'test/zz_score' (round 1), not a number"),
    "vector": ("{'test/zz_score': torch.ones(3)}", "returned torch.Tensor for 'test/zz_score' (round 1)"),
    "none": ("None", "returned None (round 1), not a dict"),
    "raises": ("{}['missing']", "raised KeyError: 'missing'"),
}


def evaluator_file(tmp_path, name: str, result: str) -> str:
    """A plug-in module registering evaluator `name`: test/zz_score = 0.5 on round 0, `result` afterwards."""
    (tmp_path / f"{name}.py").write_text(
        "import torch\n\nfrom fl.core import Evaluator, register_evaluator\n"
        "from fl.core.metric_directions import HIGHER\n\n\n"
        "@register_evaluator\n"
        "class Score(Evaluator):\n"
        f"    name = {name!r}\n"
        "    metric_directions = {'test/zz_score': HIGHER}\n\n"
        "    def evaluate(self, ctx):\n"
        f"        return {{'test/zz_score': 0.5}} if ctx.round == 0 else {result}\n")
    return name


@pytest.mark.parametrize("fault", sorted(RESULTS))
def test_a_faulty_evaluator_result_stops_the_run_naming_the_evaluator_and_round(fault, tmp_path, capsys,
                                                                                isolated_registry):  # noqa: F811
    name = evaluator_file(tmp_path, f"zz_eval_{fault}", RESULTS[fault][0])
    code = main(tiny(tmp_path, f"plugins=[{name}]", f"trainer.evaluators=[{name}]", "trainer.rounds=3",
                     "logger.run_name=run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("error: trainer.evaluators"), err
    assert f"{name!r} ({tmp_path / name}.py:" in err[0] and RESULTS[fault][1] in err[0], err
    rows = read_metrics(tmp_path / "outputs" / "run")
    assert [r["round"] for r in rows] == [0] and rows[0]["test/zz_score"] == 0.5  # round 0 kept, nothing after it


def test_a_sound_evaluator_logs_its_numbers(tmp_path, isolated_registry):  # noqa: F811
    name = evaluator_file(tmp_path, "zz_eval_ok", "{'test/zz_score': torch.tensor(0.25), 'client/0/zz': 1}")
    assert main(tiny(tmp_path, f"plugins=[{name}]", f"trainer.evaluators=[{name}]", "trainer.rounds=2",
                     "logger.run_name=run")) == 0
    rows = read_metrics(tmp_path / "outputs" / "run")
    assert [r["test/zz_score"] for r in rows] == [0.5, 0.25] and rows[1]["client/0/zz"] == 1.0


class Declares:
    name = "declares"
    metric_directions = {"test/a": HIGHER, "server/alpha/*": HIGHER}

    def evaluate(self, ctx):
        raise AssertionError


def test_the_check_converts_numbers_and_accepts_patterns_and_per_client_keys():
    got = checked_metrics(Declares(), {"test/a": torch.tensor([0.5]), "server/alpha/3": 2, "client/7/x": 1.5}, 0)
    assert got == {"test/a": 0.5, "server/alpha/3": 2.0, "client/7/x": 1.5}
    assert all(type(v) is float for v in got.values())
    assert as_number(True) is None and as_number(torch.ones(2)) is None and as_number(3) == 3.0


def test_a_non_finite_metric_of_a_diverged_model_is_logged_not_blamed_on_the_evaluator():
    assert math.isnan(checked_metrics(Declares(), {"test/a": float("nan")}, 4, model_finite=False)["test/a"])
    with pytest.raises(EvaluatorFault, match=r"returned nan for 'test/a' \(round 4\)"):
        checked_metrics(Declares(), {"test/a": float("nan")}, 4)
