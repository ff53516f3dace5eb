"""What crosses processes each round: the weighted parameter sums (a float64 all-reduce) and every client's
result (gathered in client order), plus the byte counts of what would travel."""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
import torch.distributed as dist

if TYPE_CHECKING:  # Lightning loads with the run, not with a method or an evaluator
    from lightning.fabric import Fabric

    from fl.core.divergence import Divergence


@dataclass
class LocalResult:
    """What one client's local work produced, as exchanged between processes (all on CPU)."""
    cid: int
    state: dict[str, Any]
    message: dict[str, Any]
    logs: dict[str, float]
    fault: Optional[Divergence] = None  # a non-finite loss or parameter: where (round, client, method, reason)
    bytes_up: int = 0  # tensors and arrays sent to the server (parameters and message)
    bytes_down: int = 0  # tensors and arrays of the server's broadcast to this client
    norms: Optional[tuple[float, float]] = None  # (its upload's parameter norm, the initial model's of the same)


@dataclass
class WeightedSum:
    """Streaming sum_i w_i * params_i in float64, so memory does not grow with the clients of a round.
    Integer tensors (counters such as BatchNorm's num_batches_tracked) are not averaged: their
    elementwise maximum over the clients is kept."""
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    total: float = 0.0

    def add(self, params: dict[str, torch.Tensor], weight: float) -> None:
        for k, v in params.items():
            v64 = v.to(torch.float64)
            if k not in self.sums:
                self.sums[k] = torch.zeros_like(v64) if v.is_floating_point() else torch.full_like(v64, -math.inf)
                self.dtypes[k] = v.dtype
            if v.is_floating_point():
                self.sums[k].add_(v64, alpha=weight)
            else:
                torch.maximum(self.sums[k], v64, out=self.sums[k])
        self.total += weight

    def layout(self) -> list[tuple[str, tuple, torch.dtype]]:
        return [(k, tuple(v.shape), self.dtypes[k]) for k, v in self.sums.items()]


def exchange(fabric: Fabric, acc: WeightedSum, results: list[LocalResult]) -> tuple[dict, list[LocalResult]]:
    """All-reduce the weighted parameter sums into their mean and gather every client's result, in client
    order, on every process."""
    parts = gather_objects(fabric, (results, acc.layout(), acc.total))
    gathered = [r for res, _, _ in parts for r in res]
    layouts = [lay for _, lay, _ in parts]
    total = sum(tot for _, _, tot in parts)
    gathered.sort(key=lambda r: r.cid)
    layout = next((lay for lay in layouts if lay), [])
    if not layout or total <= 0:
        return {}, gathered
    mean = {}
    for floating, op in ((True, "sum"), (False, "max")):  # weighted sums, then integer maxima
        part = [(k, shape, dtype) for k, shape, dtype in layout if dtype.is_floating_point == floating]
        if not part:
            continue
        empty = 0.0 if floating else -math.inf  # a process without clients contributes nothing
        flat = torch.cat([acc.sums[k].flatten() if k in acc.sums else
                          torch.full((math.prod(shape),), empty, dtype=torch.float64, device=fabric.device)
                          for k, shape, _ in part])
        if fabric.world_size > 1:
            flat = fabric.all_reduce(flat, reduce_op=op)
        if floating:
            flat = flat / total
        offset = 0
        for k, shape, dtype in part:
            n = math.prod(shape)
            mean[k] = flat[offset:offset + n].view(shape).to(dtype)
            offset += n
    return {k: mean[k] for k, _, _ in layout}, gathered


def gather_objects(fabric: Fabric, obj: Any) -> list[Any]:
    """Every process's `obj`, in rank order (a broadcast from each process in turn)."""
    if fabric.world_size == 1:
        return [obj]
    return [fabric.broadcast(obj if fabric.global_rank == src else None, src=src) for src in range(fabric.world_size)]


def gather_to_zero(fabric: Fabric, obj: Any) -> Optional[list[Any]]:
    """Every process's `obj`, in rank order, on process 0 only (None on the others), through host memory. Fabric
    offers no gather to one process: torch.distributed's gather_object over a gloo group, since under NCCL an
    object collective stages the pickled payload in GPU memory (and a broadcast would send it to every process)."""
    if fabric.world_size == 1:
        return [obj]
    parts = [None] * fabric.world_size if fabric.global_rank == 0 else None
    dist.gather_object(obj, parts, dst=0, group=host_group())
    return parts


_HOST_GROUP: dict[str, weakref.ref] = {}


def host_group() -> Optional[dist.ProcessGroup]:
    """A process group whose object collectives stay in host memory: the default one when it has a gloo backend
    (CPU runs), else a gloo group over the same processes, created at the first call (a collective call: every
    process makes it at the same point of the run).

    Only weak references are kept: a group kept alive here would outlive destroy_process_group (Fabric calls it at
    exit) and be destroyed during interpreter finalization, where a Gloo worker thread still releasing a finished
    gather's tensors cannot take the GIL and the process aborts ("terminate called without an active exception")."""
    if "gloo" in dist.get_backend():  # "gloo", or "cpu:gloo,cuda:nccl" (object collectives then take the CPU one)
        return None
    world, group = (_HOST_GROUP[k]() if k in _HOST_GROUP else None for k in ("world", "group"))
    if world is not dist.group.WORLD or group is None:  # one per default group (a new run in this process)
        group = dist.new_group(backend="gloo")
        _HOST_GROUP.update(world=weakref.ref(dist.group.WORLD), group=weakref.ref(group))
    return group


def payload_bytes(obj: Any) -> int:
    """Bytes of the tensors and arrays in a (nested) payload, as they would travel."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


def all_finite(params: dict[str, torch.Tensor]) -> bool:
    floats = [p for p in params.values() if p.is_floating_point()]
    return not floats or bool(torch.isfinite(torch.stack([p.sum() for p in floats])).all())


def to_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
