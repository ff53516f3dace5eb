"""Two gloo processes call exchange.gather_to_zero twice with the default group's backend reported as NCCL, so the
objects must travel through the gloo group gather_to_zero makes for host memory. `python tests/gather_to_zero.py
OUT_DIR` writes OUT_DIR/<rank>.pt: what each process received and which group carried it."""
import gc
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fl.core import exchange


def worker(rank: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=2)
    dist.get_backend = lambda group=None: "nccl"  # as under NCCL: object collectives of the default group use GPUs
    fabric = SimpleNamespace(world_size=2, global_rank=rank)
    first = exchange.gather_to_zero(fabric, {"rank": rank, "state": torch.full((3,), float(rank))})
    group = exchange.host_group()
    second = exchange.gather_to_zero(fabric, [rank] * (rank + 1))  # sizes differ between processes
    result = {"first": first, "second": second, "own_group": group is not None,
              "same_group": exchange.host_group() is group, "group_size": dist.get_world_size(group)}
    # the groups must die with destroy_process_group, not at interpreter finalization (where a Gloo worker thread
    # still releasing the gather's tensors cannot take the GIL, and the process aborts)
    alive = weakref.ref(group)
    del group
    dist.destroy_process_group()
    gc.collect()
    result["group_outlives_destroy"] = alive() is not None
    torch.save(result, out / f"{rank}.pt")


if __name__ == "__main__":
    mp.spawn(worker, args=(Path(sys.argv[1]),), nprocs=2)
