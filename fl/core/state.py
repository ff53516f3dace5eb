"""Per-client persistent state, kept off the accelerator, and atomic checkpoints through Fabric."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from lightning.fabric import Fabric


class ClientStateStore:
    """cid -> whatever `ClientModule.client_state()` returned (CPU tensors). Every process holds the
    whole store: after each round the states of that round's clients are exchanged, so any process
    can train any client next round and a checkpoint is a plain dict."""

    def __init__(self) -> None:
        self._states: dict[int, dict[str, Any]] = {}

    def get(self, cid: int) -> Optional[dict[str, Any]]:
        return self._states.get(cid)

    def update(self, states: dict[int, dict[str, Any]]) -> None:
        self._states.update(states)

    def __len__(self) -> int:
        return len(self._states)

    def state_dict(self) -> dict[int, dict[str, Any]]:
        return self._states

    def load_state_dict(self, states: dict[int, dict[str, Any]]) -> None:
        self._states = dict(states)


def save_checkpoint(fabric: Fabric, path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file, then rename: a kill mid-write leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fabric.save(tmp, state)
    if fabric.is_global_zero:
        os.replace(tmp, path)
    fabric.barrier()


def load_checkpoint(fabric: Fabric, path: Path) -> dict[str, Any]:
    return fabric.load(path)
