"""`python -m fl.reproduce PAPER` (cli.py): a seed paper's tables and claims as data (papers/<paper>.yaml, spec.py,
claims.py), regenerated through fl.sweep (plan.py), judged and printed beside the paper's numbers (cells.py,
compare.py, render.py), with --dry-run's projected times (timing.py)."""
