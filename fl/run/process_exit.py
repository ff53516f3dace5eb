"""The command line's last step: the process ends once what the run leaves is flushed and closed, without the
interpreter's teardown (it frees every module and tensor one by one: about 1.2 s after a run, issue 35). Only the
entry point calls it (fl/train.py); `fl.run.train.main` and every other library call return."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Exit with `code` after `main` returned. By then main has closed its files, its state store (pending writes
    done, the namespace lock released) and, when the run finished, its W&B run. What is left is closed here, in order:
    a W&B run still open (a run that stopped on an error; the interpreter's exit would have finished it with the exit
    code) and W&B's service; the process group of a Fabric ddp run, once every process got here (none leaves while
    another still talks to it), destroyed; logging's handlers; the standard streams."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:  # finishes a run left open with the exit code, waits for its data, stops the service
        wandb.teardown(exit_code=code)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(RuntimeError):  # another process is gone (it failed): no one left to wait for
            dist.barrier()
        dist.destroy_process_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            stream.flush()
    os._exit(code)
