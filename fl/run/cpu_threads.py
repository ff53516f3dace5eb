"""CPU threading that holds up on a shared machine. Imports nothing heavy: the entry points call it before torch loads.

torch's CPU kernels run on OpenMP threads, which by default spin at every barrier before they sleep. On a machine
whose cores are all busy (another job, the other runs of a sweep) a spinning thread takes the core the thread it
waits for needs, and a run became 10-40x slower with one competing process (issue 35). With OMP_WAIT_POLICY=PASSIVE
a waiting thread sleeps at once. OpenMP reads it when torch loads it, so it must be in the environment before the
first `import torch`; a value already there (the user's) is kept.

Runs started side by side (fl.sweep and fl.reproduce with --parallel N, pytest-xdist's workers) each get their share
of the cores as OMP_NUM_THREADS, which torch takes as its intra-op thread count (`fabric.cpu_threads` still wins).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"
NUM_THREADS = "OMP_NUM_THREADS"


def sleep_at_barriers(env: MutableMapping[str, str] = os.environ) -> None:
    """OMP_WAIT_POLICY=PASSIVE in `env` unless it is set."""
    env.setdefault(WAIT_POLICY, "PASSIVE")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as a container or taskset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform (macOS)
        return os.cpu_count() or 1


def share_of_cores(parallel: int) -> int:
    """Intra-op threads for each of `parallel` runs at once: the usable CPUs divided between them, at least 1."""
    return max(1, usable_cpus() // parallel)


def env_for_one_of(parallel: int, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of `env` for one of `parallel` processes started side by side: OpenMP threads that sleep at barriers,
    and (parallel > 1) its share of the cores as OMP_NUM_THREADS, unless `env` sets them."""
    out = dict(env)
    sleep_at_barriers(out)
    if parallel > 1:
        out.setdefault(NUM_THREADS, str(share_of_cores(parallel)))
    return out
