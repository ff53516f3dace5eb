"""The W&B logger in fl.train runs: each round reaches W&B once when a killed run is resumed (online: rewound to
the checkpoint; offline: rounds W&B has are skipped, rounds it lost are logged again), per-client keys grouped
by metric, `round` as the x axis, the final checkpoint as an artifact, and no wandb warning on every run.

Most tests replace wandb.init with FakeWandb (W&B's side, recorded; no service process, no network); the slow
ones run the real wandb offline and read what its offline segments hold."""
import json
import signal
import struct
from pathlib import Path

import pytest
import torch

wandb = pytest.importorskip("wandb")

import fl.run.loggers as loggers  # noqa: E402
from fl.core.loop import Orchestrator  # noqa: E402
from fl.report.wandb_access import jsonl_key, load_wandb, local_last_round, transaction_log_history, wandb_key  # noqa: E402
from fl.run.train import main  # noqa: E402
from tests.helpers import ROOT, load_ckpt, read_metrics, run_cli, tiny  # noqa: E402

ROUNDS = 6  # checkpoints after rounds 1, 3, 5 (TINY's checkpoint_every=2)
CRASH = 3  # the process dies in round 3: W&B got rounds 0-2, the checkpoint holds round 1


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch, tmp_path):
    torch.set_num_threads(1)  # conftest gives the session its own count back
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    # wandb's own files (artifact staging, caches) stay in the test's folder
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def args(out: Path, name: str, mode: str, *extra: str) -> list[str]:
    return [a for a in tiny(out, f"trainer.rounds={ROUNDS}", "fabric.cpu_threads=1", f"logger.run_name={name}")
            if not a.startswith("logger.wandb.mode")] + [f"logger.wandb.mode={mode}", *extra]


class Killed(Exception):
    """Stands for the process dying (SIGKILL, a node lost) between two checkpoints."""


def crash_at_round(monkeypatch, rnd: int):
    """Raise Killed when local training of round `rnd` starts; returns the undo. Unlike Ctrl-C (helpers'
    ctrl_c_at_round), which checkpoints the last completed round, this leaves rounds after the checkpoint
    logged, which a resumed run computes again."""
    original = Orchestrator.train_client

    def train_client(self, r, cid):
        if r == rnd:
            raise Killed(f"round {r}")
        return original(self, r, cid)

    monkeypatch.setattr(Orchestrator, "train_client", train_client)
    return lambda: monkeypatch.setattr(Orchestrator, "train_client", original)


# ---- a fake W&B ------------------------------------------------------------------------------------
class FakeRun:
    """What fl.train does with a wandb Run: rows by step (a step's rows merge until one is committed; steps only
    go up, as in W&B), define_metric, summary, config, artifacts."""

    def __init__(self, run_id: str, kwargs: dict, history: list, starting_step: int):
        self.id, self.name, self.kwargs = run_id, kwargs.get("name"), kwargs
        self.history, self.starting_step = history, starting_step  # history: committed (step, row), shared online
        self._next, self._pending, self._pending_step = starting_step, {}, None
        self.committed: list[int] = []  # the steps this run committed
        self.metrics, self.artifacts, self.summary, self.finished = [], [], {}, False
        self.config = type("Config", (), {"update": lambda _self, d, allow_val_change=False: None})()

    def log(self, data: dict, step=None, commit=None):
        assert step is not None, "every W&B row has the round as its step"
        assert step >= self._next, f"step {step} after step {self._next - 1}: W&B would renumber or drop it"
        if self._pending_step is not None and step > self._pending_step:
            self._commit()
        self._pending_step = step
        self._pending.update(data)
        if commit:
            self._commit()

    def _commit(self):
        if self._pending_step is not None:
            self.history.append((self._pending_step, dict(self._pending)))
            self.committed.append(self._pending_step)
            self._next = self._pending_step + 1
        self._pending, self._pending_step = {}, None

    def define_metric(self, name, **kwargs):
        self.metrics.append((name, kwargs))

    def log_artifact(self, artifact, aliases=None):
        self.artifacts.append((artifact, aliases))

    def finish(self):
        self._commit()
        self.finished = True


