"""FedDRM's per-client colour shifts (Sec. 3.1, Fig. 5, App. F.1-F.2): gamma, hue and saturation picked by the bits
of the client id, and posterisation (fl/data/transforms.py holds the arithmetic)."""
from __future__ import annotations

from dataclasses import dataclass

from fl.config import param
from fl.core.registry import register_client_transform
from fl.data.transforms import feddrm_color, feddrm_color_by_owner


@dataclass
class Settings:
    level: str = param("auto", choices=["auto", "low", "mid", "high", "pool"],
                       help="the shift's intensity (FedDRM Fig. 5: low, mid, high; pool = the scalability pool of "
                       "App. F.2.1; auto = high up to 8 clients, pool above)")


def by_owner(x, owner, num_clients: int, s):
    return feddrm_color_by_owner(x, owner, num_clients=num_clients, level=s.level)


@register_client_transform("feddrm_color", Settings, batch=by_owner)
def feddrm_color_shift(x, client: int, num_clients: int, seed: int, s):
    """FedDRM's colour shifts: each client's own gamma, hue and saturation (deterministic: no seed)."""
    return feddrm_color(x, client, num_clients, s.level)
