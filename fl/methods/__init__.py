"""Importing this package registers every method (one module each)."""
from fl.methods import centralized, fedavg, fedavg_ft, fedpals, fedper, fedprox, local, scaffold  # noqa: F401
