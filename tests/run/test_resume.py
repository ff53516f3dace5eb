"""Resume when things went wrong: no checkpoint yet, damaged or foreign checkpoints, a config.yaml edited since
the checkpoint, and the original command repeated with resume= appended."""
from __future__ import annotations

import shutil

import pytest
import torch
from omegaconf import OmegaConf

from fl.run.train import main
from tests.helpers import load_ckpt, read_metrics, run_tiny, tiny


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def ckpt_dir(run_dir):
    return run_dir / "checkpoints"


def test_a_run_without_a_checkpoint_starts_afresh_in_its_directory(out, capsys):
    full = run_tiny(out, "trainer.checkpoint_every=0", name="full")
    cut = out / "outputs" / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(ckpt_dir(cut))
    (cut / "summary.json").unlink()  # a run killed in round 1 has none
    (cut / "metrics.jsonl").write_text('{"round": 0}\n')  # what a run killed in round 1 leaves
    ckpt_dir(cut).mkdir()
    (ckpt_dir(cut) / "last.ckpt.tmp").write_bytes(b"\x80\x02half")  # a kill inside the first checkpoint write
    assert main([f"resume={cut}"]) == 0
    assert "no checkpoint yet" in capsys.readouterr().err
    assert read_metrics(cut) == read_metrics(full)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "foreign", "another_model"])
