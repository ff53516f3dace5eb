"""The client transforms, a module each: per-client covariate shifts of the clients' images (train, test and
validation alike: each client's test set follows its own distribution). Each registers
`fn(x, client, num_clients, seed, s) -> x` with `@register_client_transform(name, Settings)`: `x` holds one client's
uint8 RGB images [N, 3, H, W] of all its splits together, `s` is the `data.client_transform` block (the keys every
client transform takes, with its own Settings among them), and every random draw comes from `seed` and `client`.
A deterministic transform may also register `batch=fn(x, owner, num_clients, s) -> x`, the same shift applied to a
batch whose rows belong to the clients in `owner` (data.client_transform.after_augment). Every module here is
imported, so a new client transform is one new file."""
from fl.core.registry import discover

discover(__name__)
