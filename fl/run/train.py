"""`python -m fl.train [conf=NAME] [key=value ...]`: config -> data -> Fabric -> run directory -> the loop ->
summary.

Exit codes: 0 done, 1 a training fault (a non-finite loss, or a divergence under trainer.on_divergence=stop: either
way summary.json marks the run as diverged and the summary of the rounds before is printed), 2 bad configuration or
data (nothing written), 130 interrupted (a checkpoint of the last completed round was written; continue with
resume=<run dir>).
"""
from __future__ import annotations

import os
import sys
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf

from fl.config import CONF_DIR, ConfigError, config_diff, expand_arms, load_config, to_yaml
from fl.config.blocks import plugin_choices
from fl.config.load import ABSENT, added_key_message, import_argv_plugins
from fl.core import (
    METHODS,
    CheckpointError,
    Interrupted,
    Orchestrator,
    TrainingFault,
    build_model,
    latest_checkpoint,
    plugins,
)
from fl.core.callbacks import CallbackError, make_callbacks
from fl.core.exchange import gather_objects
from fl.core.loop import Diverged
from fl.core.mapped_images import DamagedImages
from fl.core.metric_directions import directions_of, lookup
from fl.core.plugin_calls import PluginFault
from fl.core.registry import MODELS, evaluator_names
from fl.core.run_metrics import diagnostics, run_directions
from fl.core.state import (
    CHECKPOINT_NAMES,
    StateDirInUse,
    StateFileError,
    StateStoreError,
    check_state_dir,
    read_checkpoint,
)
from fl.data import DataError, build_data
from fl.report.aliases import current_names
from fl.report.summary import summarize_history
from fl.report.wandb_access import has_wandb_key, wandb_mode
from fl.run.cli_help import USAGE, data_plugin_help, evaluator_help, list_items, method_help
from fl.run.determinism import deterministic_algorithms
from fl.run.lightning_import import import_lightning
from fl.run.preflight import print_client_notes
from fl.run.progress import RoundProgress, format_summary, round_label
from fl.run.run_dir import RUN_DIR_ENV, launched_run_dir, log_partition, planned_run_dir, prepare_run_dir, write_summary

if TYPE_CHECKING:  # Lightning and W&B load when a run starts (make_fabric, _run): help and errors stay quick
    from lightning.fabric import Fabric


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _twin_hint(argv: list[str]) -> str:
    """Paper configs come with a synthetic twin (the same protocol on embedded data): name it when the
    real data is missing."""
    conf = next((a.split("=", 1)[1] for a in argv if a.startswith("conf=")), None)
    if conf and "/" not in conf and (CONF_DIR / f"{conf}_synthetic.yaml").is_file():
        return f"; to try the same protocol on embedded data: python -m fl.train conf={conf}_synthetic"
    return ""


