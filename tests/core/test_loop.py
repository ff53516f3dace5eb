"""The round loop (fl/core/loop.py) in end-to-end runs of the FedAvg family: hand computation, equalities
between methods and code paths, faults, Ctrl-C, kill-and-resume, 1-vs-2 processes, per-client optimizer
state, and W&B's offline default."""
import json
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tests.keep_momentum  # noqa: F401  (registers method test_keep_momentum)
import tests.nan_at_round  # noqa: F401  (registers method test_nan_at_round_2)
from fl.config import MethodConfig, load_config
from fl.core import ClientModule, Server, batch_indices, build_model
from fl.core.loop import sample_clients
from fl.core.registry import register_method
from fl.core.seeding import generator, seed_torch
from fl.data import build_data
from fl.run.train import main
from tests.helpers import (
    ROOT,
    assert_same_rows,
    global_params,
    interrupted_and_resumed,
    load_ckpt,
    read_metrics,
    run_cli,
    run_tiny,
    tiny,
    without_timing,
)
from tests.process_pairs import on_one_and_two_processes


def run(out: Path, *extra: str, name: str) -> Path:
    return run_tiny(out, *extra, name=name, threads=None)  # torch's default threads, like a user's run


def test_fedavg_equals_a_hand_written_loop(out):
    extra = ("trainer.rounds=2", "trainer.participation=0.5", "optim.momentum=0.9", "optim.weight_decay=0.001")
    got = global_params(run(out, *extra, name="fw"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    seed_torch(cfg.seed, 0, -1, "init")
    model = build_model(cfg, data.input_shape, data.num_classes)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for rnd in range(2):
        sums, total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}, 0
        for cid in sample_clients(cfg.seed, rnd, data.num_clients, cfg.trainer.participation):
            model.load_state_dict(state)
            opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=0.9, weight_decay=0.001)
            train = data.clients[cid].train
            seed_torch(cfg.seed, rnd, cid, "train")
            for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, rnd, cid, "train"),
                                        epochs=1):
                if idx is not None:
                    opt.zero_grad()
                    F.cross_entropy(model(data.prepare(train.x[idx])), train.y[idx]).backward()
                    opt.step()
            for k, v in model.state_dict().items():
                sums[k] += len(train) * v.double()  # FedAvg: weights n_i / N
            total += len(train)
        state = {k: (s / total).float() for k, s in sums.items()}
    assert got.keys() == {f"model.{k}" for k in state}
    for k, v in state.items():
        torch.testing.assert_close(got[f"model.{k}"], v, rtol=0, atol=1e-6)
    model_bytes = sum(v.numel() * v.element_size() for v in state.values())  # each way, per client
    for rnd, row in enumerate(read_metrics(out / "outputs" / "fw")):
        sent = len(sample_clients(cfg.seed, rnd, data.num_clients, cfg.trainer.participation)) * model_bytes
        assert row["comm/bytes_up"] == row["comm/bytes_down"] == sent


def test_fedprox_with_mu_zero_equals_fedavg(out):
    a = run(out, "method.name=fedavg", name="avg")
    b = run(out, "method.name=fedprox", "method.mu=0", name="prox")
    strip = lambda rows: [{k: v for k, v in r.items() if k.startswith("test/")} for r in rows]  # noqa: E731
    assert strip(read_metrics(a)) == strip(read_metrics(b))
    ga, gb = global_params(a), global_params(b)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


def test_fedavg_ft_without_finetuning_equals_fedavg_and_finetuning_changes_eval(out):
    a = read_metrics(run(out, "method.name=fedavg", name="avg"))
    b = read_metrics(run(out, "method.name=fedavg_ft", "method.finetune_epochs=0", name="ft0"))
    c = read_metrics(run(out, "method.name=fedavg_ft", "method.finetune_epochs=2", name="ft2"))
    assert [r["test/acc_mean_clients"] for r in a] == [r["test/acc_mean_clients"] for r in b]
    assert [r["test/acc_global_micro"] for r in a] == [r["test/acc_global_micro"] for r in c]  # global model untouched
    assert [r["test/acc_mean_clients"] for r in a] != [r["test/acc_mean_clients"] for r in c]


def test_every_method_trains_the_same_sampled_clients(out):
    rows = {m: read_metrics(run(out, f"method.name={m}", name=m)) for m in ("fedavg", "fedprox", "local")}
    clients = {m: [sorted(k for k in r if k.endswith("/loss") and k.startswith("client/")) for r in rs]
               for m, rs in rows.items()}
    assert clients["fedavg"] == clients["fedprox"] == clients["local"]


