"""What test files share: the tiny federation, runs in and out of process, checkpoints, and patches that
record or interrupt a run. Fixtures live in conftest.py; everything else a test imports comes from here.

Functions that start a process (`run_cli`) refuse to run in a test that is not
marked `@pytest.mark.slow`, so `pytest -m "not slow"` never starts one.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import fl.testing as fl_testing
from fl.testing import tiny_args

ROOT = Path(__file__).resolve().parent.parent

# A small, fast federation used across tests (seconds per run on a 2-core CPU), the one fl.testing's checks run
TINY = list(fl_testing.TINY)


def markdown_headings(text: str) -> list[tuple[int, str, int]]:
    """(level, title, line index) of each Markdown heading outside fenced code blocks (a `# comment` in a bash
    block is not a heading)."""
    headings, fenced = [], False
    for i, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            marks = len(line) - len(line.lstrip("#"))
            if line[marks:marks + 1] == " ":
                headings.append((marks, line[marks + 1:].strip(), i))
    return headings


def doc_section(path: str, heading: str) -> str:
    """The text under `heading` (e.g. "## Adding a method") in the Markdown file at `path` (relative to the
    repository root), up to the next heading of the same or a higher level: the docs move, the tests that run
    their examples follow the section."""
    text = (ROOT / path).read_text()
    lines = text.splitlines()
    level, title = len(heading) - len(heading.lstrip("#")), heading.lstrip("#").strip()
    headings = markdown_headings(text)
    found = [i for lv, t, i in headings if lv == level and t == title]
    assert len(found) == 1, f"{path} has {len(found)} headings {heading!r}"
    end = next((i for lv, _, i in headings if i > found[0] and lv <= level), len(lines))
    return "\n".join(lines[found[0] + 1:end])


# Set by conftest's autouse fixture: whether the running test is marked slow (None outside a test).
current_test_is_slow: bool | None = None


def tiny(out: Path, *extra: str, optional: tuple[str, ...] = ()) -> list[str]:
    """TINY writing under `out`, then `extra`, then `optional`, less the settings the run's chosen plug-ins do not
    take: fl.testing's tiny_args, which plug-in authors' checks use too."""
    return tiny_args(out, *extra, optional=optional)


# ---- runs ------------------------------------------------------------------------------------------
def run_cli(args, cwd, env=None, script=("-m", "fl.train"), timeout: int = 300) -> subprocess.CompletedProcess:
    """`python <script> <args>` in a fresh process (env values None unset a variable), stopped after `timeout`
    seconds. Slow tests only."""
    if current_test_is_slow is False:
        raise RuntimeError("run_cli starts a process: mark the test @pytest.mark.slow")
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    # FL_RUN_DIR: the child makes its own run dir; WANDB_SERVICE: a wandb service this test process started
    # (wandb puts its token in os.environ) would be shared by the child, as it never is for a command typed in a shell
    for key in ["FL_RUN_DIR", "WANDB_SERVICE"] + [k for k, v in (env or {}).items() if v is None]:
        full_env.pop(key, None)
    return subprocess.run([sys.executable, *script, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def run_tiny(out: Path, *extra: str, name: str, threads: int | None = 1) -> Path:
    """An in-process tiny run named `name` (one intra-op thread unless threads=None); returns its run dir."""
    from fl.run.train import main

    pinned = [f"fabric.cpu_threads={threads}"] if threads else []
    assert main(tiny(out, *pinned, f"logger.run_name={name}", *extra)) == 0
    return out / "outputs" / name


def assert_same_rows(a: list[dict], b: list[dict], abs: float) -> None:
    """Two runs' metrics.jsonl rows: the same rounds with the same keys, every value within `abs`."""
    assert [r.keys() for r in a] == [r.keys() for r in b]
    for ra, rb in zip(a, b):
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], abs=abs), k


# ---- what a run leaves -----------------------------------------------------------------------------
TIMING = "time/"  # wall times (time/round_s): they differ from run to run, the rest of a row must not


def without_timing(value):
    """`value` (metrics.jsonl rows, a summary.json, a checkpoint's history) with every time/* key and summary.json's
    wall-clock `finished_at` left out, for comparing two runs."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items()
                if not (isinstance(k, str) and (k.startswith(TIMING) or k == "finished_at"))}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def read_metrics(run_dir: Path, timing: bool = False) -> list[dict]:
    """metrics.jsonl's rows, without the time/* wall times unless `timing` (rows of two runs compare equal)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows if timing else without_timing(rows)


def load_ckpt(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)


def client_states(run_dir: Path, state_dir: Path | None = None) -> dict:
    """The checkpoint's client states: in it (state.cache_mb=null), or read from the files it names in the run's
    namespace of `state_dir` (state.dir; None: the run directory's client_states/)."""
    from fl.core.state_files import namespace_dir

    clients = load_ckpt(run_dir)["clients"]
    return {cid: state_file(namespace_dir(state_dir and str(state_dir), run_dir), cid, s)
            if set(s) == {"round", "run"} else s for cid, s in clients.items()}


