"""Per-client persistent state, kept off the accelerator, and atomic checkpoints through Fabric.

Each process keeps the states of the clients it owns (client cid belongs to process cid % world_size, the one
that trains and evaluates it), either all in memory (`ClientStateStore`, `state.cache_mb=null`) or on disk, one
file per client and version, behind an LRU cache of `state.cache_mb` (`DiskStateStore`)."""
from __future__ import annotations

import errno
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:  # Lightning loads with the run, not with a method or an evaluator
    from lightning.fabric import Fabric


class StateStoreError(RuntimeError):
    """The state directory cannot be written (permissions, a full disk): the run stops, its last checkpoint
    stays resumable."""


def state_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) client state."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def write_error(err: BaseException) -> str:
    """Why a write failed, in a few words."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC or "No space left" in str(err):
        return "the disk is full"
    return getattr(err, "strerror", None) or (str(err).splitlines() or [type(err).__name__])[0]


def check_writable(directory: Path) -> None:
    """Creates `directory` and writes a file in it, or raises StateStoreError naming it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise StateStoreError(f"state.dir {directory} is not writable ({err.strerror or err}); give a writable "
                              "directory: state.dir=PATH") from None


def host_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class ClientStateStore:
    """cid -> whatever `ClientModule.client_state()` returned (CPU tensors), all in memory. A process holds the
    states of the clients it owns; a checkpoint gathers them into one dict."""

    def __init__(self) -> None:
        self._states: dict[int, dict[str, Any]] = {}
        self._staged: dict[int, dict[str, Any]] = {}

    def get(self, cid: int) -> Optional[dict[str, Any]]:
        return self._states.get(cid)

    def update(self, states: dict[int, dict[str, Any]], rnd: int) -> None:
        self._states.update(states)

    def stage(self, cid: int, state: dict[str, Any], rnd: int) -> None:
        """Client cid's state after round rnd; `get` and checkpoints see it once the round is committed."""
        self._staged[cid] = state

    def commit(self, rnd: int) -> None:
        self.update(self._staged, rnd)
        self._staged = {}

    def prefetch(self, cid: int) -> None:
        """A hint that `cid` is needed next (nothing to do in memory)."""

    def projected_bytes(self, clients: int) -> int:
        """The memory the states of `clients` clients take, at the mean size of the states held now."""
        held = [state_bytes(state) for state in self._states.values()]
        return sum(held) * clients // len(held) if held else 0

    def __len__(self) -> int:
        return len(self._states)

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """This process's part of the checkpoint."""
        return self._states

    def load_state_dict(self, states: dict[int, dict[str, Any]], owns: Callable[[int], bool]) -> None:
        self._states = {cid: s for cid, s in states.items() if owns(cid)}
        self._staged = {}

    def checkpointed(self) -> None:
        """Called once the checkpoint holding `state_dict()` is in place."""

    def close(self) -> None:
        pass


FILE = re.compile(r"client(\d+)-r(-?\d+)\.pt")