def test_local_never_communicates_and_centralized_trains_on_pooled_data(out):
    loc = run(out, "method.name=local", name="local")
    ckpt = load_ckpt(loc)
    assert ckpt["server"]["global_params"] == {}  # nothing is shared
    states = ckpt["clients"]
    a, b = (states[c]["private"]["model.head.weight"] for c in list(states)[:2])
    assert not torch.equal(a, b)  # each client has its own model
    assert "test/acc_global_micro" not in read_metrics(loc)[-1]
    assert all(r["comm/bytes_up"] == r["comm/bytes_down"] == 0 for r in read_metrics(loc))
    cen = read_metrics(run(out, "method.name=centralized", name="cen"))
    assert all(r["train/clients"] == 1.0 for r in cen) and "test/acc_global_micro" in cen[-1]


# ---- self.log in training_step -------------------------------------------------------------------
@dataclass
class LoggingConfig(MethodConfig):
    name: str = "test_self_log"


class LoggingClient(ClientModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("ce", loss)  # what every Lightning user writes
        self.log_dict({"twice": 2 * loss})
        return loss


register_method("test_self_log", LoggingConfig, LoggingClient, Server)


def test_self_log_in_training_step_becomes_the_clients_logged_scalars(out):
    rows = read_metrics(run(out, "method.name=test_self_log", name="selflog"))
    assert all(isinstance(r["round"], int) for r in rows)  # no {"round": null} rows
    for r in rows:
        assert r["train/ce"] == pytest.approx(r["train/loss"], rel=1e-6)
        clients = [k.split("/")[1] for k in r if k.startswith("client/") and k.endswith("/ce")]
        assert clients and all(r[f"client/{c}/twice"] == pytest.approx(2 * r[f"client/{c}/ce"]) for c in clients)
    with pytest.raises(RuntimeError, match="inside training_step only"):
        LoggingClient(load_config(tiny(out)), build_data(load_config(tiny(out)))).log("x", 1.0)


# ---- faults --------------------------------------------------------------------------------------


def test_nan_loss_stops_the_run_naming_method_client_round_keeps_the_checkpoint_and_marks_it_ended(out, capsys):
    """Like a divergence under trainer.on_divergence=stop: summary.json over the rounds before, marked, so fl.sweep
    and fl.reproduce reuse the run (the same seed would stop there again) and fl.report shows it with a dagger."""
    from fl.report.cli import main as report
    from fl.sweep.runner import Job, run_jobs

    code = main(tiny(out, "method.name=test_nan_at_round_2", "trainer.rounds=4", "trainer.checkpoint_every=1",
                     "logger.run_name=nan"))
    assert code == 1
    printed = capsys.readouterr()
    err = printed.err.strip().splitlines()[-1]
    assert "method 'test_nan_at_round_2'" in err and "round 2" in err and "client " in err
    run_dir = out / "outputs" / "nan"
    ckpt = load_ckpt(run_dir)
    assert ckpt["round"] == 1 and all(torch.isfinite(v).all() for v in ckpt["server"]["global_params"].values())
    summary = json.loads((run_dir / "summary.json").read_text())
    marked = summary["diverged"]
    assert marked == {"round": 2, "client": marked["client"], "method": "test_nan_at_round_2",
                      "reason": "non-finite loss or parameters"} and f"client {marked['client']}," in err
    assert set(summary["final"]) and all(r["round"] < 2 for r in read_metrics(run_dir))
    assert printed.out.strip().splitlines()[-1] == (f"DIVERGED at client {marked['client']}, round 2: non-finite "
                                                    "loss or parameters")  # the printed summary's last line
    job = Job("p000", {}, 0, run_dir)
    assert job.finished and job.diverged
    assert run_jobs(None, [job], [], 1) == [] and "reusing 1 of 1 runs" in capsys.readouterr().out  # not retrained
    assert report([str(run_dir)]) == 0 and "†" in capsys.readouterr().out


def test_a_nan_before_any_checkpoint_does_not_point_at_a_missing_one(out, capsys):
    assert main(tiny(out, "method.name=test_nan_at_round_2", "trainer.checkpoint_every=0",
                     "logger.run_name=nan")) == 1
    err = capsys.readouterr().err
    assert "no checkpoint was written yet" in err and "last good checkpoint" not in err


def test_ctrl_c_saves_a_checkpoint_and_resume_finishes_the_same_run(out, monkeypatch):
    full, cut = interrupted_and_resumed(out, monkeypatch, "trainer.rounds=5", "trainer.checkpoint_every=10", at_round=3)
    assert read_metrics(cut) == read_metrics(full)


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(out):
    args = tiny(out, "trainer.rounds=6", "trainer.checkpoint_every=2", "fabric.cpu_threads=1")  # as run() pins
    full = run(out, *args[len(tiny(out)):], name="full")
    res = run_cli(args + ["logger.run_name=killed"], cwd=out, env={"FL_TEST_KILL_ROUND": "4"},
                  script=(str(ROOT / "tests" / "killer.py"),))
    assert res.returncode == -signal.SIGKILL
    killed = out / "outputs" / "killed"
    assert load_ckpt(killed)["round"] == 3
    assert main([f"resume={killed}"]) == 0  # in this process
    assert read_metrics(killed) == read_metrics(full)
    sa, sb = (without_timing(json.loads((d / "summary.json").read_text())) for d in (full, killed))
    own = ("run_dir",)  # where each run wrote it (without_timing leaves out when)
    assert {k: v for k, v in sa.items() if k not in own} == {k: v for k, v in sb.items() if k not in own}
    ga, gb = global_params(full), global_params(killed)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


# ---- processes -----------------------------------------------------------------------------------
# participation 0.1 of 7 clients: one client per round, so one process trains nothing; BatchNorm adds integer
# counters, which are reduced by maximum rather than averaged
@on_one_and_two_processes("loop_fedavg", "method.name=fedavg", "trainer.rounds=4", "data.num_clients=7",
                          "trainer.participation=0.6", "model.norm=none")
@on_one_and_two_processes("loop_fedper_one_client_a_round", "method.name=fedper", "trainer.rounds=4",
                          "data.num_clients=7", "trainer.participation=0.1", "model.norm=batch")
@on_one_and_two_processes("loop_local", "method.name=local", "trainer.rounds=4", "data.num_clients=7",
                          "trainer.participation=0.6", "model.norm=none")
def loop_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-5)
    ca, cb = load_ckpt(one), load_ckpt(two)
    for k, v in ca["server"]["global_params"].items():
        torch.testing.assert_close(cb["server"]["global_params"][k], v, rtol=0, atol=1e-5)
    assert ca["clients"].keys() == cb["clients"].keys()


