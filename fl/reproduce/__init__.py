"""`python -m fl.reproduce PAPER` (cli.py): a seed paper's tables and claims as data (papers/<paper>.yaml, read by
spec.py into paper.py's objects; claim_cells.py says which cells a claim reads), regenerated through fl.sweep
(plan.py), judged (claims.py, with spearman.py's critical values) and printed beside the paper's numbers (cells.py,
compare.py, render.py) under the twin's setting and calibration (setting.py), with every run's record (record.py)
that --check re-runs bitwise (check.py), and --dry-run's projected times (timing.py)."""
