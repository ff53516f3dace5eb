"""What the shared conformance tests (tests/core/test_conformance.py and the generic tests of precision and parallel
clients) run over: every method, dataset, partition, client transform and aggregator the package registers, read from
the registries, so a file added under fl/ is picked up with no test edited; and the small runs each is tested in.

A method's run takes its registration's `needs` (a target, a public set, ...); FASTER only makes some runs cheaper.
A data plug-in runs in the first of a few small configurations its checks accept (a partition of domains on the
generated multi-domain data, feature vectors with the mlp); a dataset none of them accepts reads files, and an empty
data.root must then be refused in one line naming it.
"""
from __future__ import annotations

import functools
from pathlib import Path

from fl.core import plugins, registry

registry.load_plugins()


def shipped(kind: str) -> list[str]:
    """The names of `kind` ("method", "dataset", ...) that modules of the package registered, sorted (tests register
    methods of their own, which are left out)."""
    table = registry.TABLES[kind]
    return sorted(n for n in table if (plugins.origin(kind, n) or "").startswith("fl."))


METHODS = shipped("method")
DATASETS = shipped("dataset")
PARTITIONS = shipped("partition")
CLIENT_TRANSFORMS = [n for n in shipped("client transform") if n != "none"]  # none: every run's default
AGGREGATORS = [n for n in shipped("aggregator") if n != "mean"]  # mean: every run's default

# cheaper settings for methods whose defaults are sized for real data (speed only: a method without an entry runs)
FASTER = {
    "creff": ("method.num_of_feature=4", "method.match_epoch=2", "method.crt_epoch=2"),
    "fedbabu": ("method.finetune_epochs=1",),
    "confree": ("trainer.local_steps=6", "method.head_steps=2"),
    "fedrep": ("trainer.local_steps=6", "method.head_steps=2"),
    "fedas": ("trainer.local_steps=4", "method.align_steps=1"),
}
# settings that make an aggregator choose among this many clients (its defaults otherwise)
AGGREGATOR_SETTINGS = {"trimmed_mean": ("server.aggregator.trim_fraction=0.34",),  # trims 1 value a side of 3
                       "krum": ("server.aggregator.f=0", "server.aggregator.m=2"),
                       "norm_clip": ("server.aggregator.max_norm=0.5",)}
# every shipped model goes through fl.testing's check but these, whose runs cost ten times the others' even on a tiny
# federation: their shapes, norms and weights are tests/models/'s, and every run checks a model's outputs at the door
HEAVY_MODELS = {"resnet18", "resnet50", "vit_s16", "alexnet_bn"}  # alexnet_bn: not even 32 px images are enough
MODELS = [n for n in shipped("model") if n not in HEAVY_MODELS]
EVALUATORS = shipped("evaluator")
# what makes an evaluator log its metrics (a method with client models, a router, a target; its defaults otherwise)
EVALUATOR_SETTINGS = {"system": ("method.name=fedper",), "el_weights": ("method.name=feddrm",),
                      "target": ("data.target.distribution=partition",)}
# a small federation: 4 clients of 16 images per class
SMALL = ("data.num_clients=4", "data.embedded.samples_per_class=16")


def method_args(name: str) -> tuple[str, ...]:
    return (f"method.name={name}", *registry.METHODS[name].needs, *FASTER.get(name, ()))


def aggregator_args(name: str) -> tuple[str, ...]:
    return (f"server.aggregator.name={name}", *AGGREGATOR_SETTINGS.get(name, ()))


CANDIDATES = {  # kind -> key, then the configurations tried in order
    "dataset": ("data.name", ((), ("model.name=mlp",))),
    "partition": ("data.partition.name", ((), ("data.name=embedded_domains",))),
    "client transform": ("data.client_transform.name", ((), ("data.name=embedded_domains",))),
}


@functools.cache
def data_args(kind: str, name: str, root: str) -> tuple[str, ...] | str:
    """The first small configuration with the data plug-in whose config, data and model checks pass (data generated
    under `root`; run it with optional=SMALL), or the one-line message of the last refusal."""
    from fl.config import ConfigError, load_config
    from fl.data import build_data
    from fl.run.train import check_model
    from tests.helpers import tiny

    key, candidates = CANDIDATES[kind]
    message = ""
    for extra in candidates:
        args = (f"{key}={name}", *extra)
        try:
            cfg = load_config(tiny(Path(root), *args, optional=SMALL))
            check_model(cfg, build_data(cfg))
            return args
        except ConfigError as err:
            message = str(err)
    return message
