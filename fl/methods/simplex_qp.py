"""Solving a cvxpy problem whose variable lives on the probability simplex (FedPALS, FedPAC weights)."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    import cvxpy as cp

SOLVERS = ("CLARABEL", "OSQP", "SCS")


def solve_simplex(problem: cp.Problem, variable: cp.Variable, solver: str, what: str,
                  options: Optional[dict] = None) -> np.ndarray:
    """Solve with `solver`, falling back on the other SOLVERS when one fails; the solution is clipped at 0
    and renormalised (solvers leave tiny negative or off-sum residues). A solution the solver calls
    `optimal_inaccurate` is polished by the other solvers; if none reaches `optimal`, it is used with a
    warning. Raises RuntimeError naming `what` when every solver fails."""
    import cvxpy as cp  # loads with the first solve, not with the method

    inaccurate = None
    for name in (solver,) + tuple(s for s in SOLVERS if s != solver):
        try:
            with warnings.catch_warnings():  # cvxpy's own "may be inaccurate" warning: handled below
                warnings.simplefilter("ignore", UserWarning)
                problem.solve(solver=name, **(options or {}).get(name, {}))
        except cp.error.SolverError:
            continue
        if problem.status in ("optimal", "optimal_inaccurate") and variable.value is not None:
            w = np.clip(variable.value, 0.0, None)
            w = w / w.sum()
            if problem.status == "optimal":
                return w
            inaccurate = inaccurate or (name, w)
    if inaccurate is not None:
        warnings.warn(f"{what}: {inaccurate[0]} solved it only to 'optimal_inaccurate' and no other solver "
                      f"({', '.join(SOLVERS)}) did better; using that solution", stacklevel=2)
        return inaccurate[1]
    raise RuntimeError(f"{what} failed with every solver ({', '.join(SOLVERS)}): status {problem.status}")
