"""Per-client persistent state, kept off the accelerator, and atomic checkpoints through Fabric.

Each process keeps the states of the clients it owns (client cid belongs to process cid % world_size, the one
that trains and evaluates it), either all in memory (`ClientStateStore`, `state.cache_mb=null`) or on disk, one
file per client and version in the run's own namespace of state.dir, behind an LRU cache of `state.cache_mb`
(`DiskStateStore`)."""
from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:  # Lightning loads with the run, not with a method or an evaluator
    from lightning.fabric import Fabric

from fl.core.exchange import gather_objects
from fl.core.state_files import (
                                 FILE,
                                 StateFileError,
                                 StateStoreError,
                                 file_name,
                                 identity,
                                 namespace_dir,
                                 new_run_id,
                                 read_state_file,
                                 write_error,
                                 write_state_file,
)
from fl.core.state_lock import NamespaceLock, StateDirInUse, namespace_in_use


def state_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) client state."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


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

    def commit(self, rnd: int, left_out: frozenset[int] = frozenset()) -> None:
        """The staged states become the clients' own; the clients in `left_out` keep the state they had (a faulty
        upload a robust aggregator left out of the round)."""
        self.update({cid: s for cid, s in self._staged.items() if cid not in left_out}, rnd)
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


class DiskStateStore:
    """Client states on disk, one immutable file per client and round in the run's namespace (`directory`; names and
    contents in fl/core/state_files.py), behind an LRU cache of at most `cache_bytes` (the state just stored may go
    straight to disk when it alone exceeds it).

    - get: from the cache, else from the file (read ahead by `prefetch` in a background thread), refused when the
      file is not the one named (run, client, round).
    - update: the round's new states enter the cache unwritten; one evicted unwritten is written then.
    - state_dict (a checkpoint): writes the unwritten states and returns {cid: {"round": r, "run": run id}}: only the
      states changed since the previous checkpoint are written, and the files it names exist before the checkpoint
      that names them does (the checkpoint file itself is written last, atomically).
    - load_state_dict (a resume): checks that every file the checkpoint names for this process is there and is the
      one it names (read without its tensors), agreeing with the other processes (`agree`: every process's
      problem or None), so all of them stop or none does.
    - checkpointed: deletes the files of this run (its run id, clients this process owns) that neither the current
      state, this checkpoint nor the one before (previous.ckpt, the fallback) names; other runs' files stay.
    Files are written to a temporary name and renamed, so a kill never leaves a half file under a real name.
    `nodes`: the run's fabric.num_nodes, for the advice when files are missing; `lock`: released by close()."""

    def __init__(self, directory: Path, cache_bytes: int, owns: Callable[[int], bool], run: Optional[str] = None,
                 nodes: int = 1, lock: Optional[NamespaceLock] = None,
                 agree: Callable[[Any], list[Any]] = lambda problem: [problem]) -> None:
        self.dir = Path(directory)
        self.cache_bytes = int(cache_bytes)
        self.owns = owns
        self.run = run or new_run_id()
        self.nodes = nodes
        self.lock = lock
        self.agree = agree
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
        return self.dir / file_name(cid, rnd, self.run)

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
        self._writes.append((cid, self._writer.submit(self._write_file, cid, rnd, state)))

    def commit(self, rnd: int, left_out: frozenset[int] = frozenset()) -> None:
        writes, self._writes = self._writes, []
        self._wait(writes)  # a failed write raises StateStoreError here
        for cid, _ in writes:
            if cid in left_out:  # keeps its previous round's file; this round's is removed at the next checkpoint
                continue
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
    def state_dict(self) -> dict[int, dict[str, Any]]:
        for cid in sorted(self._unwritten):
            self._write(cid, self._cache[cid])
        self._unwritten.clear()
        return {cid: {"round": r, "run": self.run} for cid, r in sorted(self._round.items())}

    def load_state_dict(self, states: dict[int, dict[str, Any]], owns: Callable[[int], bool]) -> None:
        mine = {cid: int(s["round"]) for cid, s in states.items() if owns(cid)}
        run, problem = self.run, None
        try:
            run = self._run_named(states)
            self._check_files(mine, run)
        except StateStoreError as err:
            problem = str(err)
        problems = [p for p in self.agree(problem) if p]
        if problems:
            raise StateStoreError(problems[0])
        self._reset()
        self.run = run
        self._round = dict(mine)
        self._kept = [dict(mine), {}]

    def checkpointed(self) -> None:
        self._kept = [dict(self._round), self._kept[0]]
        keep = {(cid, r) for names in (self._round, *self._kept) for cid, r in names.items()}
        for path in self.dir.glob(f"client*-r*-{self.run}.pt"):
            match = FILE.fullmatch(path.name)
            if match and match[3] == self.run and self.owns(cid := int(match[1])) and (cid, int(match[2])) not in keep:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True, cancel_futures=True)
        if self.lock is not None:
            self.lock.release()

    # ---- internals ------------------------------------------------------------------------------
    def _run_named(self, states: dict[int, dict[str, Any]]) -> str:
        """The run whose files a checkpoint names (this store's own when it names none)."""
        runs = {s.get("run") for s in states.values()}
        if None in runs:
            raise StateStoreError("the checkpoint names client state files without a run identity (written before "
                                  "fl kept each run's files apart): finish that run with the fl version that wrote "
                                  "it, or start it again")
        if len(runs) > 1:
            raise StateStoreError(f"the checkpoint names client state files of {len(runs)} runs "
                                  f"({', '.join(sorted(runs))}); it was edited or assembled from several runs")
        return runs.pop() if runs else self.run

    def _check_files(self, mine: dict[int, int], run: str) -> None:
        """Every file in `mine` ({cid: round}) is there and holds what its name says, or StateStoreError."""
        missing = [cid for cid, r in mine.items() if not (self.dir / file_name(cid, r, run)).is_file()]
        if missing:
            advice = ("resume with the processes and nodes that wrote them, or give every process a state.dir that "
                      "holds all of them (a shared filesystem)") if self.nodes > 1 else (
                      "they were deleted or moved: put them back, or start the run again")
            raise StateFileError(f"state.dir {self.dir} lacks {len(missing)} client state file(s) the checkpoint "
                                 f"names, e.g. {file_name(missing[0], mine[missing[0]], run)}: {advice}")
        for cid, r in sorted(mine.items()):
            read_state_file(self.dir / file_name(cid, r, run), identity(cid, r, run), header_only=True)

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
        return read_state_file(self.path(cid, rnd), identity(cid, rnd, self.run))

    def _write(self, cid: int, state: dict[str, Any]) -> None:
        self._write_file(cid, self._round[cid], state)

    def _write_file(self, cid: int, rnd: int, state: dict[str, Any]) -> None:
        write_state_file(self.path(cid, rnd), state, identity(cid, rnd, self.run))
        self.files_written += 1


