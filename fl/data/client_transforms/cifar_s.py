"""pFedFDA's CIFAR-S (Sec. 5.1): half of the clients see one CIFAR-C corruption at one severity each, the others
stay clean (fl/data/transforms.py holds the corruptions and the assignment)."""
from __future__ import annotations

from fl.core.registry import register_client_transform
from fl.data.transforms import cifar_s


@register_client_transform("cifar_s")
def cifar_s_shift(x, client: int, num_clients: int, seed: int, s):
    """pFedFDA's CIFAR-S: the client's assigned CIFAR-C corruption, seeded per client (clean clients unchanged)."""
    return cifar_s(x, client, num_clients, seed=seed)
