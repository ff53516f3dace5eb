"""Per-round wall time of pFedFDA against FedAvg on the covariate-shift synthetic twin, with the rounds of the two
runs interleaved so that both see the same machine load, and the beta search's share of pFedFDA's round time.

    OMP_NUM_THREADS=1 python bench/pfedfda_round_time.py [ROUNDS=50] [TRAIN_FRACTION=0.25]

Evaluation and the last round (full participation for pFedFDA) are left out; FedAvg-FT and Local train as FedAvg.
"""
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fl.methods.pfedfda as P  # noqa: E402
from bench.harness import orchestrator  # noqa: E402
from fl.config import load_config  # noqa: E402

torch.set_num_threads(1)
TMP = tempfile.mkdtemp(prefix="pfedfda_time_")
beta_time = [0.0]
orig = P.solve_beta


def timed(*a, **k):
    t = time.perf_counter()
    r = orig(*a, **k)
    beta_time[0] += time.perf_counter() - t
    return r


P.solve_beta = timed

R = int(sys.argv[1]) if len(sys.argv) > 1 else 50
orchs = {}
for m in ["fedavg", "pfedfda"]:
    cfg = load_config(["conf=pfedfda_cifar10s_synthetic", f"method.name={m}",
                       f"data.train_fraction={sys.argv[2] if len(sys.argv) > 2 else 0.25}",
                       "trainer.eval_every=100000", "trainer.evaluators=[]", f"data.root={TMP}/data",
                       "logger.wandb.mode=disabled", f"trainer.rounds={R}"])
    orchs[m] = orchestrator(cfg, Path(TMP) / m)
times = {m: [] for m in orchs}
beta = []
for rnd in range(R - 1):  # the last round (full participation for pFedFDA, plus evaluation) is left out
    for m, o in orchs.items():
        b0, t = beta_time[0], time.perf_counter()
        o.run_round(rnd)
        times[m].append(time.perf_counter() - t)
        if m == "pfedfda":
            beta.append(beta_time[0] - b0)
tot = {m: sum(v) for m, v in times.items()}
print(f"rounds timed: {R-1}; mean s/round: " + ", ".join(f"{m} {tot[m]/(R-1):.3f}" for m in tot))
print(f"pfedfda / fedavg time per round: {tot['pfedfda']/tot['fedavg']:.2f}x; beta search share of pfedfda round time: "
      f"{sum(beta)/tot['pfedfda']*100:.1f}% ({sum(beta)/(R-1):.3f} s/round)")
