"""`python -m fl.reproduce PAPER`: a seed paper's tables and claims (papers/<paper>.yaml, spec.py, claims.py)
regenerated through fl.sweep (plan.py) and printed beside the paper's numbers (cells.py, compare.py, render.py)."""
