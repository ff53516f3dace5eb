"""`python bench/fl_phases.py T0 key=value ...`: the work of `python -m fl.train key=value ...` (the same entry steps:
the thread policy before torch loads, main, the process ended by end_process), with the wall clock read at its phase
boundaries; T0 is the caller's time.time() when it started this process. The last line of stderr is
`PHASES {json}`: seconds of imports (the interpreter's start, torch, fl, and Lightning with what it loads at the
start of a run), setup (config, data, Fabric, run directory, partition files: up to the first round; `setup_parts`
splits it), training (the
rounds without their evaluation and checkpoints), evaluation, checkpoints, finish (summary and console output after
the last round), and the wall clock when main returned; the exit is the caller's to time
(bench/fedavg_overhead.py --whole-process)."""
import sys
import time

from fl.run.cpu_threads import sleep_at_barriers

sleep_at_barriers()  # as fl/train.py does, before torch loads

import json  # noqa: E402

import fl.run.train as train  # noqa: E402
from fl.core.loop import Orchestrator  # noqa: E402
from fl.run.lightning_import import import_lightning  # noqa: E402
from fl.run.process_exit import end_process  # noqa: E402

import_lightning()  # as the run's first Fabric does: timed with the other imports here

T0 = float(sys.argv[1])
marks = {"imports": time.time()}
SETUP = ("config", "data", "model_check", "fabric", "run_dir", "partition_files", "orchestrator")
spent = dict.fromkeys((*SETUP, "evaluation", "checkpoints"), 0.0)


def timed(name: str, function, span: str | None = None):
    """`function` wrapped to add its wall time to spent[name], or (span) to mark its start and end."""
    def wrapper(*args, **kwargs):
        start = time.time()
        if span:
            marks[span + "_start"] = start
        try:
            return function(*args, **kwargs)
        finally:
            if span:
                marks[span + "_end"] = time.time()
            else:
                spent[name] += time.time() - start
    return wrapper


Orchestrator.fit = timed("fit", Orchestrator.fit, span="fit")
Orchestrator.evaluate = timed("evaluation", Orchestrator.evaluate)
Orchestrator.save = timed("checkpoints", Orchestrator.save)
# the setup's parts, as fl/run/train.py calls them
for name, attr in (("config", "load_config"), ("data", "build_data"), ("model_check", "check_model"),
                   ("fabric", "make_fabric"), ("run_dir", "prepare_run_dir"), ("partition_files", "log_partition"),
                   ("orchestrator", "Orchestrator")):
    setattr(train, attr, timed(name, getattr(train, attr)))

code = train.main(sys.argv[2:])
returned = time.time()
rounds = marks["fit_end"] - marks["fit_start"]
setup = marks["fit_start"] - marks["imports"]
phases = {"imports": marks["imports"] - T0, "setup": setup,
          "training": rounds - spent["evaluation"] - spent["checkpoints"], "evaluation": spent["evaluation"],
          "checkpoints": spent["checkpoints"], "finish": returned - marks["fit_end"], "returned_at": returned,
          "setup_parts": {**{k: spent[k] for k in SETUP}, "other": setup - sum(spent[k] for k in SETUP)}}
print("PHASES " + json.dumps(phases), file=sys.stderr, flush=True)
end_process(code)
