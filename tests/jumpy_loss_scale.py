"""`fabric.precision=16-mixed` on the CPU with a loss scale that moves at every step (2^20 to start: the first steps
overflow float16 and halve it; each good step doubles it), so which steps the scaler skips depends on everything
the scaler saw before. `jumpy` replaces Fabric's plugin class where fl.run.train's make_fabric imports it from
(tests patch it in-process); run as a script (`python tests/jumpy_loss_scale.py key=value ...`) it does so in
processes of their own (ddp)."""
import sys

import lightning.fabric.plugins.precision as fabric_precision
import torch
from lightning.fabric.plugins.precision import MixedPrecision

import fl.run.train


def jumpy(precision: str, device: str) -> MixedPrecision:
    return MixedPrecision(precision, device, torch.amp.GradScaler(device, init_scale=2.0 ** 20, growth_interval=1))


def precision_class(args: list[str], plain):
    """What the runs of the conformance groups (tests/every_method.py, tests/core/test_conformance.py) build their
    mixed precision with: the jumpy scaler for a 16-mixed run, Fabric's own `plain` for any other."""
    return jumpy if "fabric.precision=16-mixed" in args else plain


if __name__ == "__main__":
    fabric_precision.MixedPrecision = jumpy
    sys.exit(fl.run.train.main(sys.argv[1:]))
