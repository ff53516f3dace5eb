"""W&B sweep files: parsing and expansion (spec.py), the offline runner and --make (runner.py):
`python -m fl.sweep`."""
