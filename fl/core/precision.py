"""Float32 islands under mixed precision, and the loss scaler of `fabric.precision=16-mixed`.

Autocast runs matmuls and convolutions in float16/bfloat16. Where a paper's math compares nearly equal numbers
(LDA logits whose terms cancel, routing argmaxes, density ratios), solves a linear system or takes a finite
difference, 8 or 11 bits of mantissa change the answer: such a function is decorated `@float32_island` and runs
in float32 under bf16-mixed and 16-mixed, while the rest of the model trains under autocast.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, Optional, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])
HALF = (torch.float16, torch.bfloat16)
AUTOCAST_DEVICES = ("cpu", "cuda", "mps", "xpu")


def _widened(value: Any) -> Any:
    return value.float() if torch.is_tensor(value) and value.dtype in HALF else value


def float32_island(fn: F) -> F:
    """`fn` runs with autocast off and, where autocast was on, its float16/bfloat16 tensor arguments (autocast's
    outputs) widened to float32; float32 and float64 arguments pass unchanged (64-true stays float64). Without
    autocast (32-true, 64-true, and 16-true/bf16-true, whose parameters are half: their math stays in the dtype the
    run chose) it changes nothing. Parameters `fn` reads from a module keep their dtype: float32 under the mixed
    precisions, which keep parameters in float32."""
    @functools.wraps(fn)
    def island(*args, **kwargs):
        on = [device for device in AUTOCAST_DEVICES if torch.is_autocast_enabled(device)]
        if not on:
            return fn(*args, **kwargs)
        with ExitStack() as stack:
            for device in on:
                stack.enter_context(torch.autocast(device, enabled=False))
            return fn(*map(_widened, args), **{k: _widened(v) for k, v in kwargs.items()})
    return island  # type: ignore[return-value]


def loss_scaler(fabric) -> Optional[torch.amp.GradScaler]:
    """The GradScaler of `fabric.precision=16-mixed` (Fabric's precision plugin holds it), or None: no scaling."""
    precision = getattr(getattr(fabric, "strategy", None), "precision", None)
    scaler = getattr(precision, "scaler", None)
    return scaler if scaler is not None and scaler.is_enabled() else None
