"""The disk store's client state files (state.cache_mb): where a run's files go, their names, what each carries, and
reading and writing them with one-line errors.

A run's files live in its namespace: `<state.dir>/<run directory's name>/`, or the run directory's own
`client_states/` when state.dir is not set. The namespace is the same for every process and node of a run (they
share `logger.run_name`) and for its resume. A file is `client<cid>-r<round>-<run id>.pt` and holds
{"identity": {"run", "client", "round"}, "state": ...}: the run id, drawn when a run starts and kept in its
checkpoints, keeps two runs apart even in one namespace, and a file copied over another, or left by another run, is
refused when read instead of training the wrong model."""
from __future__ import annotations

import errno
import os
import re
import uuid
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch


class StateStoreError(RuntimeError):
    """The state directory cannot be written (permissions, a full disk) or a client state file cannot be used: the
    run stops in one line."""


class StateFileError(StateStoreError):
    """A client state file that is missing, empty, truncated, not a state file, or another client's or run's: the
    message names it and what is wrong."""


FILE = re.compile(r"client(\d+)-r(-?\d+)-([0-9a-f]+)\.pt")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def namespace_dir(state_dir: Optional[str], run_dir: Path) -> Path:
    """The folder of a run's state files: <state.dir>/<run name>, or <run dir>/client_states without state.dir (a
    run directory is one run's already)."""
    return Path(state_dir) / Path(run_dir).name if state_dir else Path(run_dir) / "client_states"


def file_name(cid: int, rnd: int, run: str) -> str:
    return f"client{cid:06d}-r{rnd:06d}-{run}.pt"


def identity(cid: int, rnd: int, run: str) -> dict[str, Any]:
    return {"run": run, "client": int(cid), "round": int(rnd)}


def write_error(err: BaseException) -> str:
    """Why a write failed, in a few words."""
    text = str(err)
    if isinstance(err, OSError) and err.errno == errno.ENOSPC or "No space left" in text:
        return "the disk is full"
    if "unexpected pos" in text or "file write failed" in text:  # torch's zip writer: a write came up short
        return "the disk is full (a write came up short)"
    return getattr(err, "strerror", None) or (text.splitlines() or [type(err).__name__])[0]


def folder_problem(folder: Path) -> Optional[str]:
    """What is wrong with a namespace that should exist: gone, or a file in its place (None: it is a folder)."""
    if folder.is_dir():
        return None
    return f"state.dir {folder} is no longer a directory" if folder.exists() else f"state.dir {folder} no longer exists"


def write_state_file(path: Path, state: dict[str, Any], ident: dict[str, Any]) -> None:
    """Writes to a temporary name, then renames, so a kill never leaves a half file under a real name; raises
    StateStoreError naming the folder and the reason."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save({"identity": ident, "state": state}, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch wraps a full disk in a RuntimeError
        problem = folder_problem(path.parent)
        if problem is not None:  # the files already there are gone too
            raise StateFileError(problem) from None
        tmp.unlink(missing_ok=True)
        raise StateStoreError(f"cannot write client state to state.dir {path.parent}: {write_error(err)}") from None


def _describe(ident: dict[str, Any]) -> str:
    return f"client {ident['client']}'s state of round {ident['round']} in run {ident['run']}"


def _load(path: Path, mmap: bool) -> Any:
    try:
        if path.stat().st_size == 0:
            raise StateFileError(f"client state file {path} is empty")
        if mmap:
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception:  # say what a plain read says (it fails as early, on the zip's directory)
                pass
        return torch.load(path, map_location="cpu", weights_only=True)
    except (FileNotFoundError, NotADirectoryError):
        raise StateFileError(folder_problem(path.parent) or f"client state file {path} is missing") from None
    except StateFileError:
        raise
    except Exception as err:  # truncated, garbage or not a torch file: one line
        if not zipfile.is_zipfile(path):  # torch's own words for it vary with the size ("Invalid argument", ...)
            raise StateFileError(f"client state file {path} is truncated or not a torch file "
                                 f"({path.stat().st_size} bytes)") from None
        raise StateFileError(f"client state file {path} cannot be read ({type(err).__name__}: "
                             f"{(str(err).splitlines() or [''])[0][:120]})") from None


def read_state_file(path: Path, expected: Optional[dict[str, Any]] = None, header_only: bool = False) -> Any:
    """The state a file holds, after checking it is the one `expected` names (run, client, round); raises
    StateFileError naming the file otherwise. `header_only`: check without reading the tensors (memory-mapped)."""
    held = _load(path, mmap=header_only)
    if not (isinstance(held, dict) and set(held) == {"identity", "state"} and isinstance(held["identity"], dict)
            and set(held["identity"]) == {"run", "client", "round"}):
        raise StateFileError(f"{path} is not a client state file written by fl.train")
    if expected is not None and held["identity"] != expected:
        raise StateFileError(f"client state file {path} holds {_describe(held['identity'])}, not "
                             f"{_describe(expected)}: it was copied or renamed")
    return None if header_only else held["state"]
