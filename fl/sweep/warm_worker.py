"""A warm process for the runs of a sweep or a reproduction: torch, Lightning and fl are imported once, and each run
the parent sends is `python -m fl.train`'s work in this process (`fl.run.train.main`), its output in its own log.

Each run is isolated as a process would isolate it, in what outlives a run in Python: the environment, torch's
global flags and thread count, the registries (a `plugins=` module is imported afresh by the next run that names
it), compiled graphs, warnings shown once, and every seed (each run seeds its own draws). A run that exits non-zero
or raises ends the worker after it (the next run gets a fresh process), and so does anything that kills the process,
which fails that run alone. Runs on several processes (Fabric ddp, several nodes) never come here
(fl/sweep/runner.py starts them as their own processes).

Protocol: the parent writes one JSON object a line on stdin, {"argv": [...], "log": path}; for each, this process
writes {"code": exit code, "cpu_s": CPU seconds} on the stdout it started with (the run's own output goes to the
log, appended)."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Optional

from fl.run.cpu_threads import sleep_at_barriers

sleep_at_barriers()  # as fl/train.py, before torch loads

COMMAND = [sys.executable, "-m", "fl.sweep.warm_worker"]


def available() -> bool:
    """Warm workers need POSIX (resource's CPU time, select on a pipe); elsewhere every run is its own process."""
    return os.name == "posix"


def single_process(config: dict) -> bool:
    """Whether a run's resolved config (flattened) can run in a warm worker: one process (no ddp, one device, one
    node), and not deterministic on a GPU (cuBLAS reads CUBLAS_WORKSPACE_CONFIG when CUDA starts, which an earlier run
    in the process may have done)."""
    gpu_deterministic = bool(config.get("fabric.deterministic")) and str(config.get("fabric.accelerator")) != "cpu"
    return (bool(config) and str(config.get("fabric.strategy", "auto")) in ("auto", "single_device")
            and str(config.get("fabric.devices", 1)) == "1" and str(config.get("fabric.num_nodes", 1)) == "1"
            and not gpu_deterministic)


def torch_flags() -> dict:
    """The global settings a run may change that outlive it: what a fresh process starts with is what the next gets."""
    import torch

    return {"deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "threads": torch.get_num_threads(), "dtype": torch.get_default_dtype(),
            "matmul": torch.get_float32_matmul_precision(), "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic}


def restore_torch_flags(flags: dict) -> None:
    import torch

    torch.use_deterministic_algorithms(flags["deterministic"], warn_only=flags["warn_only"])
    torch.set_num_threads(flags["threads"])
    torch.set_default_dtype(flags["dtype"])
    torch.set_float32_matmul_precision(flags["matmul"])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = (flags["cudnn_benchmark"],
                                                                         flags["cudnn_deterministic"])
    torch.compiler.reset()  # a later run compiles its own graphs, within its own recompile limit


@contextlib.contextmanager
def isolated():
    """Around one run: what it changes in the process's globals is put back afterwards."""
    from fl.core import plugins, registry

    environ, flags = dict(os.environ), torch_flags()
    tables = {kind: dict(table) for kind, table in registry.TABLES.items()}
    origins, failed = dict(plugins.ORIGINS), dict(plugins.FAILED)
    gc.freeze()  # what exists before the run outlives it: the collection afterwards scans only what the run made
    try:
        with warnings.catch_warnings():  # entering resets the once-per-location registries; leaving, the filters
            yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        restore_torch_flags(flags)
        added = {plugins.ORIGINS[key] for key in set(plugins.ORIGINS) - set(origins)}
        for kind, table in registry.TABLES.items():
            table.clear()
            table.update(tables[kind])
        plugins.ORIGINS.clear()
        plugins.ORIGINS.update(origins)
        plugins.FAILED.clear()
        plugins.FAILED.update(failed)
        for name in added - {None}:  # a plug-in module the run imported registers again in the next run naming it
            sys.modules.pop(name, None)
        gc.collect()


def run_one(train, argv: list[str], log: str) -> tuple[int, float]:
    """One run, its stdout and stderr (Python's and the libraries' alike) appended to `log`: exit code, CPU seconds."""
    import resource

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    before = resource.getrusage(resource.RUSAGE_SELF)
    with open(log, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            with isolated():
                code = train(argv)
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else 1
        except KeyboardInterrupt:  # Ctrl-C before the run's own handler took over, as the command would end
            print("interrupted", file=sys.stderr)
            code = 130
        except BaseException:  # a fault the command would have printed as a traceback
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    after = resource.getrusage(resource.RUSAGE_SELF)
    return int(code), (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from fl.core import registry
    from fl.run.process_exit import end_process
    from fl.run.train import main as train

    registry.load_plugins()  # the built-ins and installed plug-ins: what every run starts with

    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the parent's pipe, kept apart from the runs' output
    code = 0
    try:
        for line in sys.stdin:
            job = json.loads(line)
            code, cpu = run_one(train, job["argv"], job["log"])
            replies.write(json.dumps({"code": code, "cpu_s": cpu}) + "\n")
            if code != 0:  # what failed may have left the process in a state the next run should not inherit
                break
    except KeyboardInterrupt:  # Ctrl-C between runs reaches the whole process group: the parent says what happened
        code = 130
    with contextlib.suppress(OSError):
        replies.close()
    end_process(code)


class Worker:
    """The parent's side: one warm process, one run at a time."""

    def __init__(self, env: dict):
        import subprocess

        self.proc = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                     bufsize=1)

    def start(self, argv: list[str], log: Path) -> None:
        with contextlib.suppress(OSError):  # a process that died: result() reads its end and exit code
            self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
            self.proc.stdin.flush()

    def result(self) -> Optional[tuple[int, Optional[float]]]:
        """(exit code, CPU seconds) once the run is over, else None. A process that died mid-run gives its own exit
        code (negative: the signal that killed it) and no CPU time."""
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], 0)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:  # the process ended
            return self.proc.wait(), None
        reply = json.loads(line)
        return reply["code"], reply["cpu_s"]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait()

    def terminate(self) -> None:
        self.proc.terminate()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # during the imports
        sys.exit(130)
