"""What a server's `aggregate` returned, checked where the loop receives it: a plug-in aggregator that returns None,
numpy arrays, a dict missing a tensor or with one of another shape, or non-finite values would otherwise train on
silently (a dropped update, a checkpoint without the tensor, NaN parameters scored as an ordinary accuracy).

Structure (type, keys, shapes, dtypes) is a fault in the aggregator's code: the run stops with exit 1, naming it.
Non-finite values stop the run as the non-finite guard does for a client (summary.json marks where), naming the
aggregator and the round; a run is never evaluated on them."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

import fl.core.plugins as plugins
from fl.core.aggregation import Uploads
from fl.core.divergence import Divergence
from fl.core.plugin_calls import PluginFault


class AggregatorFault(PluginFault):
    """An aggregate of the wrong type, keys, shapes or dtypes: a fault in the code that returned it."""


def aggregator_label(server) -> str:
    """The component whose result is checked: the chosen aggregator, or the method's own `aggregate`."""
    if server.uses_chosen_aggregator:
        return f"server.aggregator.name={server.aggregation.name!r} ({plugins.code_location(server.aggregator.fn)})"
    return f"method.name={server.cfg.method.name!r}'s aggregate ({plugins.code_location(type(server).aggregate)})"


def structure_problem(result, reference: Optional[dict[str, Tensor]]) -> Optional[str]:
    """Why `result` is not a dict of tensors with `reference`'s keys, shapes and dtypes (None: it is). `reference`:
    what the clients uploaded (their weighted mean or one upload); None checks only that it is a dict of tensors."""
    if not isinstance(result, dict):
        return f"returned {plugins.type_name(result)}, not a dict of torch tensors (parameter name -> tensor)"
    for key, value in result.items():
        if not isinstance(value, Tensor):
            return f"returned {plugins.type_name(value)} for {key!r}, not a torch.Tensor"
    if reference is None:
        return None
    missing, extra = [k for k in reference if k not in result], [k for k in result if k not in reference]
    if missing:
        return (f"returned no tensor for {len(missing)} of the {len(reference)} uploaded parameters (first: "
                f"{missing[0]!r}); it must return every uploaded parameter")
    if extra:
        return (f"returned {len(extra)} key{'s' if len(extra) > 1 else ''} the clients did not upload (first: "
                f"{extra[0]!r}); it must return exactly the uploaded parameters")
    for key, ref in reference.items():
        value = result[key]
        if value.shape != ref.shape:
            return f"returned {key!r} of shape {tuple(value.shape)}; the uploads' is {tuple(ref.shape)}"
        if value.dtype != ref.dtype:
            return (f"returned {key!r} as {str(value.dtype).removeprefix('torch.')}; the uploads' is "
                    f"{str(ref.dtype).removeprefix('torch.')}")
    return None


def first_non_finite(params: dict[str, Tensor]) -> Optional[str]:
    """The first floating tensor (in key order) holding NaN or inf, or None: one host sync per call (once a round)."""
    floats = [(k, v) for k, v in params.items() if v.is_floating_point()]
    if not floats:
        return None
    finite = torch.stack([torch.isfinite(v).all() for _, v in floats]).cpu()
    bad = torch.nonzero(~finite).flatten()
    return floats[int(bad[0])][0] if len(bad) else None


def check_aggregate(result, uploads: Uploads, server, rnd: int) -> Optional[Divergence]:
    """Raise AggregatorFault for a result of the wrong structure; return where it holds non-finite values (None:
    every value is finite). The chosen aggregator must return the uploads' keys, shapes and dtypes; a method's own
    `aggregate` may return other tensors, and is checked for type and finite values only."""
    own = not server.uses_chosen_aggregator
    reference = None if own else uploads.reference()
    if reference is not None and not reference and (result is None or isinstance(result, dict) and not result):
        return None  # a round without uploads (no client was sampled) has nothing to aggregate
    problem = structure_problem(result, reference)
    if problem is not None:
        raise AggregatorFault(f"{aggregator_label(server)} {problem} (round {rnd})")
    key = first_non_finite(result)
    if key is None:
        return None
    return Divergence(rnd, None, server.cfg.method.name,
                      f"{aggregator_label(server)} returned non-finite values in {key!r}")