def state_file(folder: Path, cid: int, named: dict):
    """The state in client cid's file in `folder` that a checkpoint's entry ({"round", "run"}) names."""
    from fl.core.state_files import file_name, identity, read_state_file

    return read_state_file(folder / file_name(cid, named["round"], named["run"]), identity(cid, named["round"],
                                                                                          named["run"]))


def global_params(run_dir: Path) -> dict:
    return load_ckpt(run_dir)["server"]["global_params"]


def same_private_states(a: dict, b: dict) -> bool:
    """Two checkpoints' client stores hold the same clients with bitwise equal private tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[c]["private"][k], b[c]["private"][k])
                                        for c in a for k in a[c]["private"])


# ---- building pieces of a run by hand --------------------------------------------------------------
def initial_model(cfg, data):
    """The model every client and the server start from (how the orchestrator initialises it)."""
    from fl.core import build_model
    from fl.core.seeding import seed_torch

    seed_torch(cfg.seed, 0, -1, "init")
    return build_model(cfg, data.input_shape, data.num_classes)


def orchestrator(cfg, run_dir: Path):
    """The round loop of `cfg` (data, the method's server as a Fabric callback) without a run; rounds and
    clients are then driven by hand (`train_client`, `run_round`)."""
    from fl.core.loop import Orchestrator
    from fl.core.registry import METHODS
    from fl.data import build_data
    from fl.run.train import make_fabric

    data = build_data(cfg)
    server = METHODS[cfg.method.name].server_cls(cfg)
    return Orchestrator(cfg, make_fabric(cfg, [server], []), data, server, run_dir)


# ---- patches (monkeypatch) -------------------------------------------------------------------------
def record_uploads(monkeypatch, cls) -> list:
    """Every upload of `cls` as (round, cid, params on CPU, weight)."""
    seen = []
    original = cls.upload

    def upload(self):
        up = original(self)
        seen.append((self.round, self.cid, {k: v.detach().cpu().clone() for k, v in up.params.items()}, up.weight))
        return up

    monkeypatch.setattr(cls, "upload", upload)
    return seen


def ctrl_c_at_round(monkeypatch, rnd: int) -> Callable[[], None]:
    """Send this process SIGINT (Ctrl-C) when local training of round `rnd` starts; returns the undo."""
    from fl.core.loop import Orchestrator

    original = Orchestrator.train_client

    def train_client(self, r, cid):
        if r == rnd:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, r, cid)

    monkeypatch.setattr(Orchestrator, "train_client", train_client)
    return lambda: monkeypatch.setattr(Orchestrator, "train_client", original)


def interrupted_and_resumed(out: Path, monkeypatch, *extra: str, at_round: int = 2) -> tuple[Path, Path]:
    """The tiny run with `extra` twice: uninterrupted (outputs/full), and Ctrl-C'd when round `at_round` starts
    (exit 130, a checkpoint of the round before) then resumed to the end (outputs/cut); returns (full, cut) for
    the caller to compare."""
    from fl.run.train import main

    full = run_tiny(out, *extra, name="full")
    undo = ctrl_c_at_round(monkeypatch, at_round)
    assert main(tiny(out, "fabric.cpu_threads=1", "logger.run_name=cut", *extra)) == 130
    cut = out / "outputs" / "cut"
    assert load_ckpt(cut)["round"] == at_round - 1
    undo()
    assert main([f"resume={cut}"]) == 0
    return full, cut


# ---- what a GPU would wait for ---------------------------------------------------------------------
class TorchCalls(TorchFunctionMode):
    """Inside `with TorchCalls() as calls:`, the torch functions and tensor methods called (names, in order) in
    `calls.all`, and in `calls.host_reads` as (name, device type) those that would make the host wait for a GPU
    holding that tensor: reading a value (item, tolist, float(), int(), bool(), nonzero(), cpu(), numpy()) or building
    a tensor from Python data on a device (torch.tensor(..., device=...): a blocking copy). On the CPU they cost
    nothing, so only counting shows them; with the data on the `meta` device, reads of the data fail outright while
    the CPU's own (the seeded draws) go on, and the device tells them apart here."""
    READS = frozenset({"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "nonzero", "cpu", "numpy"})

    def __init__(self):
        super().__init__()
        self.all: list[str] = []
        self.host_reads: list[tuple[str, str]] = []
        self._devices: list[set[str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        self.all.append(name)
        flat = [a for arg in (*args, *kwargs.values()) for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
        self._devices.append({a.device.type for a in flat if torch.is_tensor(a)})
        if name in self.READS and args and torch.is_tensor(args[0]):
            self.host_reads.append((name, args[0].device.type))
        elif name == "tensor" and "device" in kwargs:
            self.host_reads.append((name, torch.device(kwargs["device"]).type))
        return func(*args, **kwargs)

    def on(self, device_type: str) -> list[str]:
        """The calls given a tensor on that device."""
        return [name for name, devices in zip(self.all, self._devices) if device_type in devices]

    def device_reads(self) -> list[tuple[str, str]]:
        """The host reads of tensors not on the CPU."""
        return [r for r in self.host_reads if r[1] != "cpu"]