def make_state_store(cfg, fabric: Fabric, run_dir: Path, owns: Callable[[int], bool]):
    """The store `state.cache_mb` asks for: null = everything in memory, else on disk behind that cache, in the run's
    namespace (fl/core/state_files.py), which each process locks for the run (fl/core/state_lock.py). A fresh run's
    id is rank 0's, broadcast; a resume takes the checkpoint's. The processes agree, so all of them stop or none."""
    if cfg.state.cache_mb is None:
        return ClientStateStore()
    folder = namespace_dir(cfg.state.dir, run_dir)
    run = fabric.broadcast(new_run_id() if fabric.global_rank == 0 else None, src=0)
    lock, problem, notice = NamespaceLock(folder, fabric.global_rank), None, None
    try:
        check_writable(folder)
        notice = lock.acquire()
    except StateStoreError as err:
        problem = (isinstance(err, StateDirInUse), str(err))
    problems = [p for p in gather_objects(fabric, problem) if p]
    if problems:
        lock.release()
        in_use, message = problems[0]
        raise (StateDirInUse if in_use else StateStoreError)(message)
    if notice:
        print(notice, file=sys.stderr)
    return DiskStateStore(folder, int(cfg.state.cache_mb * 2**20), owns, run, nodes=int(cfg.fabric.num_nodes),
                          lock=lock, agree=lambda obj: gather_objects(fabric, obj))


def check_state_dir(state_dir: Optional[str], run_dir: Optional[Path]) -> None:
    """Before a run with state.cache_mb writes anything: state.dir can be written, and no live run holds the namespace
    this run will use (`run_dir`: its run directory, where known before it is created)."""
    if state_dir:
        check_writable(Path(state_dir))
    if run_dir is not None:
        problem = namespace_in_use(namespace_dir(state_dir, run_dir))
        if problem:
            raise StateDirInUse(problem)


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
