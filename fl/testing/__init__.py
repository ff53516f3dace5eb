"""Checks a plug-in author calls from their own tests, as fl's conformance tests call them on every built-in (in the
manner of scikit-learn's `check_estimator`):

    from fl.testing import check_plugin

    def test_my_aggregator(tmp_path):
        check_plugin("aggregator", "uniform_mean", tmp_path, plugins=["mystudy.fl_plugin"])

`check_plugin(kind, name, workdir)` runs the plug-in in a tiny federation (generated data, seconds a run) and raises
CheckFailed listing every check it fails:

- contract: a 2-round run exits 0 past fl's checks of what the plug-in returns (docs/plugins.md, "What fl checks at
  the door"), and every metric it logs is finite;
- resumed = uninterrupted: the same run Ctrl-C'd as round 1 starts and resumed gives the same metrics and the same
  checkpoint (server and client states) bit for bit: state kept outside `state_dict` / `client_state` fails here;
- 1 process = 2 processes (`processes=True`): the run on Fabric ddp with 2 processes (gloo on a CPU) gives the same
  metrics and server state within float32 reduction order (1e-5).

`kind` is one of KEYS; `plugins` names the modules that register it (imported here, and by the processes started);
`overrides` are more `key=value` settings the plug-in needs (a model for a dataset of feature vectors, ...).
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from fl.testing.compare import close_state, rows_differ, same_state

__all__ = ["KEYS", "TINY", "CheckFailed", "check_plugin", "close_state", "rows_differ", "same_state", "tiny_args"]

KEYS = {"method": "method.name", "aggregator": "server.aggregator.name", "dataset": "data.name",
        "partition": "data.partition.name", "client transform": "data.client_transform.name", "model": "model.name",
        "evaluator": "trainer.evaluators"}

# A small, fast federation (seconds per run on a 2-core CPU); a setting the chosen plug-ins do not take is left out.
TINY = ("logger.wandb.mode=disabled", "logger.progress=false", "data.num_clients=6",
        "data.embedded.samples_per_class=40", "data.partition.min_client_size=5", "model.width=4", "trainer.rounds=3",
        "trainer.batch_size=16", "trainer.participation=0.5", "trainer.checkpoint_every=2", "trainer.eval_every=1",
        "evaluators.adaptability.every=1",  # every evaluator on every round: resuming with more rounds changes nothing
        "logger.partition_plots=false")
CHECK = ("trainer.rounds=2", "trainer.checkpoint_every=10", "fabric.cpu_threads=1")  # round 0 checkpointed at Ctrl-C
TOLERANCE = 1e-5  # float32 reduction order between 1 and 2 processes


class CheckFailed(AssertionError):
    """What a plug-in failed, one line a check."""


def tiny_args(out: Path, *extra: str, optional: Sequence[str] = ()) -> list[str]:
    """TINY writing under `out`, then `extra`, then `optional`; TINY's and `optional`'s settings that the run's
    chosen plug-ins do not take are left out (data.embedded.* where the dataset is another)."""
    args = [*TINY, f"logger.output_dir={out / 'outputs'}", f"data.root={out / 'data'}", *extra, *optional]
    shape, running = _schema_of(args), _running_evaluators(args)
    left = set(TINY) | set(optional)
    return [a for a in args if a not in left or shape is None or (
        _has(shape, a.split("=", 1)[0]) and (running is None or not a.startswith("evaluators.")
                                             or a.split(".")[1] in running))]


def check_plugin(kind: str, name: str, workdir: Path | str, *, plugins: Sequence[str] = (),
                 overrides: Sequence[str] = (), processes: bool = True) -> None:
    """Run the checks above on plug-in `name` of `kind`; CheckFailed lists each one it fails."""
    if kind not in KEYS:
        raise ValueError(f"kind={kind!r}: one of {', '.join(KEYS)}")
    out = Path(workdir)
    chosen = [f"plugins=[{','.join(plugins)}]"] if plugins else []
    pick = f"{KEYS[kind]}=[{name}]" if kind == "evaluator" else f"{KEYS[kind]}={name}"  # the one evaluator run
    args = [*chosen, pick, *_needs(kind, name, plugins), *overrides, *CHECK]
    problems = [*_contract_and_resume(out, args)]
    if processes and not problems:
        problems += _one_and_two_processes(out, args)
    if problems:
        raise CheckFailed(f"{kind} {name!r} fails {len(problems)} check(s):\n" + "\n".join(f"- {p}" for p in problems))


# ---- the checks --------------------------------------------------------------------------------------------------
def _contract_and_resume(out: Path, args: list[str]) -> list[str]:
    from fl.core.loop import Orchestrator
    from fl.run.train import main

    full, cut = out / "outputs" / "check_full", out / "outputs" / "check_cut"
    code = main(tiny_args(out, *args, "logger.run_name=check_full"))
    if code != 0:
        return [f"contract: the run exited {code} (its error line above says why)"]
    rows = read_rows(full)
    bad = [f"{k}={v} (round {r.get('round')})" for r in rows for k, v in r.items()
           if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        return [f"contract: non-finite metrics: {', '.join(bad[:3])}"]
    original = Orchestrator.train_client

    def train_client(self, rnd, cid):  # Ctrl-C as round 1 starts: round 0's checkpoint is kept
        if rnd == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, rnd, cid)

    Orchestrator.train_client = train_client
    try:
        code = main(tiny_args(out, *args, "logger.run_name=check_cut"))
    finally:
        Orchestrator.train_client = original
    if code != 130:
        return [f"resume: the run Ctrl-C'd at round 1 exited {code}, not 130"]
    code = main([f"resume={cut}"])
    if code != 0:
        return [f"resume: resume={cut} exited {code}"]
    differ = rows_differ(rows, read_rows(cut))
    a, b = load_checkpoint(full), load_checkpoint(cut)
    differ += same_state(a["server"], b["server"], "server") + same_state(a["clients"], b["clients"], "clients")
    return [f"resume: resumed differs from uninterrupted at {', '.join(differ[:3])} (state kept outside "
            "state_dict / client_state?)"] if differ else []


def _one_and_two_processes(out: Path, args: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("FL_RUN_DIR", None)
    dirs = {}
    for side, extra in (("one", ()), ("two", ("fabric.strategy=ddp", "fabric.devices=2"))):
        cmd = [sys.executable, "-m", "fl.train", *tiny_args(out, *args, *extra, f"logger.run_name=check_{side}")]
        res = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            return [f"processes: the run on {side} process(es) exited {res.returncode}: {last}"]
        dirs[side] = out / "outputs" / f"check_{side}"
    a, b = (load_checkpoint(d)["server"] for d in dirs.values())
    differ = rows_differ(*(read_rows(d) for d in dirs.values()), atol=TOLERANCE)
    differ += close_state(a, b, TOLERANCE, "server")
    return [f"processes: 1 and 2 processes differ at {', '.join(differ[:3])}"] if differ else []


# ---- what a run leaves ---------------------------------------------------------------------------------------------
def read_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's rows."""
    import json

    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def load_checkpoint(run_dir: Path) -> dict:
    import torch

    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)


