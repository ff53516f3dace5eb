"""Per-class sums and counts that come out the same on every run and every device.

`index_add_` / `scatter_add_` of float rows with repeated labels add a class's rows in a fixed order on the CPU but
with atomics on CUDA, in an order that changes from run to run: the sums differ in their last bits, and a run that
uses them is not reproducible. Here a class's sum is one matmul with the labels' one-hot matrix (cuBLAS reduces in a
fixed order for a given shape), in float64 and outside autocast, and a count is the column sum of that one-hot
matrix (integer, exact). Neither reads a value back to the host (torch.bincount on CUDA does, twice).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def class_sums(values: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """sum_{n: labels_n = c} values_n for every class c: [num_classes, *values.shape[1:]], float64, zero rows for the
    classes without samples. Equals index_add_ of `values` at `labels` into zeros up to float64 summation order,
    bitwise where every partial sum is exact (e.g. integer or dyadic values)."""
    with torch.autocast(values.device.type, enabled=False):  # float64: neither bf16 nor TF32 rounds the values
        onehot = F.one_hot(labels.long(), num_classes).to(torch.float64)
        flat = values.reshape(values.shape[0], -1).to(torch.float64)
        return (onehot.T @ flat).reshape(num_classes, *values.shape[1:])


def label_counts(labels: Tensor, num_classes: int) -> Tensor:
    """The number of samples of each class, [num_classes] int64: `torch.bincount(labels, minlength=num_classes)`
    without its host sync on CUDA."""
    return F.one_hot(labels.long(), num_classes).sum(0)
