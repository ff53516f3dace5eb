"""No covariate shift: each client's images as loaded."""
from __future__ import annotations

from fl.core.registry import register_client_transform


@register_client_transform("none")
def no_shift(x, client: int, num_clients: int, seed: int, s):
    """No covariate shift: each client's images as loaded (the pipeline skips this stage)."""
    return x
