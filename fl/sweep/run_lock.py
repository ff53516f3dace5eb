"""One invocation at a time runs a given run: two `fl.sweep` or `fl.reproduce` commands pointed at one output folder
each take a run's lock before starting it, so the second waits for the run the first is training and then reuses
it, instead of training it again beside it (fl.train would name its copy `<run>-1`).

The lock is an advisory `flock` on `<sweep dir>/logs/<run>.lock`, which the operating system drops when the process
holding it dies, so a killed command leaves nothing to clean up; the file itself stays (deleting it would let two
processes lock two different files of one name). fl/core/state_lock.py's NamespaceLock serves a run's state folder
and names its holder for its messages; a run's lock needs neither. Without flock (another platform, a file system
without it) there is no lock, as before."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:
    fcntl = None

UNSUPPORTED = (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


def lock_path(run_dir: Path) -> Path:
    return run_dir.parent / "logs" / f"{run_dir.name}.lock"


def try_lock(run_dir: Path) -> Optional[int]:
    """The run's lock (an open file descriptor; release() gives it back), or None when another process holds it.
    Where flock is missing, -1: no lock to hold."""
    if fcntl is None:
        return -1
    path = lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as err:
        os.close(fd)
        if err.errno in UNSUPPORTED:
            return -1
        raise
    return fd


def release(fd: Optional[int]) -> None:
    if fd is not None and fd >= 0:
        os.close(fd)  # closing the descriptor drops its flock
