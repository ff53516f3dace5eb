"""Real dataset loaders. Each module registers its datasets with `fl.core.register_dataset`;
a loader takes the `data` config block and returns a `fl.data.base.Pool`."""
from fl.data.sources import (  # noqa: F401  (registers the datasets)
    arrays,
    cifar,
    domains,
    fedpals_synthetic,
    iwildcam,
    mnist,
    tinyimagenet,
)