def test_a_damaged_last_checkpoint_falls_back_to_the_previous_one(out, capsys, damage):
    # rounds 0..3, a checkpoint every round: last.ckpt is round 3, previous.ckpt round 2
    run_dir = run_tiny(out, "trainer.rounds=4", "trainer.checkpoint_every=1", name="r")
    full = read_metrics(run_dir)
    last, previous = ckpt_dir(run_dir) / "last.ckpt", ckpt_dir(run_dir) / "previous.ckpt"
    assert load_ckpt(run_dir)["round"] == 3 and torch.load(previous, weights_only=True)["round"] == 2
    if damage == "empty":
        last.write_bytes(b"")
    elif damage == "truncated":
        last.write_bytes(last.read_bytes()[:200])
    elif damage == "garbage":
        last.write_bytes(b"not a checkpoint at all" * 10)
    elif damage == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, last)
    else:  # readable, complete, but its tensors belong to another model
        state = torch.load(last, weights_only=True)
        state["server"]["global_params"] = {k: torch.zeros(1) for k in state["server"]["global_params"]}
        torch.save(state, last)
    if damage == "another_model":  # that is found only when loading it: one line, exit 2
        assert main([f"resume={run_dir}", "trainer.rounds=5"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "last.ckpt does not fit this run's model" in err
        return
    assert main([f"resume={run_dir}", "trainer.rounds=5"]) == 0
    err = capsys.readouterr().err
    assert "last.ckpt" in err and "using previous.ckpt instead" in err and "continuing at round 3 of 0..4" in err
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    assert read_metrics(run_dir)[:3] == full[:3]  # continued from round 2's checkpoint


def test_every_checkpoint_unreadable_is_one_line_naming_both(out, capsys):
    run_dir = run_tiny(out, "trainer.checkpoint_every=1", name="r")
    for name in ("last.ckpt", "previous.ckpt"):
        (ckpt_dir(run_dir) / name).write_bytes(b"")
    assert main([f"resume={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "last.ckpt is empty" in err and "previous.ckpt is empty" in err


def test_an_edited_config_yaml_is_refused_naming_the_key(out, capsys):
    run_dir = run_tiny(out, "trainer.rounds=2", name="r")
    path = run_dir / "config.yaml"
    cfg = OmegaConf.load(path)
    cfg.optim.lr = 0.5
    path.write_text(OmegaConf.to_yaml(cfg))
    assert main([f"resume={run_dir}", "trainer.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.lr=0.5" in err and "last.ckpt" in err
    assert len(read_metrics(run_dir)) == 2  # nothing ran


def test_the_same_command_with_resume_appended_is_accepted_and_a_change_is_named(out, capsys):
    args = tiny(out, "fabric.cpu_threads=1", "seed=3", "logger.run_name=r", "trainer.rounds=2")
    assert main(args) == 0
    run_dir = out / "outputs" / "r"
    assert main(["conf=quickstart", *args, "trainer.rounds=3", f"resume={run_dir}"]) == 0
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1, 2]
    capsys.readouterr()
    assert main([*args, "seed=4", f"resume={run_dir}"]) == 2
    assert "seed cannot change when resuming: the run has 3, this command 4" in capsys.readouterr().err


def test_resume_in_a_config_file_is_refused(tmp_path):
    from fl.config import ConfigError, load_config

    conf = tmp_path / "c.yaml"
    conf.write_text(f"include: [quickstart]\nresume: {tmp_path / 'elsewhere'}\n")
    with pytest.raises(ConfigError, match="resume cannot be set in a config file"):
        load_config([f"conf={conf}"])
    assert not (tmp_path / "elsewhere").exists()


# ---- resumes that would have rewritten or retrained a run (issue 26, items 5 and 9) ---------------------------------
def unchanged(run_dir):
    """What a refused resume must leave as it was: the run's files, byte for byte."""
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


def test_lowering_trainer_rounds_on_resume_is_refused_in_one_line(out, capsys):
    run_dir = run_tiny(out, "trainer.rounds=2", name="r")
    before = unchanged(run_dir)
    capsys.readouterr()
    assert main([f"resume={run_dir}", "trainer.rounds=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trainer.rounds=1 is below the run's 2" in err
    assert "rounds may only grow or stay" in err and "continuing at" not in err
    assert unchanged(run_dir) == before


def test_a_finished_run_whose_checkpoints_were_deleted_is_not_retrained_from_round_0(out, capsys):
    run_dir = run_tiny(out, "trainer.rounds=2", name="r")
    shutil.rmtree(ckpt_dir(run_dir))
    before = unchanged(run_dir)
    capsys.readouterr()
    assert main([f"resume={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has ended (it has summary.json)" in err and "no checkpoint" in err
    assert "stopped before its first" not in err and unchanged(run_dir) == before


@pytest.mark.parametrize("text", ["seed: [0\ntrainer: {", "\x00\xff\xfe garbage", "- a list\n- of items\n", ""])
def test_a_damaged_run_config_is_one_line(out, capsys, text):
    run_dir = run_tiny(out, "trainer.rounds=2", name="r")
    (run_dir / "config.yaml").write_bytes(text.encode("latin-1"))
    capsys.readouterr()
    assert main([f"resume={run_dir}", "trainer.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: resume: ") and "config.yaml" in err
    assert len(read_metrics(run_dir)) == 2


def test_a_run_config_from_before_a_key_moved_names_the_new_key(out, capsys):
    run_dir = run_tiny(out, "trainer.rounds=2", name="r")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    cfg.data.dirichlet_alpha = cfg.data.partition.pop("alpha")  # how runs before the data-key move wrote it
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    capsys.readouterr()
    assert main([f"resume={run_dir}", "trainer.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.dirichlet_alpha moved to data.partition.alpha" in err
    assert "unknown key" not in err and "start a new run" in err


@pytest.mark.parametrize("name", ["last.ckpt", "previous.ckpt", "last.ckpt.tmp"])
def test_a_checkpoint_path_that_is_a_directory_is_refused_before_training(out, capsys, name):
    run_dir = run_tiny(out, "trainer.rounds=2", "trainer.checkpoint_every=1", name="r")
    path = ckpt_dir(run_dir) / name
    if path.exists():
        path.unlink()
    path.mkdir()
    capsys.readouterr()
    assert main([f"resume={run_dir}", "trainer.rounds=4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is not a checkpoint file" in err
    assert len(read_metrics(run_dir)) == 2  # refused before a round was trained


def test_a_run_made_before_a_key_existed_is_refused_naming_the_key(out, capsys):
    # an older fl wrote neither the key in config.yaml nor in the checkpoint; its default now may not be what ran then
    run_dir = run_tiny(out, "trainer.rounds=2", name="old")
    path = run_dir / "config.yaml"
    cfg = OmegaConf.load(path)
    del cfg.server.aggregator["name"]
    path.write_text(OmegaConf.to_yaml(cfg))
    ckpt = ckpt_dir(run_dir) / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)
    del state["config"]["server"]["aggregator"]["name"]
    torch.save(state, ckpt)
    assert main([f"resume={run_dir}", "trainer.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "server.aggregator.name did not exist when the run was made" in err
    assert "='mean'" in err and len(read_metrics(run_dir)) == 2  # nothing ran


def test_a_changed_choice_is_named_before_the_settings_that_came_with_it(out, capsys):
    run_dir = run_tiny(out, "trainer.rounds=1", name="mean")
    assert main([f"resume={run_dir}", "server.aggregator.name=krum", "server.aggregator.f=0",
                 "trainer.rounds=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: server.aggregator.name cannot change when resuming: the run has 'mean', this "
                          "command 'krum'"), err
