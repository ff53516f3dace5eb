"""The pipeline's last stage: each client's images changed as its setting asks. The registered
`data.client_transform` (FedDRM's colour shifts, pFedFDA's CIFAR-S corruptions) on every client's train, test and
validation images, then pFedFDA's Table 4 corruption of the new clients (data.new_clients.corruption)."""
from __future__ import annotations

import functools

import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData, plugins
from fl.core.federated_data import map_images
from fl.core.plugin_calls import blamed
from fl.core.registry import CLIENT_TRANSFORMS
from fl.core.seeding import generator
from fl.data.transforms import corrupt, frost_dir_default


def checked(shift, name: str, fn, cid: int):
    """`shift` whose result is checked against its input: a torch tensor of the same shape (rows, channels, image
    size) and dtype, uint8 images. A transform that breaks this would surface later as another component's fault
    (a model that cannot take the inputs, a split of the wrong size); one line naming it, its file and the client."""
    def call(x: torch.Tensor) -> torch.Tensor:
        out = shift(x)
        where = f"data.client_transform.name={name!r} ({plugins.code_location(fn)}) for client {cid}"
        if not isinstance(out, torch.Tensor):
            raise ConfigError(f"{where} returned {plugins.type_name(out)}; a client transform "
                              "returns the images as a torch tensor")
        if out.shape != x.shape or out.dtype != x.dtype:
            raise ConfigError(f"{where} returned {str(out.dtype).removeprefix('torch.')} {tuple(out.shape)} for "
                              f"{str(x.dtype).removeprefix('torch.')} {tuple(x.shape)}; a client transform keeps "
                              "the rows, channels, image size and dtype of the images it is given")
        return out
    return call


def change_images(clients: list[ClientData], d: DictConfig, seed: int):
    """The client transform, once on the stored images or, with `after_augment`, on each batch after its
    augmentation (then the batch transform is returned; test images not augmented at evaluation are still shifted
    once: the same images); then the new clients' corruption. None when there is no per-batch transform."""
    s, new = d.client_transform, d.new_clients
    plugin = None if s.name == "none" else CLIENT_TRANSFORMS[s.name]
    if plugin is not None and s.after_augment and plugin.batch is None:
        raise ConfigError(f"data.client_transform.after_augment=true re-applies the transform to every batch, so it "
                          f"needs one with a per-batch form (feddrm_color); data.client_transform.name={s.name!r} "
                          "has none")
    if plugin is not None and s.after_augment and new.corruption != "none":
        raise ConfigError("data.new_clients.corruption corrupts the stored images, which must come after the client "
                          "transform: use it with data.client_transform.after_augment=false")
    num_clients = len(clients)
    for cid, c in enumerate(clients if plugin is not None else []):
        c.test_rows = None  # its test images are shifted: no longer the global test set's rows
        if c.train.x.dtype != torch.uint8 or c.train.x.dim() != 4 or c.train.x.shape[1] != 3:  # colour shifts
            raise ConfigError(f"data.client_transform.name={s.name!r} needs uint8 RGB images [N, 3, H, W]; "
                              f"data.name={d.name!r} gives {c.train.x.dtype} {list(c.train.x.shape[1:])}")
        shift = checked(functools.partial(plugin.fn, client=cid, num_clients=num_clients, seed=seed, s=s), s.name,
                        plugin.fn, cid)
        if not s.after_augment:  # one call on all splits: random corruptions (noise, blur angle) differ per image
            with blamed("data.client_transform.name", s.name, plugin.fn):
                map_images(c.splits(), shift)
            continue
        # training batches are shifted after their crop; evaluation batches are not cropped
        evaluated = [split for split in c.splits() if split is not c.train]
        for split in [c.train] + (evaluated if d.eval_augment else []):
            split.owner = torch.full((len(split),), cid, dtype=torch.int64)
        if not d.eval_augment:
            with blamed("data.client_transform.name", s.name, plugin.fn):
                map_images(evaluated, shift)
    if new.corruption != "none":  # pFedFDA Table 4: every image of the new clients, train and test alike
        frost_dir = frost_dir_default()
        for cid in range(d.num_clients - new.count, d.num_clients):
            clients[cid].test_rows = None  # corrupted: no longer the global test set's rows
            gen = generator(seed, 0, cid, "new-client-corruption")
            map_images(clients[cid].splits(), functools.partial(
                corrupt, name=new.corruption, severity=new.severity, gen=gen, frost_dir=frost_dir))
    if plugin is not None and s.after_augment:  # (batch, owners) -> batch, on the batch's device
        return functools.partial(plugin.batch, num_clients=num_clients, s=s)
    return None
