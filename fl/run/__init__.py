"""`python -m fl.train`: the run front-end (train.py), its run directory (run_dir.py), where metrics go
(loggers.py) and the console (progress.py)."""
