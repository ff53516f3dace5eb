"""`fabric.deterministic=true`: the same run on the same GPU model and software gives the same bits.

It turns on torch's deterministic algorithms (cuDNN picks deterministic convolution kernels, index and scatter ops
use their sorted forms, Inductor stops benchmarking kernels) and sets CUBLAS_WORKSPACE_CONFIG, which cuBLAS reads
when a process makes its first handle, so it is set before the run touches the GPU (and a value the user set is
kept). torch's `warn_only`: an op without a deterministic CUDA kernel (AlexNet-BN's 6x6 adaptive average pooling
backward) warns, naming itself, instead of stopping the run; such a run is then reproducible only to rounding.
On the CPU, kernels are deterministic already (given `fabric.cpu_threads`) and nothing changes.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = ":4096:8"  # the value the CUDA documentation names for reproducible cuBLAS results


@contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """Within: deterministic kernels when `on`; afterwards every setting is as it was (runs in one process, tests)."""
    cudnn = torch.backends.cudnn
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              cudnn.deterministic, cudnn.benchmark, os.environ.get(CUBLAS_WORKSPACE))
    if on:
        os.environ.setdefault(CUBLAS_WORKSPACE, CUBLAS_DETERMINISTIC)
        torch.use_deterministic_algorithms(True, warn_only=True)
        cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        cudnn.deterministic, cudnn.benchmark = before[2], before[3]
        if before[4] is None:
            os.environ.pop(CUBLAS_WORKSPACE, None)
        else:
            os.environ[CUBLAS_WORKSPACE] = before[4]
