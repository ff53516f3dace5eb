"""Pretrained weights for a model (`model.pretrained`): a torchvision weights name, found in torch's hub cache
(downloaded only with `model.download=true`, never silently), or a local state-dict file.

A file may hold the state dict of the model as fl builds it (keys `backbone.*`, `head.*`) or of the torchvision
network its backbone wraps (e.g. `conv1.weight`, `fc.*`): torchvision keys go under `backbone.` and the
classifier `fc.*` is dropped (the head is fitted to the task's classes). Every backbone tensor must be there
with its shape; the head is taken only when its shape fits. Anything else is a one-line ConfigError.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
from torch import Tensor, nn

from fl.config import ConfigError

DOWNLOAD_TIMEOUT_S = 60


def state_dict_from(spec: str, download: bool) -> dict[str, Tensor]:
    """The state dict `model.pretrained=spec` names (a file, or a torchvision weights name)."""
    if Path(spec).expanduser().is_file():
        try:
            state = torch.load(Path(spec).expanduser(), map_location="cpu", weights_only=True)
        except Exception as err:  # a corrupt or foreign file: one line
            raise ConfigError(f"model.pretrained={spec!r}: cannot read it as a state dict "
                              f"({type(err).__name__}: {str(err).splitlines()[0]})") from None
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
            raise ConfigError(f"model.pretrained={spec!r}: the file holds no state dict of tensors")
        return state
    import torchvision  # loads when weights are named, not with the CLI

    try:
        weights = torchvision.models.get_weight(spec)
    except (ValueError, KeyError, AttributeError):
        raise ConfigError(f"model.pretrained={spec!r} is neither a file nor a torchvision weights name "
                          "(e.g. ResNet50_Weights.IMAGENET1K_V2)") from None
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)
    if cached.is_file():
        return torch.load(cached, map_location="cpu", weights_only=True)
    if not download:
        raise ConfigError(f"model.pretrained={spec}: the weights are not on disk at {cached}; copy them there "
                          f"(from {weights.url}) or set model.download=true on a machine with a network")
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # an unreachable host fails instead of hanging
    try:
        return weights.get_state_dict(progress=False)
    except Exception as err:
        raise ConfigError(f"model.pretrained={spec}: download from {weights.url} failed "
                          f"({type(err).__name__}: {str(err).splitlines()[0]})") from None
    finally:
        socket.setdefaulttimeout(previous)


def load_into(model: nn.Module, state: dict[str, Tensor], spec: str) -> None:
    """Load `state` into a BackboneHead (see the module docstring for the accepted layouts)."""
    if not any(k.startswith(("backbone.", "head.")) for k in state):  # the wrapped torchvision network's keys
        state = {f"backbone.{k}": v for k, v in state.items() if not k.startswith("fc.")}
    own = model.state_dict()
    backbone = [k for k in own if k.startswith("backbone.")]
    missing = [k for k in backbone if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in backbone if k in state and state[k].shape != own[k].shape]
    for problem, keys in (("lacks", missing), ("has unknown", unexpected), ("has the wrong shape for", wrong)):
        if keys:
            raise ConfigError(f"model.pretrained={spec!r} {problem} {len(keys)} of the model's tensors, e.g. "
                              f"{', '.join(keys[:3])}; it must be a state dict of this model.name")
    head = {k: v for k, v in state.items() if k.startswith("head.") and v.shape == own[k].shape}
    model.load_state_dict({**{k: state[k] for k in backbone}, **head}, strict=False)