class DiskStateStore:
    """Client states on disk, one immutable file per client and round (`client<cid>-r<round>.pt`), behind an LRU
    cache of at most `cache_bytes` (the state just stored may go straight to disk when it alone exceeds it).

    - get: from the cache, else from the file (read ahead by `prefetch` in a background thread).
    - update: the round's new states enter the cache unwritten; one evicted unwritten is written then.
    - state_dict (a checkpoint): writes the unwritten states and returns {cid: {"round": r}}: only the states
      changed since the previous checkpoint are written, and the files it names exist before the checkpoint
      that names them does (the checkpoint file itself is written last, atomically).
    - checkpointed: deletes the files neither the current state, this checkpoint nor the one before
      (previous.ckpt, the fallback) names.
    Files are written to a temporary name and renamed, so a kill never leaves a half file under a real name."""

    def __init__(self, directory: Path, cache_bytes: int, owns: Callable[[int], bool]) -> None:
        self.dir = Path(directory)
        self.cache_bytes = int(cache_bytes)
        self.owns = owns
        check_writable(self.dir)
        self._cache: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._used = 0
        self._unwritten: set[int] = set()
        self._round: dict[int, int] = {}          # cid -> round of its newest state
        self._kept: list[dict[int, int]] = [{}, {}]  # the last two checkpoints' {cid: round}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-prefetch")
        self._pending: dict[int, Future] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-write")
        self._writes: list[tuple[int, Future]] = []  # staged states being written: (cid, its write)
        self.files_written = 0  # for benchmarks and tests

    def path(self, cid: int, rnd: int) -> Path:
        return self.dir / f"client{cid:06d}-r{rnd:06d}.pt"

    # ---- the store ------------------------------------------------------------------------------
    def get(self, cid: int) -> Optional[dict[str, Any]]:
        if cid in self._cache:
            self._cache.move_to_end(cid)
            return self._cache[cid]
        if cid not in self._round:
            return None
        pending = self._pending.pop(cid, None)
        state = pending.result() if pending is not None else self._read(cid, self._round[cid])
        self._insert(cid, state, written=True)
        return state

    def update(self, states: dict[int, dict[str, Any]], rnd: int) -> None:
        for cid, state in states.items():
            self._drop(cid)
            self._round[cid] = rnd
            self._insert(cid, state, written=False)

    def stage(self, cid: int, state: dict[str, Any], rnd: int) -> None:
        """Client cid's state after round rnd, written to its file in the background while the next client trains
        (at most two writes wait, so memory stays bounded); `get` and checkpoints see it after `commit(rnd)`."""
        self._wait(self._writes[:-1])  # bound the states waiting to be written
        self._writes.append((cid, self._writer.submit(self._write_file, self.path(cid, rnd), state)))

    def commit(self, rnd: int) -> None:
        writes, self._writes = self._writes, []
        self._wait(writes)  # a failed write raises StateStoreError here
        for cid, _ in writes:
            self._drop(cid)
            self._round[cid] = rnd

    def prefetch(self, cid: int) -> None:
        if cid in self._round and cid not in self._cache and cid not in self._pending:
            self._pending[cid] = self._pool.submit(self._read, cid, self._round[cid])

    def __len__(self) -> int:
        return len(self._round)

    @property
    def cached_bytes(self) -> int:
        return self._used

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[int, dict[str, int]]:
        for cid in sorted(self._unwritten):
            self._write(cid, self._cache[cid])
        self._unwritten.clear()
        return {cid: {"round": r} for cid, r in sorted(self._round.items())}

    def load_state_dict(self, states: dict[int, dict[str, int]], owns: Callable[[int], bool]) -> None:
        self._reset()
        mine = {cid: int(s["round"]) for cid, s in states.items() if owns(cid)}
        missing = [cid for cid, r in mine.items() if not self.path(cid, r).is_file()]
        if missing:
            raise StateStoreError(
                f"state.dir {self.dir} lacks {len(missing)} client state file(s) the checkpoint names, e.g. "
                f"{self.path(missing[0], mine[missing[0]]).name}: resume with the processes and nodes that wrote "
                "them, or give every process a state.dir that holds all of them (a shared filesystem)")
        self._round = dict(mine)
        self._kept = [dict(mine), {}]

    def checkpointed(self) -> None:
        self._kept = [dict(self._round), self._kept[0]]
        keep = {(cid, r) for names in (self._round, *self._kept) for cid, r in names.items()}
        for path in self.dir.glob("client*-r*.pt"):
            match = FILE.fullmatch(path.name)
            if match and self.owns(int(match[1])) and (int(match[1]), int(match[2])) not in keep:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True, cancel_futures=True)

    # ---- internals ------------------------------------------------------------------------------
    def _reset(self) -> None:
        writes, self._writes = self._writes, []
        self._wait(writes)
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._cache.clear()
        self._sizes.clear()
        self._used = 0
        self._unwritten.clear()

    def _drop(self, cid: int) -> None:
        pending = self._pending.pop(cid, None)
        if pending is not None:
            pending.cancel()
        if cid in self._cache:
            del self._cache[cid]
            self._used -= self._sizes.pop(cid)
        self._unwritten.discard(cid)

    def _insert(self, cid: int, state: dict[str, Any], written: bool) -> None:
        self._cache[cid] = state
        self._sizes[cid] = state_bytes(state)
        self._used += self._sizes[cid]
        if not written:
            self._unwritten.add(cid)
        while self._used > self.cache_bytes and self._cache:  # least recently used first
            old, old_state = next(iter(self._cache.items()))
            if old in self._unwritten:
                self._write(old, old_state)
                self._unwritten.discard(old)
            del self._cache[old]
            self._used -= self._sizes.pop(old)

    def _wait(self, writes: list[tuple[int, Future]]) -> None:
        """Waits for every write in `writes`, then raises the first failure: none is still running (and none holds
        a half-written .tmp file) when the error reaches the caller."""
        errors = [write.exception() for _, write in writes]
        failed = next((err for err in errors if err is not None), None)
        if failed is not None:
            for _, write in self._writes:  # the ones queued behind them too
                write.exception()
            self._writes.clear()
            raise failed

    def _read(self, cid: int, rnd: int) -> dict[str, Any]:
        return torch.load(self.path(cid, rnd), map_location="cpu", weights_only=True)

    def _write(self, cid: int, state: dict[str, Any]) -> None:
        self._write_file(self.path(cid, self._round[cid]), state)

    def _write_file(self, path: Path, state: dict[str, Any]) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            torch.save(state, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as err:  # torch wraps a full disk in a RuntimeError
            tmp.unlink(missing_ok=True)
            raise StateStoreError(f"cannot write client state to state.dir {self.dir}: {write_error(err)}") from None
        self.files_written += 1


def make_state_store(cache_mb: Optional[float], directory: Path, owns: Callable[[int], bool]):
    """The store `state.cache_mb` asks for: null = everything in memory, else on disk behind that cache."""
    if cache_mb is None:
        return ClientStateStore()
    return DiskStateStore(directory, int(cache_mb * 2**20), owns)


CHECKPOINT_NAMES = ("last.ckpt", "previous.ckpt")  # newest first: resume falls back to the one before
CHECKPOINT_KEYS = ("round", "server", "clients", "history", "fingerprint")


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from; the message names the file and what is wrong."""


def save_checkpoint(fabric: Fabric, path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file, then rename; the checkpoint it replaces is kept as previous.ckpt until the
    next one is complete, so a kill at any point (or a damaged last.ckpt) leaves a good one to resume from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fabric.save(tmp, state)
    except (OSError, RuntimeError) as err:
        if fabric.is_global_zero:
            tmp.unlink(missing_ok=True)
        raise StateStoreError(f"cannot write a checkpoint to {path.parent}: {write_error(err)}") from None
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