def check_model(cfg: DictConfig, data) -> None:
    """Build the model (pretrained weights included) and pass two training inputs through it before anything is
    written, so a model that cannot take the data's inputs is a configuration error, not a traceback. The warnings
    torch gives on the way are shown only when the model works: for inputs too small for it, a zero-sized layer's
    "Initializing zero-element tensors" would stand before the one-line error that says why."""
    with warnings.catch_warnings(record=True) as caught:  # the filters in force decide what is recorded
        _check_model(cfg, data)
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _check_model(cfg: DictConfig, data) -> None:
    m = cfg.model
    try:
        model = build_model(cfg, data.input_shape, data.num_classes)
    except (RuntimeError, MemoryError) as err:  # e.g. model.width=100000: a 720 GB layer
        raise ConfigError(f"model.name={m.name!r} with model.width={m.width} cannot be built: "
                          f"{str(err).splitlines()[0][:160]}") from None
    except (ValueError, TypeError) as err:  # e.g. an image model on feature vectors
        raise ConfigError(f"model.name={m.name!r} cannot take the inputs of data.name={cfg.data.name!r} (shape "
                          f"{tuple(data.input_shape)}): {str(err).splitlines()[0][:120]}; for feature vectors use "
                          "model.name=mlp or logistic") from None
    spec = METHODS[cfg.method.name]
    if spec.client_cls.needs_backbone and not any(p.requires_grad for p in model.backbone.parameters()):
        raise ConfigError(f"method.name={cfg.method.name!r} trains the model's backbone apart from its head; "
                          f"model.name={m.name!r} has no backbone parameters (use cnn, mlp, resnet18, ...)")
    x = data.prepare(next(c.train for c in data.clients if len(c.train)).x[:2])
    try:
        with torch.no_grad():
            out = model.eval()(x)
    except RuntimeError as err:
        raise ConfigError(f"model.name={cfg.model.name!r} cannot take the inputs of data.name={cfg.data.name!r} "
                          f"(shape {tuple(x.shape[1:])}): {str(err).splitlines()[0]}") from None
    wanted = (x.shape[0], data.num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != wanted:
        where = f"model.name={m.name!r}" + (f" ({plugins.code_location(MODELS[m.name])})"
                                            if plugins.outside("model", m.name) else "")
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else plugins.type_name(out)
        raise ConfigError(f"{where} returned {got} for {x.shape[0]} inputs; a model returns logits [N, num_classes] "
                          f"= {wanted} for data.name={cfg.data.name!r}")


def resume_point(cfg: DictConfig, data) -> tuple[Path, dict, list[str]] | None:
    """The checkpoint a resume= run continues from (path, state, problems of newer ones skipped), checked
    against the run's config.yaml and data; None when the run stopped before its first checkpoint."""
    if not cfg.resume:
        return None
    run_dir = Path(cfg.resume)
    refuse_blocked_checkpoint_paths(run_dir / "checkpoints")
    path, state, skipped = latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        if (run_dir / "summary.json").is_file():  # finished (or stopped diverged): never retrain it from round 0
            raise CheckpointError(f"resume={cfg.resume}: the run has ended (it has summary.json) and "
                                  f"{run_dir / 'checkpoints'} holds no checkpoint to continue from; start a new run")
        return None
    trained_for = state.get("config", {}).get("trainer", {}).get("rounds")
    if trained_for is not None and cfg.trainer.rounds < trained_for:
        raise ConfigError(f"resume: trainer.rounds={cfg.trainer.rounds} is below the run's {trained_for} ({path.name} "
                          f"holds round {state['round']}); rounds may only grow or stay: trainer.rounds>={trained_for}")
    changed = config_diff(state["config"], cfg) if "config" in state else []
    if changed:
        key, old, new = changed[0]
        if old is ABSENT:
            raise ConfigError(added_key_message(key, new))
        raise ConfigError(f"resume: {Path(cfg.resume) / 'config.yaml'} has {key}={new!r} but {path} was written "
                          f"with {old!r}; a checkpoint continues only the run that wrote it (restore config.yaml or "
                          "start a new run)")
    if state["fingerprint"] != data.fingerprint():
        raise CheckpointError(f"{path} was written for another data split than this config's")
    return path, state, skipped


def refuse_blocked_checkpoint_paths(ckpt_dir: Path) -> None:
    """A checkpoint path taken by something else than a file (a directory named last.ckpt) would be found only when
    the first checkpoint is written, after the resumed rounds are trained: refuse it now."""
    if ckpt_dir.exists() and not ckpt_dir.is_dir():
        raise CheckpointError(f"{ckpt_dir} is a file, not the run's checkpoint folder; move it away")
    for name in (*CHECKPOINT_NAMES, CHECKPOINT_NAMES[0] + ".tmp"):
        path = ckpt_dir / name
        if path.exists() and not path.is_file():
            raise CheckpointError(f"{path} is not a checkpoint file (a directory?); move it away, then resume")


def resume_on_every_node(fabric: Fabric, cfg: DictConfig, resume):
    """Rank 0's checkpoint is the one the run continues from. A process whose node lacks that file (nodes without
    a shared filesystem: only rank 0 writes checkpoints) receives it from rank 0."""
    if fabric.world_size == 1:
        return resume
    found = None if resume is None else (resume[0].name, resume[1]["round"])
    chosen = fabric.broadcast(found, src=0)
    lacking = found != chosen
    if any(gather_objects(fabric, lacking)):
        state = fabric.broadcast(resume[1] if fabric.global_rank == 0 else None, src=0)
        if lacking:
            resume = None if chosen is None else (Path(cfg.resume) / "checkpoints" / chosen[0], state, [])
    return resume


def restore_with_fallback(fabric: Fabric, cfg: DictConfig, orch, resume):
    """Restores `resume` (path, state, problems skipped) into the orchestrator; when a client state file it names is
    missing or damaged, previous.ckpt instead (as a damaged last.ckpt falls back), with a warning. Returns what was
    restored; raises the first problem when neither can be used."""
    path, state, skipped = resume
    try:
        orch.restore(state, path)
        return resume
    except StateStoreError as err:
        first = StateStoreError(f"resume from {path}: {err}")
    older = Path(cfg.resume) / "checkpoints" / CHECKPOINT_NAMES[1]
    try:
        candidate = (older, read_checkpoint(older), []) if path.name != older.name and older.is_file() else None
    except CheckpointError:
        candidate = None
    candidate = resume_on_every_node(fabric, cfg, candidate)  # rank 0's decides, on every node
    if candidate is None:
        raise first
    try:
        orch.restore(candidate[1], candidate[0])
    except StateStoreError as err:
        same = str(first).endswith(f": {err}")  # the file both name
        raise StateStoreError(f"{first}; {candidate[0].name} names it too" if same else
                              f"{first}; nor from {candidate[0].name}: {err}") from None
    return candidate[0], candidate[1], [*skipped, str(first)]


def undeclared_metrics(cfg: DictConfig, history: list[dict]) -> list[str]:
    """The summarised keys of `history` that nothing declared (fl/core/metric_directions.py): they get no best."""
    declared = run_directions(cfg)
    keys = dict.fromkeys(k for row in history for k in row if k != "round" and not k.startswith("client/"))
    return [k for k in keys if not lookup(k, declared)[0]]


def run_summary(cfg: DictConfig, data, run_dir: Path, history: list[dict], diverged, stopped) -> dict:
    """summary.json's content: the history's summaries (best by each metric's declared direction), what ran,
    `stopped` (round, reason; None when the run went to its last round) and `diverged` (round, client, method, reason)
    when the run diverged (trainer.on_divergence), absent when it did not."""
    keys = {k for row in history for k in row}
    summary = summarize_history(history, cfg.trainer.last_k, directions_of(keys, run_directions(cfg)))
    summary.update({"method": cfg.method.name, "headline": METHODS[cfg.method.name].headline,
                    "dataset": cfg.data.name, "seed": int(cfg.seed), "rounds": int(cfg.trainer.rounds),
                    "stopped": stopped, "partition_fingerprint": data.fingerprint(), "run_dir": str(run_dir)})
    if diverged is not None:
        summary["diverged"] = diverged.as_dict()
    return summary


def make_fabric(cfg: DictConfig, callbacks: list, loggers: list) -> Fabric:
    import_lightning()  # Lightning loads with the first Fabric, without torchvision and scipy.signal
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision import MixedPrecision

    f = cfg.fabric
    precision = {"32": "32-true", "64": "64-true"}.get(str(f.precision), f.precision)
    on_cpu = f.accelerator == "cpu" or (f.accelerator == "auto" and not torch.cuda.is_available()
                                        and not torch.backends.mps.is_available())
    # Lightning turns 16-mixed into bf16-mixed on the CPU (with a warning); Fabric's own plugin gives what was asked,
    # float16 autocast and a GradScaler: the numerics of a CUDA run
    chosen = {"plugins": [MixedPrecision("16-mixed", "cpu")]} if precision == "16-mixed" and on_cpu else {
        "precision": precision}
    return Fabric(accelerator=f.accelerator, devices=f.devices, strategy=f.strategy, num_nodes=f.num_nodes,
                  callbacks=callbacks, loggers=loggers, **chosen)


def print_only(argv: list[str]) -> int | None:
    """--help / -h (with method.name= or conf=: that method's hyperparameters), --list KIND and --print-config
    print and exit; None when the command is a run."""
    if "--list" in argv or any(a.startswith("--list=") for a in argv):
        i = argv.index("--list") if "--list" in argv else None
        kind = argv[i + 1] if i is not None and i + 1 < len(argv) else (
            "" if i is not None else next(a for a in argv if a.startswith("--list=")).split("=", 1)[1])
        import_argv_plugins([a for a in argv if "=" in a and not a.startswith("--list=")])  # plugins=, conf='s
        print(list_items(kind))
        return 0
    rest = [a for a in argv if a not in ("-h", "--help", "--print-config")]
    if "-h" in argv or "--help" in argv:
        blocks = [b for b, _, _ in plugin_choices() if any(a.startswith(f"{b}.name=") for a in rest)]
        named = any(a.startswith(("method.name=", "conf=")) for a in rest) or blocks
        cfg = load_config(rest, check=False) if named else None  # no target etc. needed to read it
        shown = [data_plugin_help(b, OmegaConf.select(cfg, f"{b}.name"), OmegaConf.select(cfg, b)) for b in blocks]
        if any(a.startswith("trainer.evaluators=") for a in rest):
            evaluators = load_config(rest, check=False)
            shown += [evaluator_help(n, OmegaConf.select(evaluators, f"evaluators.{n}"))
                      for n in evaluator_names(evaluators.trainer.evaluators)]
        if not shown or any(a.startswith("method.name=") for a in rest):
            shown.insert(0, method_help(cfg.method.name, cfg.method) if named else USAGE)
        print("\n\n".join(shown))
        return 0
    if "--print-config" in argv:
        print(to_yaml(load_config(rest)), end="")
        return 0
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        argv = expand_arms(argv)  # a sweep arm (W&B's agent passes arm=NAME arms.NAME='...'): its overrides, in place
        printed = print_only(argv)
    except ConfigError as err:
        return _fail(str(err), 2)
    if printed is not None:
        return printed
    owns_env = RUN_DIR_ENV not in os.environ
    try:
        with ExitStack() as cleanup:  # what a run sets process-wide or holds (fabric.deterministic, the state
            return _run(argv, cleanup)  # namespace's lock) is undone when it ends
    except KeyboardInterrupt:  # before the first round (data, model, launch): nothing to keep
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        if owns_env:
            os.environ.pop(RUN_DIR_ENV, None)


def _run(argv: list[str], cleanup: ExitStack) -> int:
    try:
        # the run's own input: the config 0.17 s (the first load in a process imports the plug-ins, parses the YAML
        # files and builds the typed schema; later loads reuse them), the data 0.08 s for the quickstart from its
        # cache (bench/fedavg_overhead.py --whole-process)
        cfg = load_config(argv)
        data = build_data(cfg)
        check_model(cfg, data)
        resume = resume_point(cfg, data)
        if wandb_mode(cfg.logger.wandb.mode) == "online" and not has_wandb_key():
            raise ConfigError("logger.wandb.mode=online needs a W&B API key (wandb login, or WANDB_API_KEY); "
                              "use logger.wandb.mode=offline (or auto) to log locally and `wandb sync` later")
        server = METHODS[cfg.method.name].server_cls(cfg)
        callbacks = make_callbacks(cfg)
        try:  # Fabric validates accelerator / devices / strategy before anything is written
            make_fabric(cfg, [], [])
        except (ValueError, RuntimeError, TypeError) as err:
            f = cfg.fabric
            raise ConfigError(f"fabric.accelerator={f.accelerator!r} fabric.devices={f.devices!r} "
                              f"fabric.strategy={f.strategy!r} rejected: {str(err).splitlines()[0]}") from None
        named = launched_run_dir(cfg)
        if cfg.state.cache_mb is not None:  # before anything is written: a writable state.dir no live run uses
            check_state_dir(cfg.state.dir, planned_run_dir(cfg, named))
    except (ConfigError, CheckpointError, StateDirInUse, CallbackError) as err:
        return _fail(str(err) + (_twin_hint(argv) if isinstance(err, DataError) else ""), 2)
    except (StateStoreError, PluginFault) as err:
        return _fail(str(err), 1)
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        return _fail((str(err).splitlines() or [type(err).__name__])[0], 2)  # "error: <what>", as every message

    from fl.run.loggers import JsonlLogger, make_wandb_logger

    cleanup.enter_context(deterministic_algorithms(cfg.fabric.deterministic))  # before the first cuBLAS call
    print_client_notes(cfg, data)
    run_dir = prepare_run_dir(cfg, named)
    jsonl = JsonlLogger(run_dir / "metrics.jsonl")
    wandb_logger = make_wandb_logger(cfg, run_dir, run_dir.name,
                                     resume_round=resume[1]["round"] if resume is not None else None)
    fabric = make_fabric(cfg, [server, *callbacks], [jsonl] + ([wandb_logger] if wandb_logger else []))
    fabric.launch()
    if cfg.fabric.cpu_threads:
        torch.set_num_threads(cfg.fabric.cpu_threads)
    resume = resume_on_every_node(fabric, cfg, resume)
    try:
        orch = Orchestrator(cfg, fabric, data, server, run_dir, callbacks)
    except StateStoreError as err:  # every process stops; a namespace another run holds is exit 2
        code = 2 if isinstance(err, StateDirInUse) else 1
        return _fail(str(err), code) if fabric.is_global_zero else code
    cleanup.callback(orch.store.close)  # releases the state namespace's lock, however the run ends
    if fabric.is_global_zero:
        config = run_dir / "config.yaml"
        config.write_text(f"# partition fingerprint: {data.fingerprint()}\n" + config.read_text())
    if resume is not None:
        try:
            path, state, skipped = restore_with_fallback(fabric, cfg, orch, resume)
        except (CheckpointError, StateStoreError) as err:
            return _fail(str(err), 2) if fabric.is_global_zero else 2
        del state
        orch.history[:] = map(current_names, orch.history)  # a run from before a metric rename: its new names
        jsonl.rewrite(orch.history)  # metrics.jsonl holds exactly the checkpointed history
        if fabric.is_global_zero:
            for problem in skipped:
                print(f"warning: {problem}; using {path.name} instead", file=sys.stderr)
            at = round_label(orch.start_round, cfg.trainer.rounds)
            print(f"resuming {run_dir} from {path.name}, continuing at {at}", file=sys.stderr)
    elif fabric.is_global_zero:
        if cfg.resume:
            print(f"resume: {run_dir} has no checkpoint yet (it stopped before its first); starting it afresh",
                  file=sys.stderr)
        jsonl.path.write_text("")
        # the run's picture of its split (partition.json and heatmaps): 0.6 s for the quickstart, the drawing and PNG
        # encoding (matplotlib is loaded with Lightning; bench/fedavg_overhead.py --whole-process: partition_files);
        # logger.partition_plots=false skips the heatmaps. With W&B on, its run starts here, at its first use: 2.8 s
        # more for the quickstart offline, most of it wandb.init importing W&B's launch API, whose pydantic models
        # scan every loaded module (bench/wandb_cost.py); logger.wandb.mode=disabled skips it
        log_partition(data, run_dir, wandb_logger, cfg.logger.partition_plots)
    progress = RoundProgress(cfg.trainer.rounds, orch.start_round, METHODS[cfg.method.name].headline) if (
        fabric.is_global_zero and cfg.logger.progress) else None
    try:
        history = orch.fit(progress)
    except StateStoreError as err:
        kept = ("no checkpoint was written yet" if not orch.ckpt_path.is_file() else
                f"resume={run_dir} falls back to previous.ckpt if last.ckpt names a damaged file"
                if isinstance(err, StateFileError) else f"the last checkpoint {orch.ckpt_path} is resumable")
        return _fail(f"{err}; {kept}", 1) if fabric.is_global_zero else 1
    except TrainingFault as err:
        kept = (f"the last good checkpoint is {orch.ckpt_path}" if orch.ckpt_path.is_file() else
                "no checkpoint was written yet")
        if err.where is not None and fabric.is_global_zero:  # an ended run, marked: sweeps do not rerun it
            summary = run_summary(cfg, data, run_dir, orch.history, err.where, orch.stopped)
            write_summary(run_dir, summary)
            print(format_summary(summary))  # over the rounds before the stop; its last line says where it stopped
            kept += f"; {run_dir / 'summary.json'} marks the run as diverged" + (
                f" (to train on regardless: python -m fl.train resume={run_dir} trainer.on_divergence=warn)"
                if isinstance(err, Diverged) and orch.ckpt_path.is_file() else "")
        return _fail(f"{err}; {kept}", 1) if fabric.is_global_zero else 1  # one message, not one per process
    except PluginFault as err:  # a fault in a plug-in's code (an exception, or a result breaking its contract)
        kept = (f"the last good checkpoint is {orch.ckpt_path}" if orch.ckpt_path.is_file() else
                "no checkpoint was written yet")
        return _fail(f"{err}; {kept}", 1) if fabric.is_global_zero else 1
    except DamagedImages as err:  # a memory-mapped cache changed in place since it was built (fl/data/cache.py)
        kept = (f"the last good checkpoint is {orch.ckpt_path}: continue with python -m fl.train resume={run_dir}"
                if orch.ckpt_path.is_file() else "no checkpoint was written yet: run the command again")
        return _fail(f"{err}; {kept}", 1) if fabric.is_global_zero else 1
    except CallbackError as err:  # found at the first evaluation, e.g. an early-stopping metric the run lacks
        return _fail(f"{err} (run directory {run_dir})", 2) if fabric.is_global_zero else 2
    except (Interrupted, KeyboardInterrupt) as err:
        if fabric.is_global_zero:
            where = (f"checkpoint {orch.ckpt_path}. Continue with" if orch.ckpt_path.is_file() else
                     "no checkpoint yet. Start it again with")
            print(f"\n{err or 'interrupted'}; {where}: python -m fl.train resume={run_dir}", file=sys.stderr)
        return 130
    if fabric.is_global_zero:
        if orch.stopped is not None:
            print(f"stopped after {round_label(orch.stopped['round'], cfg.trainer.rounds)}: {orch.stopped['reason']}",
                  file=sys.stderr)
        summary = run_summary(cfg, data, run_dir, history, orch.diverged, orch.stopped)
        write_summary(run_dir, summary)
        if wandb_logger is not None:
            wandb_logger.experiment.summary.update({f"{kind}/{k}": v for kind in ("final", "best")
                                                    for k, v in summary[kind].items()})
            wandb_logger.experiment.summary.update({k: summary[k] for k in ("headline", "diverged", "directions")
                                                    if k in summary})
            wandb_logger.log_checkpoint(orch.ckpt_path)
            wandb_logger.experiment.finish()
        print(format_summary(summary, diagnostics(cfg)))
        undeclared = undeclared_metrics(cfg, history)
        if undeclared:
            print(f"notice: {', '.join(undeclared)} {'was' if len(undeclared) == 1 else 'were'} logged without a "
                  "declared direction (metric_directions of the class that logs it: fl/core/metric_directions.py); "
                  "summary.json gives no best for it", file=sys.stderr)
        files = ", ".join(sorted(p.name for p in run_dir.iterdir()))
        print(f"\nRun directory: {run_dir}  ({files})")
        if wandb_logger is not None and wandb_mode(cfg.logger.wandb.mode) == "offline":
            print(f"W&B logged offline; upload the run with: wandb sync {run_dir / 'wandb'}/offline-run-*")
    return 0