class FakeWandb:
    """wandb.init, recorded. Online, the runs of an id share one history: resume="allow" continues after its
    last step, resume_from="<id>?_step=N" (rewind) keeps steps <= N. Offline, each init is a new segment."""

    def __init__(self, monkeypatch, rewind: bool = True, refuse_rewind: bool = False):
        self.inits: list[dict] = []
        self.runs: list[FakeRun] = []
        self.online: dict[str, list] = {}
        self.segments: dict[str, list[list]] = {}
        self.refuse_rewind = refuse_rewind
        if rewind:
            def init(resume_from=None, **kwargs):
                return self._init(kwargs, resume_from)
        else:
            def init(**kwargs):
                return self._init(kwargs, None)
        monkeypatch.setattr(wandb, "init", init)
        monkeypatch.setattr(loggers, "local_last_round", self.local_last_round)

    def _init(self, kwargs: dict, resume_from):
        self.inits.append({**kwargs, "resume_from": resume_from})
        run_id = kwargs["id"]
        if kwargs.get("mode") == "online":
            history = self.online.setdefault(run_id, [])
            if resume_from is not None:
                assert "resume" not in kwargs  # wandb refuses resume with resume_from
                if self.refuse_rewind:
                    raise RuntimeError("failed to rewind run: rewind is not enabled for this entity")
                rewound_id, step = resume_from.split("?_step=")
                assert rewound_id == run_id
                history[:] = [(s, r) for s, r in history if s <= int(step)]
                start = int(step) + 1
            else:
                start = history[-1][0] + 1 if history else 0
        else:
            history, start = [], 0
            self.segments.setdefault(run_id, []).append(history)
        run = FakeRun(run_id, kwargs, history, start)
        self.runs.append(run)
        return run

    def local_last_round(self, wandb_dir, run_id) -> int:
        return max((row["round"] for seg in self.segments.get(run_id, []) for _, row in seg), default=-1)

    def synced(self, run_id: str) -> list[tuple[int, dict]]:
        """What W&B ends up with: the online history, or the offline segments in order (as `wandb sync`)."""
        if run_id in self.online:
            return self.online[run_id]
        return [entry for seg in self.segments[run_id] for entry in seg]


def same_values(row: dict, jsonl_row: dict) -> bool:
    """A W&B row holds the metrics.jsonl row's scalars under their W&B keys (wall times aside)."""
    return all(row.get(wandb_key(k)) == pytest.approx(v, abs=1e-6) for k, v in jsonl_row.items()
               if k != "round" and not k.startswith("time/") and isinstance(v, (int, float)))


def assert_each_round_once(fake: FakeWandb, run_dir: Path) -> list[tuple[int, dict]]:
    run_id = (run_dir / "wandb_id").read_text().strip()
    rows = fake.synced(run_id)
    assert [step for step, _ in rows] == list(range(ROUNDS))
    jsonl = read_metrics(run_dir)
    for (step, row), jsonl_row in zip(rows, jsonl):
        assert row["round"] == step == jsonl_row["round"]
        assert same_values(row, jsonl_row), step
    return rows


def crash_then_resume(out: Path, monkeypatch, mode: str, fake: FakeWandb, between=None) -> Path:
    undo = crash_at_round(monkeypatch, CRASH)
    with pytest.raises(Killed):
        main(args(out, "cut", mode))
    undo()
    run_dir = out / "outputs" / "cut"
    assert load_ckpt(run_dir)["round"] == CRASH - 2
    if between is not None:
        between(run_dir)
    assert main([f"resume={run_dir}"]) == 0
    return run_dir


