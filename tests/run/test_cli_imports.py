"""The command line answers without importing what only a run or a report needs (issue 26, item 14): help,
listings, a method's help, a config error and a data error leave Lightning, W&B, cvxpy, matplotlib,
torchmetrics and torchvision unimported, so they cost about an `import torch` (bench/cli_latency.py times it).
One fresh interpreter runs every command in turn and reports what each left in sys.modules."""
from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_cli

# each of these costs as much as torch itself to import, or more
HEAVY = ("lightning", "wandb", "cvxpy", "matplotlib", "torchmetrics", "torchvision")

COMMANDS = {
    "--help": ["--help"],
    "--list methods": ["--list", "methods"],
    "--list configs": ["--list", "configs"],
    "--list datasets": ["--list", "datasets"],
    "--list models": ["--list", "models"],
    "--list evaluators": ["--list", "evaluators"],
    "method help": ["method.name=fedprox", "--help"],
    "config error": ["trainer.rounds=0"],
    "unknown method key": ["method.mu=0.1"],
    "data error": ["data.name=arrays", "data.root={missing}"],
}

PROBE = """
import contextlib, io, json, sys
from fl.run.train import main
from fl.sweep.runner import main as sweep_main
HEAVY, COMMANDS, missing = json.loads(sys.argv[1])
seen = {}
for name, argv in COMMANDS.items():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main([a.format(missing=missing) for a in argv])
    seen[name] = [code, [m for m in HEAVY if m in sys.modules]]
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    sweep_main(["--help"])
seen["fl.sweep --help"] = [0, [m for m in HEAVY if m in sys.modules]]
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_help_listings_and_errors_import_no_run_dependency(tmp_path):
    done = run_cli([json.dumps([HEAVY, COMMANDS, str(tmp_path / "missing.npz")])], cwd=ROOT, script=("-c", PROBE))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    codes = {name: code for name, (code, _) in seen.items()}
    assert codes == {**dict.fromkeys(seen, 0), "config error": 2, "unknown method key": 2, "data error": 2}
    # sys.modules only grows: the first command that shows a module is the one that imported it
    assert {name: loaded for name, (_, loaded) in seen.items() if loaded} == {}


def test_a_client_is_a_lightning_module_with_its_own_declarations(tmp_path):
    """ClientModule has no Lightning base until a client is built; the built one is the method's class with
    LightningModule after it: the method's hooks win, `functional` is the class's own, one class per method."""
    import copy

    import lightning as L

    from fl.config import load_config
    from fl.core import METHODS, ClientModule
    from fl.core.client import with_lightning
    from fl.data import build_data

    cfg = load_config(["method.name=fedprox", "data.num_clients=2", "data.embedded.samples_per_class=8",
                       f"data.root={tmp_path}", "model.width=2"])
    cls = METHODS["fedprox"].client_cls
    module = cls(cfg, build_data(cfg))
    assert not issubclass(cls, L.LightningModule) and isinstance(module, (cls, L.LightningModule))
    assert type(module) is with_lightning(cls) is with_lightning(type(module)) and type(module).__name__ == cls.__name__
    assert type(module).training_step is cls.training_step and type(module).log is ClientModule.log
    assert vars(type(module))["functional"] is True  # FedProx declares it; a subclass that does not, gets False
    assert vars(with_lightning(type("Sub", (cls,), {})))["functional"] is False
    twin = copy.deepcopy(module)
    assert type(twin) is type(module) and twin.device == module.device
