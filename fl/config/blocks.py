"""The schema of a run, built from what its config chooses: the chosen method's typed config (method.*), the
chosen dataset's settings (data.*, beside the keys every dataset takes), the chosen partition's (data.partition.*),
client transform's (data.client_transform.*) and aggregator's (server.aggregator.*), each registered with its plug-in
(fl/core/registry.py), and one typed block per evaluator (evaluators.<name>).
"""
from __future__ import annotations

import copy
from dataclasses import field, fields, make_dataclass
from functools import cache

from omegaconf import DictConfig, OmegaConf

from fl.config.errors import ConfigError, choices_msg
from fl.config.schema import AggregatorConfig, ClientTransformConfig, Config, DataConfig, PartitionConfig, ServerConfig
from fl.core import registry


def data_choices() -> tuple[tuple[str, dict, type], ...]:
    """Each data plug-in choice: the block its `name` key picks it in, the table it names, the keys every choice of
    that block takes. A dataset's settings are data.* keys, beside num_clients and the other pipeline keys."""
    return (("data", registry.DATASETS, DataConfig), ("data.partition", registry.PARTITIONS, PartitionConfig),
            ("data.client_transform", registry.CLIENT_TRANSFORMS, ClientTransformConfig))


def plugin_choices() -> tuple[tuple[str, dict, type], ...]:
    """data_choices, and the aggregator: server.aggregator.name picks it, its settings are server.aggregator.*."""
    return (*data_choices(), ("server.aggregator", registry.AGGREGATORS, AggregatorConfig))


def check_choice(key: str, value, table: dict) -> None:
    """`value` names an entry of `table` that can be used: else one line naming the choices, or the file that failed
    to register it, or the two files that registered it (fl/core/plugins.py)."""
    why = registry.unavailable(table, value) if isinstance(value, str) else None
    if why:
        raise ConfigError(f"{key}={value!r} cannot be used: {why}")
    if not isinstance(value, str) or value not in table:
        missing = registry.not_loaded(table)
        raise ConfigError(choices_msg(key, value, table) + (f" ({missing})" if missing else "") + "; a plug-in's "
                          "name is there once its module is imported: plugins=[package.module], or its package "
                          "installed with an fl.plugins entry point")


def _default_name(base: type) -> str:
    return next(f.default for f in fields(base) if f.name == "name")


def chosen(*sources) -> dict[str, str]:
    """What the sources choose, the last one that names it winning: {"method": ..., "data": ..., "data.partition":
    ...}, each checked against its table."""
    registry.load_plugins()
    picks = {"method": "fedavg", **{block: _default_name(base) for block, _, base in plugin_choices()}}
    for src in sources:
        for block in picks:
            value = OmegaConf.select(src, f"{block}.name", default=None)
            picks[block] = picks[block] if value is None else value
    tables = {"method": registry.METHODS, **{block: table for block, table, _ in plugin_choices()}}
    for block, value in picks.items():
        check_choice(f"{block}.name", value, tables[block])
    return picks


@cache
def block_class(base: type, plugin: registry.DataPlugin) -> type:
    """The typed block of a plug-in choice: the keys `base` gives every choice, then the plug-in's own settings."""
    clash = sorted({f.name for f in fields(plugin.settings)} & {f.name for f in fields(base)})
    if clash:  # registration refuses this (registry.SHARED_KEYS); a plug-in registered before fl.config loaded
        raise ConfigError(f"{plugin.name!r}: its setting {clash[0]!r} has the name of a key every choice of its block "
                          f"takes ({base.__name__}); rename the setting")
    name = next(f for f in fields(base) if f.name == "name")
    return make_dataclass(f"{base.__name__}_{plugin.name}", [("name", str, field(default=plugin.name,
                                                                                   metadata=name.metadata))],
                          bases=(plugin.settings, base))


def schema(picks: dict[str, str]) -> DictConfig:
    """The structured config of a run with these choices (`chosen`): a copy of it, the caller's to change."""
    return copy.deepcopy(shared_schema(picks))


def shared_schema(picks: dict[str, str]) -> DictConfig:
    """schema(picks) itself, built once per set of chosen classes (building it takes ~50 ms, and a sweep or a
    reproduction loads hundreds of configs): shared, so never to be changed (OmegaConf.merge copies its first
    argument)."""
    return _structured(registry.METHODS[picks["method"]].config_cls, registry.PARTITIONS[picks["data.partition"]],
                       registry.CLIENT_TRANSFORMS[picks["data.client_transform"]], registry.DATASETS[picks["data"]],
                       registry.AGGREGATORS[picks["server.aggregator"]], tuple(registry.EVALUATORS.items()))


@cache
def _structured(method: type, partition_plugin, transform_plugin, dataset_plugin, aggregator_plugin,
                evaluators: tuple) -> DictConfig:
    partition = block_class(PartitionConfig, partition_plugin)()
    transform = block_class(ClientTransformConfig, transform_plugin)()
    data = block_class(DataConfig, dataset_plugin)(partition=partition, client_transform=transform)
    aggregator = block_class(AggregatorConfig, aggregator_plugin)()
    settings = make_dataclass("EvaluatorSettings", [(name, cls.Settings, field(default_factory=cls.Settings))
                                                    for name, cls in evaluators])()
    return OmegaConf.structured(Config(method=method(), data=data, server=ServerConfig(aggregator=aggregator),
                                       evaluators=settings))


@cache
def settings_keys(settings: type) -> frozenset[str]:
    """The dotted keys of a settings class's leaves (a nested block's keys as block.key)."""
    def leaves(node, prefix: str = ""):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [prefix + key]
    return frozenset(leaves(OmegaConf.to_container(OmegaConf.structured(settings))))


def drop_replaced_settings(lower: DictConfig, upper: DictConfig) -> None:
    """Where `upper` (a config over its includes, the command line over the config) names another dataset or
    partition than `lower` does, the settings `lower` gives the one it names that the new one does not take leave
    `lower`: they belong to the plug-in replaced (a real dataset's data.download, under its synthetic twin's
    generated data), as a replaced method's hyperparameters do. Settings both take stay, as they always have."""
    for block, table, base in plugin_choices():
        new = OmegaConf.select(upper, f"{block}.name", default=None)
        old = OmegaConf.select(lower, f"{block}.name", default=None) or _default_name(base)
        if new == old or new not in table or old not in table:
            continue
        for key in settings_keys(table[old].settings) - settings_keys(table[new].settings):
            parent, _, leaf = f"{block}.{key}".rpartition(".")
            node = OmegaConf.select(lower, parent, default=None)
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]


def other_takers(key: str, schema_node: DictConfig) -> str:
    """For an unknown data key: the datasets or partitions whose settings have it (`data.variant` is EMNIST's),
    as a hint; "" if none has."""
    for block, table, _ in sorted(plugin_choices(), key=lambda choice: -len(choice[0])):
        if key.startswith(block + "."):
            rel = key[len(block) + 1:]
            takers = sorted(name for name, plugin in table.items()  # a leaf, or a block of them (data.embedded)
                            if any(k == rel or k.startswith(rel + ".") for k in settings_keys(plugin.settings)))
            if not takers:
                return ""
            current = OmegaConf.select(schema_node, f"{block}.name")
            return f": {key} is a setting of {block}.name={', '.join(takers)}, not of {block}.name={current!r}"
    return ""
