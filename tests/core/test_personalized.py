"""Each client personalised once per evaluation (fl/core/personalized.py): a method with `reuse_personalized`
fine-tunes each client once, not once per pass (its test and validation splits, the system-accuracy evaluator on
each), and every metric of the run is bitwise what personalising on every pass gives; a copy that would pass the
memory bound is not kept, and those clients are personalised again."""
from __future__ import annotations

import pytest

from fl.config import load_config
from fl.core import ClientModule, personalized
from fl.core.registry import METHODS, load_plugins
from fl.data import build_data
from tests.helpers import initial_model, read_metrics, run_tiny, tiny

# every pass that personalises: each client's test and validation splits, and the system evaluator on each
PASSES = ("data.val_fraction=0.25", "trainer.evaluators=[system]", "trainer.rounds=2", "trainer.participation=1.0")
CLIENTS, EVALUATIONS, PASSES_PER_EVALUATION = 6, 2, 4
FAST = {"fedbabu": ("method.finetune_epochs=1",), "fedavg_ft": ("method.finetune_epochs=1",),
        "perfedavg": ("method.adapt_steps=2",)}  # personalisation kept short


def opted_in() -> list[str]:
    """The methods that declare `reuse_personalized`, from the registry (one that opts in later is tested too)."""
    load_plugins()
    return sorted(name for name, spec in METHODS.items() if spec.client_cls.reuse_personalized)


def count_personalize(monkeypatch, cls: type) -> list[int]:
    calls = []
    original = cls.personalize

    def personalize(self):
        calls.append(self.cid)
        return original(self)

    monkeypatch.setattr(cls, "personalize", personalize)
    return calls


def test_the_methods_that_fine_tune_at_evaluation_declare_it():
    assert opted_in() == ["fedavg_ft", "fedbabu", "perfedavg", "pfedfda"]


@pytest.mark.parametrize("method", opted_in())
def test_each_client_is_personalised_once_per_evaluation_with_the_same_metrics(out, monkeypatch, method):
    calls = count_personalize(monkeypatch, METHODS[method].client_cls)
    extra = (f"method.name={method}", *FAST.get(method, ()), *PASSES)
    kept = read_metrics(run_tiny(out, *extra, name="kept"))
    assert sorted(calls) == sorted(list(range(CLIENTS)) * EVALUATIONS)  # once per client and evaluation
    calls.clear()
    monkeypatch.setattr(personalized, "KEEP_BYTES", 0)  # nothing kept: every pass personalises, as before
    every_pass = read_metrics(run_tiny(out, *extra, name="every_pass"))
    assert len(calls) == CLIENTS * EVALUATIONS * PASSES_PER_EVALUATION
    assert any(k.startswith("val/system_acc") for k in kept[-1]) and any(k.startswith("val/") for k in kept[-1])
    assert kept == every_pass  # bitwise: every metric, every round


def test_the_memory_bound_keeps_what_fits_and_personalises_the_rest_again(out, monkeypatch):
    calls = count_personalize(monkeypatch, METHODS["fedbabu"].client_cls)
    extra = ("method.name=fedbabu", "method.finetune_epochs=1", *PASSES)
    cfg = load_config(tiny(out, *extra))
    copy = sum(t.numel() * t.element_size() for t in initial_model(cfg, build_data(cfg)).state_dict().values())
    monkeypatch.setattr(personalized, "KEEP_BYTES", 2 * copy + copy // 2)  # room for two clients' copies
    kept = []
    original = personalized.PersonalizedModels.clear

    def clear(self):
        kept.append(self.kept_bytes)
        original(self)

    monkeypatch.setattr(personalized.PersonalizedModels, "clear", clear)
    two = read_metrics(run_tiny(out, *extra, name="two"))
    assert kept == [2 * copy] * EVALUATIONS
    # two clients personalised once per evaluation, the other four on each of the four passes
    assert len(calls) == EVALUATIONS * (2 + (CLIENTS - 2) * PASSES_PER_EVALUATION)
    monkeypatch.setattr(personalized, "KEEP_BYTES", 0)
    assert two == read_metrics(run_tiny(out, *extra, name="none"))


def test_a_method_that_does_not_declare_it_personalises_on_every_pass(out, monkeypatch):
    assert not ClientModule.reuse_personalized  # opt-in: a personalize that sets other attributes stays correct
    load_plugins()
    cls = METHODS["fedavg_ft"].client_cls
    monkeypatch.setattr(cls, "reuse_personalized", False)
    calls = count_personalize(monkeypatch, cls)
    run_tiny(out, "method.name=fedavg_ft", "method.finetune_epochs=1", *PASSES, name="undeclared")
    assert len(calls) == CLIENTS * EVALUATIONS * PASSES_PER_EVALUATION
