"""bench/reproduce_budget.py --publish: a paper's reproduce.md and its record land in bench/reproduce/ as the
command wrote them, the Markdown under one line naming the command and the record's commit."""
from __future__ import annotations

import argparse
import json

import pytest

import bench.reproduce_budget as budget


def test_publish_copies_the_output_and_its_record_naming_the_command_and_commit(tmp_path, monkeypatch):
    out = tmp_path / "o" / "tiny" / "twin"
    out.mkdir(parents=True)
    (out / "reproduce.md").write_text("# A tiny paper\n\nTwin: ...\n")
    record = {"paper": "tiny", "provenance": {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": True},
              "runs": [{"run": "s/p000-s0", "final": {"acc": 0.1}}]}
    (out / "reproduce.json").write_text(json.dumps(record))
    monkeypatch.setattr(budget, "RECORDS", tmp_path / "bench")
    budget.publish("tiny", argparse.Namespace(out=tmp_path / "o", seeds=3, overrides=["trainer.rounds=2"]))
    md = (tmp_path / "bench" / "tiny.md").read_text()
    first = md.splitlines()[0]
    assert first.startswith("<!-- What `python -m fl.reproduce tiny --scale twin --seeds 3 trainer.rounds=2` wrote")
    assert "at commit 0123456789ab with uncommitted changes" in first and "tiny.json" in first
    assert md.endswith("# A tiny paper\n\nTwin: ...\n")
    assert json.loads((tmp_path / "bench" / "tiny.json").read_text()) == record


def test_a_command_stopped_after_its_first_paper_keeps_that_papers_record_and_output(tmp_path, monkeypatch):
    """Each paper is recorded and published when it ends, so stopping a 2-hour command half-way loses none of it."""
    def fake_time_paper(paper, args):
        if paper != "fedpals":
            raise KeyboardInterrupt
        out = args.out / paper / "twin"
        out.mkdir(parents=True)
        (out / "reproduce.md").write_text("# FedPALS\n")
        (out / "reproduce.json").write_text(json.dumps({"paper": paper, "provenance": {"commit": "a" * 40}}))
        return {"paper": paper, "exit": 0, "wall_s": 60.0, "load_mean": 2.0, "load_max": 2.1,
                "runs": {"s/p000-x-s0": {"wall_s": 30.0, "cpu_s": 29.0}}}

    monkeypatch.setattr(budget, "time_paper", fake_time_paper)
    monkeypatch.setattr(budget, "RECORDS", tmp_path / "bench")
    monkeypatch.setattr(budget, "TWIN_SECONDS", tmp_path / "twin_seconds.json")
    monkeypatch.setattr("sys.argv", ["reproduce_budget.py", "fedpals", "feddrm", "--record", "--publish",
                                     "--out", str(tmp_path / "o")])
    with pytest.raises(KeyboardInterrupt):  # stopped during the second paper
        budget.main()
    assert (tmp_path / "bench" / "fedpals.md").read_text().endswith("# FedPALS\n")
    assert not (tmp_path / "bench" / "feddrm.md").exists()
    assert json.loads((tmp_path / "twin_seconds.json").read_text())["seconds"] == {"s/p000-x": 29.0}
