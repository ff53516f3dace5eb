"""Solving a cvxpy problem whose variable lives on the probability simplex (FedPALS, FedPAC weights)."""
from __future__ import annotations

from typing import Optional

import cvxpy as cp
import numpy as np

SOLVERS = ("CLARABEL", "OSQP", "SCS")


def solve_simplex(problem: cp.Problem, variable: cp.Variable, solver: str, what: str,
                  options: Optional[dict] = None) -> np.ndarray:
    """Solve with `solver`, falling back on the other SOLVERS when one fails; the solution is clipped at 0
    and renormalised (solvers leave tiny negative or off-sum residues). Raises RuntimeError naming `what`
    when every solver fails."""
    for name in (solver,) + tuple(s for s in SOLVERS if s != solver):
        try:
            problem.solve(solver=name, **(options or {}).get(name, {}))
        except cp.error.SolverError:
            continue
        if problem.status in ("optimal", "optimal_inaccurate") and variable.value is not None:
            w = np.clip(variable.value, 0.0, None)
            return w / w.sum()
    raise RuntimeError(f"{what} failed with every solver ({', '.join(SOLVERS)}): status {problem.status}")
