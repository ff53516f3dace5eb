import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A small, fast federation used across tests (seconds per run on a 2-core CPU).
TINY = ["logger.wandb.mode=disabled", "logger.progress=false", "data.num_clients=6",
        "data.embedded.samples_per_class=40",
        "data.partition.min_client_size=5", "model.width=4", "trainer.rounds=3", "trainer.batch_size=16",
        "trainer.participation=0.5", "trainer.checkpoint_every=2", "trainer.eval_every=1",
        "evaluators.adaptability.every=1"]  # every evaluator on every round: resuming with more rounds changes nothing


def run_cli(args, cwd, env=None, script=("-m", "fl.train")):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for key in ["FL_RUN_DIR"] + [k for k, v in (env or {}).items() if v is None]:
        full_env.pop(key, None)
    return subprocess.run([sys.executable, *script, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=300)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def out(tmp_path):
    """Output dir and the data cache live in the test's tmp dir."""
    return tmp_path


def tiny(out: Path, *extra: str) -> list[str]:
    return TINY + [f"logger.output_dir={out / 'outputs'}", f"data.root={out / 'data'}", *extra]


def run_tiny(out: Path, *extra: str, name: str, threads: int | None = 1) -> Path:
    """An in-process tiny run named `name` (one intra-op thread unless threads=None); returns its run dir."""
    from fl.run.train import main

    pinned = [f"fabric.cpu_threads={threads}"] if threads else []
    assert main(tiny(out, *pinned, f"logger.run_name={name}", *extra)) == 0
    return out / "outputs" / name


def load_ckpt(run_dir: Path) -> dict:
    import torch

    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)


def initial_model(cfg, data):
    """The model every client and the server start from (how the orchestrator initialises it)."""
    from fl.core import build_model
    from fl.core.seeding import seed_torch

    seed_torch(cfg.seed, 0, -1, "init")
    return build_model(cfg, data.input_shape, data.num_classes)


@pytest.fixture(autouse=True)
def _restore_threads():
    """In-process runs pin the intra-op thread count (fabric.cpu_threads); give the session its own back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
