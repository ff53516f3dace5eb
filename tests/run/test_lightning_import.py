"""A run loads Lightning without torchvision and scipy.signal (fl/run/lightning_import.py): torchmetrics, which
Lightning imports, gets stand-ins for them while it loads, and what it bound to them loads the real modules when used.
In a fresh interpreter: the pytest process has imported Lightning already."""
from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_cli, tiny

PROBE = """
import json, sys
from fl.run.train import main
assert main(json.loads(sys.argv[1])) == 0
loaded = {m: m in sys.modules for m in ("lightning", "torchmetrics", "torchvision", "scipy.signal", "torch._dynamo")}
arniqa = sys.modules["torchmetrics.functional.image.arniqa"]  # bound torchvision names while it was deferred
network = type(arniqa.resnet50(weights=None)).__name__
import scipy, torchvision  # scipy serves scipy.signal as an attribute: the stand-in has left it
print(json.dumps({"loaded": loaded, "network": network, "real": [type(torchvision.models.resnet18).__name__,
                  scipy.signal.windows.hann(3).tolist()]}))
"""


@pytest.mark.slow
def test_a_run_imports_neither_torchvision_nor_scipy_signal_and_torchmetrics_still_works(out):
    done = run_cli([json.dumps(tiny(out, "trainer.rounds=1"))], cwd=ROOT, script=("-c", PROBE))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    # torch._dynamo stays: Lightning's Fabric wrappers import it, and torch's optimizers at their first step
    assert seen["loaded"] == {"lightning": True, "torchmetrics": True, "torchvision": False, "scipy.signal": False,
                              "torch._dynamo": True}
    assert seen["network"] == "ResNet" and seen["real"] == ["function", [0.0, 1.0, 0.0]]
