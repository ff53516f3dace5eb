"""bench/paper_scale.py: stand-in pools of the real sizes, its batch count and projection, and a config that cannot
run shown as a row with its reason."""
from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest
import torch

from bench.paper_scale import REAL, paper_configs, projection, rehearse, row, standin_pool
from fl.config import load_config


def data_cfg(name, image_size=None, **kw):
    """The typed data block of data.name=`name` (image_size null: the dataset's default) with `kw` set."""
    sets = {"image_size": image_size, **kw} if image_size is not None else kw
    return load_config([f"data.name={name}", *(f"data.{k}={v}" for k, v in sets.items())]).data


@pytest.mark.parametrize("name", ["cifar10", "cifar20", "fmnist", "office_caltech10", "pacs"])
def test_a_standin_pool_has_the_real_counts_shapes_and_domains(name, tmp_path):
    real = REAL[name]
    size = 16 if real.shape[1] > 64 else None  # the 224/256 px pools at a small size: counts are what is checked
    pool = standin_pool(name, data_cfg(name, size, cache_dir=str(tmp_path)))
    c, h, w = real.shape
    assert pool.train.x.shape == (sum(real.train.values()), c, size or h, size or w)
    assert pool.test.x.shape[0] == sum(real.test.values()) and pool.train.x.dtype == torch.uint8
    assert pool.num_classes == real.classes and int(pool.train.y.max()) == real.classes - 1
    assert torch.bincount(pool.train.y).max() - torch.bincount(pool.train.y).min() <= 1  # balanced
    if len(real.train) > 1:
        assert pool.domain_names == list(real.train)
        assert torch.bincount(pool.train.domain).tolist() == list(real.train.values())
        assert torch.bincount(pool.test.domain).tolist() == list(real.test.values())
    if name == "cifar20":  # fine labels nest in the coarse ones, as CIFAR-100's do
        assert all(torch.equal(fine // 5, s.y) for fine, s in zip(pool.fine_labels, (pool.train, pool.test)))


def test_iwildcam_cameras_are_disjoint_between_train_and_test(tmp_path):
    pool = standin_pool("iwildcam", data_cfg("iwildcam", 8, cache_dir=str(tmp_path)))
    train_cams, test_cams = set(pool.train.domain.tolist()), set(pool.test.domain.tolist())
    assert len(train_cams) == 243 and len(test_cams) == 48 and not train_cams & test_cams
    assert len(pool.domain_names) == 291


def test_projection_is_rounds_times_train_plus_evaluations_plus_checkpoints():
    stats = {"round_s": 10.0, "eval_s": 4.0, "batch_s": 5.0, "batches_run": 20, "batches_paper": 200,
             "paper": {"rounds": 100, "eval_every": 10, "checkpoint_every": 25},
             "checkpoints": [{"seconds": 2.0}]}
    assert projection(stats, local_steps=None) == 100 * 6.0 + 10 * 4.0 + 4 * 2.0
    # 20 batches in 5 s of the round's 6 s of training: 200 batches take 50 s, the other 1 s stays
    assert projection(stats, local_steps=2) == 100 * 51.0 + 10 * 4.0 + 4 * 2.0
    stats["paper"]["eval_every"] = 30  # rounds 30, 60, 90 and the last
    assert projection(stats, local_steps=None) == 100 * 6.0 + 4 * 4.0 + 4 * 2.0


def test_every_paper_config_is_rehearsed_and_no_dataset_is_left_real():
    from fl.config.load import load_config
    confs = paper_configs()
    assert "fedmosaic_domainnet" in confs and not any(c.endswith("_synthetic") for c in confs)
    assert {load_config([f"conf={c}"]).data.name for c in confs} <= set(REAL)


@pytest.mark.slow
def test_a_config_that_cannot_run_is_a_row_with_its_reason(tmp_path):
    r = rehearse("fedpals_cifar10_c2", ["data.public_size=60000"], tmp_path, None, timeout=300)
    assert r.exit == 2 and "data.public_size=60000" in r.why
    assert "**cannot run**: error: data.public_size=60000" in row(r, None)
    r = rehearse("fedpals_cifar10_c2", [], tmp_path, None, timeout=1)
    assert r.exit is None and r.why.startswith("timeout: no round within 1 s")
    assert "**cannot run**: timeout" in row(r, None)


@pytest.mark.slow
def test_one_round_counts_the_paper_batches_of_every_trained_client(tmp_path):
    """FedPALS' CIFAR-10 C2 protocol: 9 clients, 1 local epoch of batch 64; run 1 step each, project the epoch."""
    from fl.config.load import load_config
    from fl.core.registry import DATASETS
    from fl.data import build_data

    r = rehearse("fedpals_cifar10_c2", ["fabric.cpu_threads=1"], tmp_path, 1, timeout=600)
    assert r.exit == 0, r.why
    s = r.stats
    saved = DATASETS["cifar10"]
    try:
        DATASETS["cifar10"] = dataclasses.replace(saved, fn=lambda d: standin_pool("cifar10", d))
        data = build_data(load_config(["conf=fedpals_cifar10_c2"]))
    finally:
        DATASETS["cifar10"] = saved
    assert s["clients"] == data.num_clients == 9 and s["batches_run"] == 9
    assert s["batches_paper"] == sum(math.ceil(len(c.train) / 64) for c in data.clients)
    assert s["checkpoints"][0]["bytes"] > 0 and s["bytes_up"] > 0
    assert "| fedpals_cifar10_c2 | 9 |" in row(r, 1) and row(r, 1).endswith("| ok |")


def test_the_table_of_saved_results_keeps_the_last_row_per_config_in_config_order(tmp_path, capsys, monkeypatch):
    from bench.paper_scale import main

    def saved(conf, why):
        return json.dumps({"conf": conf, "exit": 2, "wall_s": 1.0, "why": why, "stats": {}, "rss_mb": None,
                           "ckpt_bytes": 0, "state_dir_bytes": 0, "local_steps": None, "overrides": []})

    results = tmp_path / "results.jsonl"
    results.write_text("\n".join([saved("fedpals_pacs", "old"), saved("ditto_cifar10_dir05", "a"),
                                  saved("fedpals_pacs", "new")]) + "\n")
    monkeypatch.setattr(sys, "argv", ["paper_scale.py", "--table", str(results)])
    assert main() == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| ditto_cifar10_dir05", "| fedpals_pacs"]
    assert rows[1].endswith("**cannot run**: new |")


def test_a_round_stopped_while_checkpointing_is_a_row_with_what_was_measured():
    from bench.paper_scale import Result
    stats = {"round_s": 30.0, "eval_s": 10.0, "batch_s": 15.0, "batches_run": 10, "batches_paper": 100,
             "clients": 4.0, "bytes_up": 2.0**20, "bytes_down": 2.0**20, "peak_rss_mb": 900.0,
             "paper": {"rounds": 10, "eval_every": 5, "checkpoint_every": 0}}
    text = row(Result("fedmosaic_office_fs", None, 100.0, "timeout: no round within 100 s (stopped during writing the "
                      "checkpoint)", stats, 900.0), local_steps=2)
    assert text.startswith("| fedmosaic_office_fs | 4 | 20.0 + 10.0 s (10 of 100 batches) |")
    assert "| ? / ? | ? |" in text and text.endswith("(stopped during writing the checkpoint) |")


@pytest.mark.parametrize("args, words", [
    (["--table", "{tmp}/missing.jsonl"], ["--table", "missing.jsonl: cannot read it (No such file or directory)"]),
    (["--table", "{tmp}/garbage.jsonl"], ["garbage.jsonl, line 2: not a row this script writes", "JSONDecodeError"]),
    (["--table", "{tmp}/list.jsonl"], ["list.jsonl, line 1: not a row"]),
    (["--local-steps", "-1", "conf=fedpals_pacs"], ["--local-steps -1: it must be >= 1"]),
    (["--local-steps", "0", "--all"], ["--local-steps 0: it must be >= 1"]),
])
def test_bad_arguments_and_tables_are_one_line_exit_2(tmp_path, capsys, monkeypatch, args, words):
    import bench.paper_scale as paper_scale

    (tmp_path / "garbage.jsonl").write_text('{"conf": "a", "exit": 0, "wall_s": 1.0, "local_steps": null, '
                                            '"overrides": []}\nnot json\n')
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")

    def never(*a, **k):
        raise AssertionError("a bad argument must not start a rehearsal")

    monkeypatch.setattr(paper_scale, "rehearse", never)
    monkeypatch.setattr(sys, "argv", ["paper_scale.py", *[a.format(tmp=tmp_path) for a in args]])
    assert paper_scale.main() == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ") and captured.out == ""
    for w in words:
        assert w in captured.err, (w, captured.err)
