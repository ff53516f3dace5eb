"""Real dataset loaders. Each module registers its datasets with `fl.registry.register_dataset`;
a loader takes the `data` config block and returns a `fl.data.base.Pool`."""
from fl.data.sources import arrays, cifar, domains, fedpals_synthetic, mnist, tinyimagenet  # noqa: F401  (registers the datasets)
