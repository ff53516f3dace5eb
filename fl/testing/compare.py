"""Where two runs' outputs differ: checkpoint parts (nested dicts, lists, tensors, numbers) and metrics rows."""
from __future__ import annotations

import math
from typing import Any


def same_state(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two checkpoint parts differ; [] when they are equal bit for bit (NaN equals NaN)."""
    import torch

    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(map(str, a.keys() ^ b.keys()))[:3]}"]
        return [d for k in a for d in same_state(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same_state(x, y, f"{where}/{i}")]
    if torch.is_tensor(a) and torch.is_tensor(b):
        return [] if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) else [where]
    equal = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return [] if equal else [where]


def close_state(a: Any, b: Any, atol: float, where: str = "") -> list[str]:
    """Like same_state, but floating-point tensors may differ by `atol` (float32 reduction order across processes)."""
    import torch

    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [d for k in a for d in close_state(a[k], b[k], atol, f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in close_state(x, y, atol, f"{where}/{i}")]
    if torch.is_tensor(a) and torch.is_tensor(b) and a.is_floating_point() and a.dtype == b.dtype \
            and a.shape == b.shape:
        return [] if torch.allclose(a, b, rtol=0, atol=atol, equal_nan=True) else [where]
    return same_state(a, b, where)


def rows_differ(a: list[dict], b: list[dict], atol: float = 0.0) -> list[str]:
    """Where two runs' metrics rows differ (beyond `atol`; 0: exactly), wall times (time/*) aside."""
    if [r.keys() - {k for k in r if k.startswith("time/")} for r in a] != \
            [r.keys() - {k for k in r if k.startswith("time/")} for r in b]:
        return ["the rounds or their metric names differ"]
    out = []
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            other = rb[key]
            if key.startswith("time/") or value == other or (value != value and other != other):
                continue
            if atol == 0.0 or not abs(value - other) <= atol:
                out.append(f"round {ra.get('round')}: {key} {value!r} vs {other!r}")
    return out