@pytest.mark.slow
def test_wandb_defaults_to_offline_without_an_api_key_and_never_prompts(out, tmp_path):
    env = {"WANDB_API_KEY": None, "WANDB_MODE": None, "HOME": str(tmp_path), "NETRC": str(tmp_path / "none")}
    args = [a for a in tiny(out, "logger.run_name=wb") if not a.startswith("logger.wandb.mode")]
    res = run_cli(args, cwd=out, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = list((out / "outputs" / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (out / "outputs" / "wb" / "summary.json").is_file()


def test_optimizer_state_is_kept_per_client_and_local_steps_count_steps(out):
    extra = ("optim.momentum=0.9", "trainer.local_steps=3", "trainer.participation=1.0")
    kept = run(out, "method.name=test_keep_momentum", *extra, name="kept")
    fresh = run(out, "method.name=fedavg", *extra, name="fresh")
    rows = read_metrics(kept)
    assert all(r[f"client/{c}/step"] == 1.0 for r in rows for c in range(6))  # steps 0, 1, 2 each round
    states = load_ckpt(kept)["clients"]
    assert all(s["optimizer"]["state"] for s in states.values())  # momentum buffers stored per client
    assert "optimizer" not in load_ckpt(fresh)["clients"][0]
    # round 0 is identical (no stored state yet); from round 1 on the restored momentum changes training
    a, b = read_metrics(kept), read_metrics(fresh)
    assert a[0]["train/loss"] == b[0]["train/loss"] and a[1]["train/loss"] != b[1]["train/loss"]


def test_kept_optimizer_state_follows_the_round_schedule(out):
    """A restored optimizer state carries last round's lr; the round's scheduled lr must replace it."""
    from fl.core import round_lr

    extra = ("optim.round_schedule=cosine", "trainer.local_steps=2", "trainer.participation=1.0")
    kept = run(out, "method.name=test_keep_momentum", "optim.momentum=0.9", *extra, name="cos")
    cfg = load_config(tiny(out, *extra))
    states = load_ckpt(kept)["clients"]
    last = round_lr(cfg, cfg.trainer.rounds - 1)
    assert last < cfg.optim.lr
    assert all(g["lr"] == last for s in states.values() for g in s["optimizer"]["param_groups"])


def test_a_single_client_federation_runs_and_equals_its_own_accuracy(out):
    """m = 1 (torchmetrics squeezes 1-element results; evaluation must still index clients)."""
    row = read_metrics(run(out, "data.num_clients=1", "trainer.rounds=1", "method.name=fedper", name="one"))[-1]
    assert row["client/0/acc"] == row["test/acc_mean_clients"] == row["test/acc_micro"]
