"""Per-client persistent state, kept off the accelerator, and atomic checkpoints through Fabric."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
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


CHECKPOINT_NAMES = ("last.ckpt", "previous.ckpt")  # newest first: resume falls back to the one before
CHECKPOINT_KEYS = ("round", "server", "clients", "history", "fingerprint")


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from; the message names the file and what is wrong."""


def save_checkpoint(fabric: Fabric, path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file, then rename; the checkpoint it replaces is kept as previous.ckpt until the
    next one is complete, so a kill at any point (or a damaged last.ckpt) leaves a good one to resume from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fabric.save(tmp, state)
    if fabric.is_global_zero:
        if path.is_file():
            os.replace(path, path.with_name(CHECKPOINT_NAMES[1]))
        os.replace(tmp, path)
    fabric.barrier()


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint written by save_checkpoint, on the CPU (tensors only, no code is unpickled)."""
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt or not a torch file: whatever the unpickler says, one line
        raise CheckpointError(f"{path} cannot be read ({type(err).__name__}: "
                              f"{(str(err).splitlines() or [''])[0][:120]})") from None
    if not isinstance(state, dict) or not all(k in state for k in CHECKPOINT_KEYS):
        found = sorted(state)[:6] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path} is not a checkpoint written by fl.train (it holds {found}; expected "
                              f"{', '.join(CHECKPOINT_KEYS)})")
    return state


def latest_checkpoint(ckpt_dir: Path) -> tuple[Optional[Path], Optional[dict[str, Any]], list[str]]:
    """The newest readable checkpoint in `ckpt_dir` (path, state) and the problems of newer ones skipped;
    (None, None, []) when there is none yet. Raises CheckpointError when every one there is unreadable."""
    problems = []
    for name in CHECKPOINT_NAMES:
        path = ckpt_dir / name
        if path.is_file():
            try:
                return path, read_checkpoint(path), problems
            except CheckpointError as err:
                problems.append(str(err))
    if problems:
        raise CheckpointError("; ".join(problems))
    return None, None, []
