"""Run several fl.train runs one after the other in this process: `python tests/every_method.py RUNS_FILE`, RUNS_FILE
a JSON list of argument lists (each with its own logger.run_name). With fabric.strategy=ddp the first run's launch
starts the other process as a copy of this command, and every later run reuses the process group: the runs of every
registered method on 2 processes cost one start-up (tests/core/test_conformance.py). A run under
fabric.precision=16-mixed gets tests/jumpy_loss_scale.py's scaler, whose scale moves at every step. Prints one line per
run: its name and exit code."""
import json
import os
import sys

import lightning.fabric.plugins.precision as fabric_precision
from jumpy_loss_scale import precision_class  # this script's folder is on the path

from fl.run.run_dir import RUN_DIR_ENV
from fl.run.train import main

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        runs = json.load(f)
    launched = os.environ.get("LOCAL_RANK") not in (None, "0")  # a process the first launch started
    plain = fabric_precision.MixedPrecision
    for args in runs:
        fabric_precision.MixedPrecision = precision_class(args, plain)
        name = next(a.split("=", 1)[1] for a in args if a.startswith("logger.run_name="))
        out = next(a.split("=", 1)[1] for a in args if a.startswith("logger.output_dir="))
        if launched:  # rank 0 makes each run's directory; this process finds it as a launched rank does
            os.environ[RUN_DIR_ENV] = os.path.join(out, name)
        code = main(args)
        print(f"run {name} exited {code}", flush=True)
