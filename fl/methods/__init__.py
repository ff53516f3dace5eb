"""Importing this package registers every method (one module each)."""
from fl.methods import centralized, fedavg, fedavg_ft, fedper, fedprox, local  # noqa: F401
