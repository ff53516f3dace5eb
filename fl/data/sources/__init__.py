"""The datasets, a module each (some register several): each registers its loader with
`@register_dataset(name, Settings)`. A loader takes the `data` config block (the keys every dataset takes, with
the dataset's own settings among them) and returns a `fl.data.base.Pool`. Every module here is imported, so a new
dataset is one new file."""
from fl.core.registry import discover

discover(__name__)
