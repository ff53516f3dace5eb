"""One run at a time in a state namespace: each process of a run holds `rank<r>.lock` there while it runs (the
processes of one run share the namespace, each with its own lock; a second run has a rank 0 too, and is refused).

The lock is an advisory `flock` on the file, which the operating system drops when its process dies, and the file
names its holder (pid, host) for the messages. Released at the end of a run, the file is deleted, so a lock
file that outlives its process is stale: on the same host the next run takes it over with a notice. One left by a
process on another host cannot be checked from here: the run is refused, and the message says which file to delete
once no run uses it."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
from pathlib import Path
from typing import Any, Optional

from fl.core.state_files import StateStoreError

try:
    import fcntl
except ImportError:  # no flock on this platform: a lock goes by the pid it names
    fcntl = None

UNSUPPORTED = (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)  # a file system without flock


class StateDirInUse(StateStoreError):
    """Another run uses this namespace: refused before anything is written (exit 2)."""


def _holder(text: str) -> Optional[dict[str, Any]]:
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) and {"pid", "host"} <= set(holder) else None


def _describe(holder: Optional[dict[str, Any]]) -> str:
    if holder is None:
        return "a holder it does not name"
    where = "this host" if holder["host"] == socket.gethostname() else f"host {holder['host']}"
    return f"pid {holder['pid']} on {where}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _in_use(folder: Path, path: Path, holder: Optional[dict[str, Any]]) -> StateDirInUse:
    return StateDirInUse(f"state.dir {folder} is in use by another run ({_describe(holder)}, {path.name}): wait for it "
                         "to end (a new run can take another logger.run_name or state.dir)")


def _elsewhere(folder: Path, path: Path, holder: dict[str, Any]) -> StateDirInUse:
    return StateDirInUse(f"state.dir {folder} is locked by {_describe(holder)} ({path}), which cannot be checked from "
                         f"here: if no run uses it there, delete {path}")


def _try_flock(fd: int, exclusive: bool) -> Optional[bool]:
    """True: locked; False: another process holds it; None: no flock here (platform or file system)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in UNSUPPORTED:
            return None
        raise


class NamespaceLock:
    def __init__(self, folder: Path, rank: int) -> None:
        self.folder = Path(folder)
        self.path = self.folder / f"rank{rank}.lock"
        self._fd: Optional[int] = None

    def acquire(self) -> Optional[str]:
        """Takes the lock, or raises StateDirInUse naming its holder; returns a notice when it took over a stale one."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = _try_flock(fd, exclusive=True)
                holder = _holder(os.read(fd, 4096).decode(errors="replace"))
                if locked is False:
                    raise _in_use(self.folder, self.path, holder)
                try:  # released (and deleted) since we opened it: open the file that is there now
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    os.close(fd)
                    continue
                stale = self._judge(holder, locked)
                me = {"pid": os.getpid(), "host": socket.gethostname()}
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(me).encode(), 0)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return stale

    def _judge(self, holder: Optional[dict[str, Any]], locked: Optional[bool]) -> Optional[str]:
        """A lock file found unlocked with a holder in it: the notice for taking it over, or StateDirInUse."""
        if holder is None:
            return None if self.path.stat().st_size == 0 else (
                f"notice: took over {self.path}, which held no readable holder (a run that ended mid-write)")
        if holder["host"] != socket.gethostname():
            raise _elsewhere(self.folder, self.path, holder)
        if locked is None and _alive(int(holder["pid"])):  # without flock, a live pid is all there is to go by
            raise _in_use(self.folder, self.path, holder)
        return f"notice: took over the stale lock {self.path} of {_describe(holder)}, which has ended"

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # the namespace was deleted or replaced: nothing left to release
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def namespace_in_use(folder: Path) -> Optional[str]:
    """Why a new run cannot use `folder` (a live run holds one of its locks), or None; it takes no lock, so a run
    can be refused before it writes anything."""
    for path in sorted(Path(folder).glob("rank*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            locked = _try_flock(fd, exclusive=False)
            holder = _holder(os.read(fd, 4096).decode(errors="replace"))
        finally:
            os.close(fd)
        if holder is not None and holder["host"] != socket.gethostname():
            return str(_elsewhere(Path(folder), path, holder))
        if locked is False or (locked is None and holder is not None and _alive(int(holder["pid"]))):
            return str(_in_use(Path(folder), path, holder))
    return None