# ---- resume: each round once -----------------------------------------------------------------------
def test_offline_resume_skips_the_rounds_w_and_b_already_has(out, monkeypatch):
    fake = FakeWandb(monkeypatch)
    run_dir = crash_then_resume(out, monkeypatch, "offline", fake)
    run_id = (run_dir / "wandb_id").read_text().strip()
    first, second = fake.segments[run_id]
    assert [s for s, _ in first] == [0, 1, 2]  # round 2 came after the checkpoint (round 1)
    assert [s for s, _ in second] == [3, 4, 5]  # the resumed run computed round 2 again, W&B kept the first
    assert_each_round_once(fake, run_dir)
    assert all(i["resume_from"] is None for i in fake.inits)  # offline: nothing to rewind


def test_offline_resume_logs_again_the_rounds_a_killed_process_lost(out, monkeypatch):
    """A killed process loses the end of its offline segment (wandb writes it in 32 KiB blocks): rounds up to
    the checkpoint come again from metrics.jsonl, later ones from the resumed run."""
    fake = FakeWandb(monkeypatch)

    def lose_the_tail(run_dir):
        segment = fake.segments[(run_dir / "wandb_id").read_text().strip()][0]
        del segment[1:]  # only round 0 reached the file

    run_dir = crash_then_resume(out, monkeypatch, "offline", fake, between=lose_the_tail)
    _, second = fake.segments[(run_dir / "wandb_id").read_text().strip()]
    assert [s for s, _ in second] == [1, 2, 3, 4, 5]
    assert_each_round_once(fake, run_dir)


