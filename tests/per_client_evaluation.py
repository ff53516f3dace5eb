"""`python tests/per_client_evaluation.py key=value ...`: a run whose clients are all evaluated by their own passes
(fl/core/evaluation.py's `shares_global_passes` patched to False), the reference the shared evaluation is compared
with in processes of their own (Fabric ddp starts its other processes with this same command)."""
import sys

from fl.core import evaluation

evaluation.shares_global_passes = lambda ctx: False

if __name__ == "__main__":
    from fl.run.train import main

    sys.exit(main(sys.argv[1:]))
