"""Each client personalised once per evaluation.

An evaluation scores a client's personalised model up to four times: on its test split and on its validation split,
and in each evaluator that scores client models (system accuracy on both). `personalize` is seeded by (seed, round,
client, purpose), so each call gives the same model; fine-tuning it again is pure cost (FedBABU's was 26.7 of a
29.2 s evaluation on FedDRM's twin). A method whose `personalize` changes only the module's tensors (its state_dict)
and its `persistent` attributes says so with `ClientModule.reuse_personalized`; its clients are then personalised
on the first pass of an evaluation and restored from a copy on the later ones. Any other method personalises on
every pass, as before.

The copies stay on the host and take at most KEEP_BYTES per process: a client that would pass it is personalised
again on each pass (correct, only slower), so memory stays bounded whatever the number of clients or the model.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from torch import Tensor

KEEP_BYTES = 1 << 30  # 1 GiB of host memory per process: ~250 copies of a ResNet-18, thousands of the twins' CNNs


class PersonalizedModels:
    """The personalised clients of one evaluation (shared by its test and validation passes); `clear` ends it."""

    def __init__(self, keep_bytes: Optional[int] = None):
        self.keep_bytes = KEEP_BYTES if keep_bytes is None else keep_bytes
        self.kept_bytes = 0
        self._kept: dict[int, tuple[dict[str, Tensor], dict[str, Any], dict[str, float]]] = {}

    def personalize(self, module, cid: int) -> dict[str, float]:
        """`module` holds client cid as loaded (the broadcast, then its state): personalise it, or restore the
        personalised model kept from an earlier pass; returns the scalars `personalize` logged."""
        kept = self._kept.get(cid)
        if kept is not None:
            tensors, attributes, logs = kept
            module.load_state_dict(tensors)  # strict: the same module, so the same keys
            for name, value in attributes.items():
                setattr(module, name, copy.deepcopy(value))
            return dict(logs)
        logs = dict(module.personalize() or {})
        if type(module).reuse_personalized:
            state = module.state_dict()
            size = sum(t.numel() * t.element_size() for t in state.values())
            if self.kept_bytes + size <= self.keep_bytes:
                tensors = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
                attributes = {name: copy.deepcopy(getattr(module, name)) for name in module.persistent}
                self._kept[cid] = (tensors, attributes, dict(logs))
                self.kept_bytes += size
        return logs

    def clear(self) -> None:
        self._kept.clear()
        self.kept_bytes = 0
