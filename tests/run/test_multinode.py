"""fabric.num_nodes=2 the way clusters launch it: two "nodes" on 127.0.0.1, started by torchrun (--nnodes 2
--node-rank 0|1) or by SLURM's environment (what srun sets), each node with its own output and state directories
(no shared filesystem). The run equals the 1-process run, and a resume after a crash continues it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fl.run.train import main
from tests.helpers import ROOT, assert_same_rows, client_states, load_ckpt, read_metrics, state_file, tiny

STATEFUL = ("method.name=ditto", "data.num_clients=7", "trainer.participation=0.6", "trainer.rounds=4",
            "trainer.checkpoint_every=1", "state.cache_mb=0.001", "fabric.cpu_threads=1")
TWO_NODES = ("fabric.strategy=ddp", "fabric.devices=1", "fabric.num_nodes=2", "logger.run_name=run")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dir(out: Path, node: int) -> Path:
    return out / f"node{node}" / "outputs" / "run"


def on_its_own_disk(out: Path, node: int) -> list[str]:
    """A node's own directories: its outputs (rank 0's hold the checkpoints) and its clients' states."""
    return [f"logger.output_dir={out / f'node{node}' / 'outputs'}", f"state.dir={out / f'node{node}' / 'states'}"]


def launch_two_nodes(out: Path, args, launcher: str, env: dict | None = None) -> list[tuple[int, str]]:
    """Both nodes' launches, as two shells on two machines would start them (`args(node)`: that node's fl.train
    arguments); returns each node's (exit code, stderr)."""
    port, procs = free_port(), []
    script = [str(ROOT / "tests" / "killer.py")] if env and "FL_TEST_KILL_ROUND" in env else ["-m", "fl.train"]
    for node in (0, 1):
        node_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        for key in ("FL_RUN_DIR", "WANDB_SERVICE"):
            node_env.pop(key, None)
        if launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), *script]
        else:  # what srun sets for each task; Lightning's SLURMEnvironment reads it
            node_env.update(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_NNODES="2", SLURM_PROCID=str(node),
                            SLURM_LOCALID="0", SLURM_NODEID=str(node), SLURM_JOB_NAME="fl", SLURM_JOB_ID="4242",
                            SLURM_NODELIST="127.0.0.1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            cmd = [sys.executable, *script]
        procs.append(subprocess.Popen([*cmd, *args(node)], cwd=out, env=node_env, text=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return [(p.wait(timeout=180), p.stderr.read()) for p in procs]


def one_process(out: Path) -> Path:
    """The reference: the same run on one process (this one)."""
    assert main(tiny(out, *STATEFUL, "logger.run_name=one")) == 0
    return out / "outputs" / "one"


def assert_same_run(one: Path, out: Path) -> None:
    """The 1-process run's metrics, and its client states: rank 0's checkpoint names them, each node holds those
    of the clients its process owns (cid % 2) on its own disk."""
    assert_same_rows(read_metrics(one), read_metrics(run_dir(out, 0)), abs=1e-5)
    reference, named = client_states(one), load_ckpt(run_dir(out, 0))["clients"]
    for cid, state in reference.items():
        node = cid % 2  # its namespace on that node: <state.dir>/<run name>
        mine = state_file(out / f"node{node}" / "states" / "run", cid, named[cid])
        for k, v in state["private"].items():
            torch.testing.assert_close(mine["private"][k], v, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_two_nodes_under_torchrun_equal_one_process_and_resume_after_a_crash(out):
    one = one_process(out)
    fresh = launch_two_nodes(out, lambda node: tiny(out, *STATEFUL, *TWO_NODES, *on_its_own_disk(out, node)),
                             "torchrun", env={"FL_TEST_KILL_ROUND": "2"})  # SIGKILL when round 2 trains
    assert all(rc != 0 for rc, _ in fresh)
    assert load_ckpt(run_dir(out, 0))["round"] == 1 and not (run_dir(out, 1) / "checkpoints" / "last.ckpt").exists()
    # each node resumes its own run directory; node 1 has no checkpoint and receives rank 0's
    resumed = launch_two_nodes(out, lambda node: [f"resume={run_dir(out, node)}"], "torchrun")
    assert all(rc == 0 for rc, _ in resumed), [err[-2000:] for _, err in resumed]
    assert load_ckpt(run_dir(out, 0))["round"] == 3
    assert_same_run(one, out)


@pytest.mark.slow
def test_two_nodes_under_slurm_equal_one_process(out):
    one = one_process(out)
    results = launch_two_nodes(out, lambda node: tiny(out, *STATEFUL, *TWO_NODES, *on_its_own_disk(out, node)),
                               "srun")
    assert all(rc == 0 for rc, _ in results), [err[-2000:] for _, err in results]
    assert_same_run(one, out)


# what torchrun sets for the second of two processes (one per node)
TORCHRUN_RANK1 = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "GROUP_RANK": "1", "LOCAL_RANK": "0",
                  "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"}


def test_torchrun_without_a_run_name_is_one_line_before_anything_is_written(out, monkeypatch, capsys):
    for key, value in TORCHRUN_RANK1.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FL_RUN_DIR", raising=False)
    assert main(tiny(out, "fabric.strategy=ddp", "fabric.num_nodes=2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: torchrun started 2 processes: set logger.run_name=NAME, the run directory all of them "
                   "use on every node (outputs/NAME)"]
    assert not (out / "outputs").exists()


def test_rank_zero_refuses_a_run_name_that_holds_a_run(out, monkeypatch, capsys):
    (out / "outputs" / "taken" / "checkpoints").mkdir(parents=True)
    for key, value in {**TORCHRUN_RANK1, "RANK": "0", "GROUP_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FL_RUN_DIR", raising=False)
    assert main(tiny(out, "fabric.strategy=ddp", "fabric.num_nodes=2", "logger.run_name=taken")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a run" in err[0] and f"resume={out / 'outputs' / 'taken'}" in err[0]