def _needs(kind: str, name: str, plugins: Sequence[str]) -> list[str]:
    """A method's registered needs (a target, a public set, ...)."""
    if kind != "method":
        return []
    from fl.core import registry
    from fl.core.plugins import import_named

    registry.load_plugins()
    for module in plugins:
        import_named(module, registry.TABLES)
    spec = registry.METHODS.get(name)
    return list(spec.needs) if spec is not None else []


def _schema_of(args: list[str]):
    """The schema of the run `args` describe, its plug-ins imported; None when the arguments are bad (the run itself
    reports them)."""
    from omegaconf import OmegaConf

    from fl.config import ConfigError
    from fl.config.blocks import chosen, shared_schema
    from fl.config.load import DEFAULT_CONF, load_conf_file, parse_argv, resolve_conf_path
    from fl.core import registry
    from fl.core.plugins import import_named

    try:
        conf, overrides = parse_argv(args)
        if any(a.startswith("resume=") for a in overrides):
            return None
        registry.load_plugins()
        for a in overrides:
            if a.startswith("plugins="):
                for module in a.split("=", 1)[1].strip("[]").split(","):
                    import_named(module.strip(), registry.TABLES)
        names = [a for a in overrides if a.split("=", 1)[0].endswith(".name")]
        # read only (_has): the shared schema, not a copy of it
        return shared_schema(chosen(load_conf_file(resolve_conf_path(conf or DEFAULT_CONF)),
                                    OmegaConf.from_dotlist(names)))
    except (ConfigError, ImportError):
        return None


def _running_evaluators(args: list[str]):
    """The evaluators the run `args` describe runs (an evaluator's settings are refused when it does not run); None
    when the arguments are bad (the run itself reports them)."""
    from omegaconf import OmegaConf

    from fl.config import ConfigError
    from fl.config.load import DEFAULT_CONF, load_conf_file, parse_argv, resolve_conf_path
    from fl.core import registry

    try:
        conf, overrides = parse_argv(args)
        chosen = OmegaConf.select(load_conf_file(resolve_conf_path(conf or DEFAULT_CONF)), "trainer.evaluators",
                                  default=None)
        for a in overrides:
            if a.startswith("trainer.evaluators="):
                chosen = OmegaConf.from_dotlist([a]).trainer.evaluators
        registry.load_plugins()
        return set(registry.evaluator_names(chosen))
    except (ConfigError, ImportError, ValueError):
        return None


def _has(shape, key: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(shape, key, default="<absent>") != "<absent>"
