"""The partitions, a module each: each registers `fn(candidates, num_clients, s, rng)` with
`@register_partition(name, Settings)`, where `candidates` (fl.data.base.Candidates) holds the labels (and domains)
of the samples to split, `s` is the `data.partition` block (the keys every partition takes, with its own Settings
among them) and `rng` a seeded numpy Generator; it returns one sorted array of positions into the candidates per
client. Impossible requests raise ConfigError naming the key to change, never loop forever. Every module here is
imported, so a new partition is one new file."""
from fl.core.registry import discover

discover(__name__)
