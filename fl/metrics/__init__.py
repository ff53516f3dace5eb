"""Evaluators every method gets (each registers itself): system / routing accuracy (system.py), FedACD's
adaptability and global-accuracy diagnostics (adaptability.py), the target client's accuracy (target.py)."""
from fl.metrics import adaptability, el_weights, system, target  # noqa: F401  (register the evaluators)