def test_online_resume_rewinds_w_and_b_to_the_checkpoint(out, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    fake = FakeWandb(monkeypatch)
    run_dir = crash_then_resume(out, monkeypatch, "online", fake)
    run_id = (run_dir / "wandb_id").read_text().strip()
    assert [i["resume_from"] for i in fake.inits] == [None, None, f"{run_id}?_step=1"]
    assert fake.runs[1].finished  # the plain resume that found rounds past the checkpoint
    assert_each_round_once(fake, run_dir)
    assert fake.runs[0].committed == [0, 1, 2] and fake.runs[2].committed == [2, 3, 4, 5]  # round 2 replaced


def test_online_resume_without_rewind_skips_the_rounds_w_and_b_has(out, monkeypatch, capsys):
    """A W&B server that refuses to rewind (the feature is in preview), or a wandb without resume_from: the
    rounds W&B has stay, the resumed run logs the ones after them; a refusal is one warning line."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    fake = FakeWandb(monkeypatch, refuse_rewind=True)
    run_dir = crash_then_resume(out, monkeypatch, "online", fake)
    assert_each_round_once(fake, run_dir)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "did not rewind" in line]
    assert len(warnings) == 1 and "rewind is not enabled" in warnings[0]

    fake = FakeWandb(monkeypatch, rewind=False)
    run_dir = crash_then_resume(out / "b", monkeypatch, "online", fake)
    assert_each_round_once(fake, run_dir)
    assert len(fake.inits) == 2


def test_w_and_b_disabled_before_a_resume_gets_the_checkpointed_rounds_from_metrics_jsonl(out, monkeypatch):
    fake = FakeWandb(monkeypatch)
    undo = crash_at_round(monkeypatch, CRASH)
    with pytest.raises(Killed):
        main(args(out, "late", "disabled"))
    undo()
    run_dir = out / "outputs" / "late"
    assert main([f"resume={run_dir}", "logger.wandb.mode=offline"]) == 0
    assert_each_round_once(fake, run_dir)


# ---- the dashboard ---------------------------------------------------------------------------------
def test_dashboard_keys_round_axis_and_no_anonymous_setting(out, monkeypatch):
    fake = FakeWandb(monkeypatch)
    assert main(args(out, "dash", "offline", "logger.partition_plots=true")) == 0
    run_dir = out / "outputs" / "dash"
    (run,) = fake.runs
    assert "anonymous" not in fake.inits[0]  # wandb >= 0.19 warns about it on every run, even as None
    assert ("round", {}) in run.metrics and ("*", {"step_metric": "round"}) in run.metrics
    assert not any(kw.get("step_metric") not in (None, "round") for _, kw in run.metrics)
    rows = assert_each_round_once(fake, run_dir)
    jsonl_keys = {k for r in read_metrics(run_dir) for k in r}
    client_keys = {k for k in jsonl_keys if k.startswith("client/")}
    assert client_keys and not any(k.startswith("client/") for _, row in rows for k in row)
    wandb_keys = {k for _, row in rows for k in row}
    assert {wandb_key(k) for k in client_keys} <= wandb_keys
    assert {k.split("/")[0] for k in wandb_keys if k.startswith("client_")} == \
        {"client_" + k.split("/", 2)[2] for k in client_keys}  # one section per per-client metric
    assert "data/partition" in rows[0][1] and "clients/metrics" in rows[0][1]  # all of round 0 in one row


def test_per_client_key_mapping_and_the_report_reads_it_back():
    assert wandb_key("client/3/acc") == "client_acc/3"
    assert wandb_key("client/12/beta_eval") == "client_beta_eval/12"
    for key in ("test/acc_mean_clients", "clients/metrics", "train/loss", "server/lambda", "best/test/acc"):
        assert wandb_key(key) == key
    for key in ("client/3/acc", "client/0/kl_PQ", "client/7/a/b", "test/acc_global_micro"):
        assert jsonl_key(wandb_key(key)) == key

    class Run:
        name, state, url = "r", "finished", "https://wandb.ai/e/p/r"
        config = {"trainer": {"last_k": 1}, "method": {"name": "fedavg"}}
        summary = {"headline": "test/acc_mean_clients"}

        def scan_history(self):
            yield {"_step": 0, "round": 0, "client_acc/0": 0.5, "client_acc/1": 0.7, "test/acc_mean_clients": 0.6}
            yield {"_step": 1, "round": 1, "client_acc/0": 0.6, "client_acc/1": 0.8, "test/acc_mean_clients": 0.7}

    class Api:
        def runs(self, path, filters=None):
            return [Run()]

    (run,) = load_wandb("e/p", api=Api())
    assert run.history == [{"round": 0, "client/0/acc": 0.5, "client/1/acc": 0.7, "test/acc_mean_clients": 0.6},
                           {"round": 1, "client/0/acc": 0.6, "client/1/acc": 0.8, "test/acc_mean_clients": 0.7}]


@pytest.mark.parametrize("mode, log_checkpoint, uploaded", [
    ("online", True, True), ("online", False, False), ("offline", True, False)])
def test_final_checkpoint_artifact_only_online_with_log_checkpoint(out, monkeypatch, mode, log_checkpoint,
                                                                   uploaded):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    fake = FakeWandb(monkeypatch)
    assert main(args(out, "art", mode, "trainer.rounds=2", f"logger.wandb.log_checkpoint={log_checkpoint}")) == 0
    (run,) = fake.runs
    assert len(run.artifacts) == int(uploaded)
    if uploaded:
        artifact, aliases = run.artifacts[0]
        assert artifact.type == "model" and "final" in aliases
        assert list(artifact.manifest.entries) == ["last.ckpt"]
    assert run.finished


# ---- the real wandb, offline -----------------------------------------------------------------------
@pytest.mark.slow  # subprocesses, and W&B's service process in each
def test_killed_offline_run_resumed_holds_each_round_once_in_its_segments(out):
    """SIGKILL in round 7 (checkpoint: round 3), then resume: the run directory's offline segments of the run id,
    synced in order, give rounds 0..8 once each, with `round` in every row and per-client keys grouped; neither
    process prints wandb's anonymous-setting warning."""
    env = {"WANDB_MODE": None, "WANDB_API_KEY": None, "WANDB_DIR": str(out / "wandb-home"), "WANDB_SILENT": None}
    base = [a for a in tiny(out, "trainer.rounds=9", "trainer.checkpoint_every=4", "fabric.cpu_threads=1",
                            "logger.run_name=killed") if not a.startswith("logger.wandb.mode")]
    res = run_cli(base + ["logger.wandb.mode=offline"], cwd=out, env={**env, "FL_TEST_KILL_ROUND": "7"},
                  script=(str(ROOT / "tests" / "killer.py"),))
    assert res.returncode == -signal.SIGKILL
    run_dir = out / "outputs" / "killed"
    assert load_ckpt(run_dir)["round"] == 3
    stderr = res.stderr
    res = run_cli([f"resume={run_dir}"], cwd=out, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    stderr += res.stderr
    assert "anonymous" not in stderr.lower(), stderr[-2000:]
    run_id = (run_dir / "wandb_id").read_text().strip()
    segments = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(segments) == 2
    rows = [row for seg in segments for row in transaction_log_history(seg)]
    assert [r["_step"] for r in rows] == [r["round"] for r in rows] == list(range(9))
    assert local_last_round(run_dir / "wandb", run_id) == 8
    jsonl = read_metrics(run_dir)
    for row, jsonl_row in zip(rows, jsonl):
        assert same_values(row, jsonl_row), row["round"]
    assert any(k.startswith("client_acc/") for k in rows[0]) and not any(k.startswith("client/") for k in rows[0])


def test_transaction_log_reader_stops_at_a_cut(tmp_path):
    """A file cut inside a record (a kill in the middle of a block write) yields the records before the cut."""
    from wandb.proto import wandb_internal_pb2

    def record(step: int) -> bytes:
        r = wandb_internal_pb2.Record()
        for key, value in (("_step", step), ("round", step), ("x", "y" * 20000)):
            item = r.history.item.add()
            item.key, item.value_json = key, json.dumps(value)
        return r.SerializeToString()

    def log_file(records: list[bytes]) -> bytes:
        out, pos = bytearray(b":W&B\xe1\xbe\x00"), 7
        for data in records:
            first = True
            while True:
                left = 32768 - pos % 32768
                if left < 7:
                    out += b"\0" * left
                    pos += left
                    continue
                chunk, data = data[:left - 7], data[left - 7:]
                kind = (1 if not data else 2) if first else (4 if not data else 3)
                out += struct.pack("<IHB", 0, len(chunk), kind) + chunk
                pos += 7 + len(chunk)
                first = False
                if not data:
                    break
        return bytes(out)

    whole = log_file([record(i) for i in range(5)])  # 20 kB records: they straddle blocks
    path = tmp_path / "run-x.wandb"
    path.write_bytes(whole)
    assert [r["round"] for r in transaction_log_history(path)] == [0, 1, 2, 3, 4]
    path.write_bytes(whole[:32768 * 2])  # two blocks reached the disk
    assert [r["round"] for r in transaction_log_history(path)] == [0, 1, 2]


def test_wandb_failing_to_start_costs_the_run_nothing(out, monkeypatch, capsys):
    import wandb

    real_init = wandb.init

    def init(**kwargs):  # e.g. "run ID ... is in use" from a service another process left behind
        if kwargs.get("mode") != "disabled":
            raise RuntimeError("run ID abc is in use")
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", init)
    assert main(args(out, "nowandb", "offline")) == 0
    err = capsys.readouterr().err
    assert "W&B could not start run" in err and "run ID abc is in use" in err and "Traceback" not in err
    assert [r["round"] for r in read_metrics(out / "outputs" / "nowandb")] == list(range(ROUNDS))


@pytest.mark.parametrize("mode", ["offline", "online", "disabled"])
def test_an_offline_run_ends_with_the_wandb_sync_command(out, monkeypatch, capsys, mode):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    FakeWandb(monkeypatch)
    assert main(args(out, "sync", mode, "trainer.rounds=1")) == 0
    hint = f"upload the run with: wandb sync {out / 'outputs' / 'sync' / 'wandb'}/offline-run-*"
    assert (hint in capsys.readouterr().out) == (mode == "offline")
